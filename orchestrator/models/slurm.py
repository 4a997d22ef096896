"""An inventory's `slurm:` section: a Slurm cluster reached through its login node.

```yaml
defaults: {user: alice, identity_file: ~/.ssh/id_ed25519}
slurm:
  login: login1.hpc.example.edu   # address or ~/.ssh/config alias of a login node
  partition: gpu                  # optional; Slurm's default partition otherwise
  gpus_per_node: 8                # optional; --gres=gpu:N, and nproc_per_node's default
  python: /shared/venvs/torch/bin/python   # interpreter on the compute nodes
  sbatch: [--account=proj42, --time=04:00:00]   # optional, passed to sbatch verbatim
```

orch connects to the login node only (user, port, key and ProxyJump from `defaults:`
and ~/.ssh/config, as for hosts); the compute nodes see the pushed code through the
shared home.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.models.positions import PosDict
from orchestrator.models.schema import Where, check_keys, get_int, get_str, get_str_list

SLURM_KEYS = {
    "login": "address or ~/.ssh/config alias of a login node",
    "partition": "the partition jobs go to (default: Slurm's default partition)",
    "gpus_per_node": "GPUs per node (a job's gpus_per_node wins): --gres=gpu:N, the default nproc_per_node",
    "python": "interpreter with torch on the compute nodes (and the login node)",
    "workdir": "where code, logs and job state live on the shared home",
    "sbatch": "extra sbatch options, passed verbatim",
}
LOGIN_NAME = "login"  # the login node's name in messages and the job records


@dataclass(frozen=True)
class SlurmSection:
    """What an inventory says of its Slurm cluster."""

    login: str
    partition: str | None = None
    gpus_per_node: int | None = None
    sbatch: tuple[str, ...] = ()

    @property
    def backend(self) -> str:
        return "slurm"

    def contacts(self, where: Where) -> list[Where]:
        """The login node alone: orch never connects to a compute node itself."""
        return [login_where(where)]


def load_slurm_section(where: Where, has_hosts: bool = False) -> SlurmSection:
    """The `slurm:` section of an inventory (`where` is the section itself).

    Args:
        has_hosts: the inventory has a `hosts:` list too, which it may not.

    Raises:
        SpecError: an unknown key, a missing login, a value of the wrong type, an
            sbatch option that orch sets itself, or `hosts:` beside it.
    """
    if has_hosts:
        raise where.error(
            None,
            "an inventory has either hosts: (SSH machines) or slurm: (a Slurm cluster), not both",
            "write one inventory file per cluster, and pick one with -i",
        )
    check_keys(where, SLURM_KEYS, required=("login",))
    login = get_str(where, "login")
    if not login:
        raise where.error("login", "empty login node", "give the login node's address or alias")
    sbatch = get_str_list(where, "sbatch")
    for option in sbatch:
        name = option.split("=", 1)[0]
        if name in ORCH_SBATCH_OPTIONS:
            raise where.error(
                "sbatch",
                f"{name} is set by orch from the job and inventory",
                ORCH_SBATCH_OPTIONS[name],
            )
    return SlurmSection(
        login=login,
        partition=get_str(where, "partition") or None,
        gpus_per_node=get_int(where, "gpus_per_node", minimum=0),
        sbatch=sbatch,
    )


def login_where(where: Where) -> Where:
    """The section as a host entry for the inventory's host loader: the login node,
    named and reached by `login`, with the section's `python` and `workdir` (positions
    kept for errors)."""
    entry = PosDict()
    entry.start = where.mapping.start
    for key in ("python", "workdir"):
        if key in where.mapping:
            entry[key] = where.mapping[key]
            entry.positions[key] = where.mapping.positions[key]
            entry.source[key] = where.mapping.source.get(key)
    entry["name"] = entry["address"] = where.mapping["login"]
    entry.positions["name"] = entry.positions["address"] = where.mapping.positions["login"]
    return where.child(entry, where.prefix)


# Options orch's batch script sets; given again in `sbatch:` they would fight it.
ORCH_SBATCH_OPTIONS = {
    "--nodes": "set nodes: in the job file",
    "-N": "set nodes: in the job file",
    "--partition": "set slurm.partition in the inventory",
    "-p": "set slurm.partition in the inventory",
    "--output": "orch keeps each rank's output itself: orch logs JOB_ID",
    "-o": "orch keeps each rank's output itself: orch logs JOB_ID",
    "--job-name": "set name: in the job file (or orch submit --name)",
    "-J": "set name: in the job file (or orch submit --name)",
    "--ntasks-per-node": "orch starts one torchrun per node; set nproc_per_node in the job",
    "--gpus-per-node": "set gpus_per_node: in the job file, or slurm.gpus_per_node in the inventory",
}
