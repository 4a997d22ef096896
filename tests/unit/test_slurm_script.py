"""A Slurm job before anything is sent: the inventory's slurm: section, the job keys
that make no sense there, the batch script, each node's spec and the sbatch command."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from orchestrator.agent.kernel.slurm import fill_marks, node_dir_name
from orchestrator.models.errors import InputError
from orchestrator.models.inventory import load_inventory
from orchestrator.models.job import load_job
from orchestrator.slurm import script
from orchestrator.slurm.queue import Partition
from orchestrator.slurm.section import section_of
from orchestrator.slurm.submit import check_partition, slurm_job
from tests.unit.conftest import Orch, WriteFile, expect_input_error

HPC = """
defaults: {user: alice, identity_file: ~/.ssh/id_ed25519}
slurm:
  login: login1.hpc.example.edu
  partition: gpu
  gpus_per_node: 8
  python: /shared/venvs/torch/bin/python
  sbatch: [--account=proj42, --time=04:00:00]
"""


def job_text(extra: str = "") -> str:
    return "name: digits\nscript: train.py\nnodes: 3\n" + extra


@pytest.fixture
def workdir(write: WriteFile) -> Path:
    return write("train.py", "print('hi')\n").parent


def test_the_slurm_section_names_the_login_node_as_the_only_host(write: WriteFile) -> None:
    inventory = load_inventory(write("hpc.yaml", HPC))
    assert inventory.backend_name == "slurm"
    (login,) = inventory.hosts
    assert (login.name, login.address, login.user) == ("login1.hpc.example.edu",) * 2 + ("alice",)
    assert login.python == "/shared/venvs/torch/bin/python"
    assert section_of(inventory).partition == "gpu" and section_of(inventory).gpus_per_node == 8
    assert section_of(inventory).sbatch == ("--account=proj42", "--time=04:00:00")


@pytest.mark.parametrize(
    ("text", "message", "hint"),
    [
        ("slurm: {partition: gpu}", "missing required key 'login'", "add 'login:'"),
        ("slurm: {login: l1, partiton: gpu}", "unknown key", "did you mean 'partition'?"),
        ("slurm: {login: l1, sbatch: [--nodes=4]}", "--nodes is set by orch", "nodes: in the job"),
        (
            "hosts: [{name: a, address: b}]\nslurm: {login: l1}",
            "either hosts: (SSH machines) or slurm:",
            "one inventory file per cluster",
        ),
        ("slurm: {login: l1, gpus_per_node: many}", "gpus_per_node", ""),
    ],
)
def test_a_bad_slurm_section_is_an_input_error(
    write: WriteFile, text: str, message: str, hint: str
) -> None:
    error = expect_input_error(lambda: load_inventory(write("hpc.yaml", text)))
    assert message in str(error) and hint in error.hint


@pytest.mark.parametrize(
    ("extra", "key", "hint"),
    [
        ("hosts: [node1, node2]\n", "hosts", "sbatch: [--nodelist=node1,node2]"),
        ("labels: [a100]\n", "labels", "sbatch: [--constraint=a100]"),
    ],
)
def test_job_keys_for_ssh_hosts_are_refused_with_the_slurm_way(
    write: WriteFile, workdir: Path, extra: str, key: str, hint: str
) -> None:
    inventory = load_inventory(write("hpc.yaml", HPC))
    job = load_job(write("job.yaml", job_text(extra).replace("nodes: 3\n", "")))
    error = expect_input_error(lambda: slurm_job(job, inventory, "digits-1"))
    assert f"{key}:" in str(error) and hint in error.hint


def slurm_of(write: WriteFile, extra: str = "", inventory: str = HPC) -> script.SlurmJob:
    return slurm_job(
        load_job(write("job.yaml", job_text(extra))),
        load_inventory(write("hpc.yaml", inventory)),
        "digits-abc123",
    )


def test_the_batch_script_asks_for_the_nodes_and_starts_one_launcher_each(
    write: WriteFile, workdir: Path
) -> None:
    text = script.batch_script(slurm_of(write))
    assert text.startswith("#!/bin/sh\n")
    for option in (
        "--job-name=digits",
        "--nodes=3",
        "--ntasks-per-node=1",
        "--output=slurm/batch-%j.out",
        "--partition=gpu",
        "--gres=gpu:8",
    ):
        assert f"#SBATCH {option}\n" in text
    assert "srun --kill-on-bad-exit=1 --ntasks-per-node=1 --nodes=3" in text
    assert '/shared/venvs/torch/bin/python -I -S agent/run.py slurm-node "$PWD"' in text
    assert "exit-$SLURM_JOB_ID.json" in text and text.rstrip().endswith("exit $rc")
    assert subprocess.run(["sh", "-n"], input=text, text=True, check=False).returncode == 0


def test_the_batch_script_leaves_out_what_the_inventory_does_not_say(
    write: WriteFile, workdir: Path
) -> None:
    bare = slurm_of(write, inventory="slurm: {login: l1}")
    text = script.batch_script(bare)
    assert "--partition" not in text and "--gres" not in text
    assert bare.nproc == 1 and bare.world_size == 3
    assert slurm_of(write, "nproc_per_node: 2\n").world_size == 6
    assert slurm_of(write).nproc == 8  # gpus_per_node is nproc_per_node's default


def test_sbatch_gets_the_inventorys_options_verbatim_and_runs_in_the_job_root(
    write: WriteFile, workdir: Path
) -> None:
    sj = slurm_of(write)
    assert script.sbatch_argv(sj) == [
        "sbatch",
        "--parsable",
        "--account=proj42",
        "--time=04:00:00",
        "slurm/batch.sh",
    ]
    assert sj.job_root == "~/.orch/jobs/digits-abc123"
    assert script.sbatch_command(sj, '"$HOME"/x') == (
        'cd "$HOME"/x && sbatch --parsable --account=proj42 --time=04:00:00 slurm/batch.sh'
    )


def test_each_node_rank_gets_its_placeholders_and_orch_variables(
    write: WriteFile, workdir: Path
) -> None:
    sj = slurm_of(
        write,
        'args: [--rank, "{node_rank}", "--master={master_addr}:{master_port}", "{{x}"]\n'
        'env: {WHO: "node {node_rank} of {num_nodes}", TOKEN: s3cret}\n',
    )
    spec = json.loads(script.spec_json(sj))
    assert spec["entry"] == ["agent/run.py", "rank", "logs", "code", "script", "train.py", "--"]
    assert (spec["port"], spec["python"]) == (None, "/shared/venvs/torch/bin/python")
    second = spec["nodes"][1]
    assert second["args"][:2] == ["--rank", "1"] and second["args"][3] == "{x}"
    assert second["env"]["WHO"] == "node 1 of 3" and second["env"]["TOKEN"] == "s3cret"
    assert second["env"]["ORCH_NODE_RANK"] == "1" and second["env"]["ORCH_WORLD_SIZE"] == "24"
    # The master is known only on the nodes: the launcher fills in its marks.
    filled = fill_marks(second["args"][2], "10.0.0.7", 29500)
    assert filled == "--master=10.0.0.7:29500"
    assert "s3cret" not in script.batch_script(sj)  # the env never goes in the script


def test_a_pinned_rendezvous_port_reaches_every_node(write: WriteFile, workdir: Path) -> None:
    spec = json.loads(script.spec_json(slurm_of(write, "rendezvous: {port: 29555}\n")))
    assert spec["port"] == 29555


def test_dry_run_shows_where_the_script_goes_and_the_sbatch_line(
    write: WriteFile, workdir: Path
) -> None:
    lines = script.describe(slurm_of(write))
    assert lines[0] == "job digits-abc123"
    assert "login node login1.hpc.example.edu, partition gpu" in lines
    assert "# ~/.orch/jobs/digits-abc123/slurm/batch.sh" in lines
    assert (
        "cd ~/.orch/jobs/digits-abc123 && sbatch --parsable --account=proj42 "
        "--time=04:00:00 slurm/batch.sh"
    ) in lines


def test_the_partition_must_exist_and_hold_the_jobs_nodes(write: WriteFile, workdir: Path) -> None:
    sj = slurm_of(write)
    parts = {"gpu": Partition("gpu", 4, True, False), "cpu": Partition("cpu", 2, True, True)}
    assert check_partition(sj, parts) == "gpu"
    with pytest.raises(InputError, match="has no partition 'gpu'") as unknown:
        check_partition(sj, {"cpu": parts["cpu"]})
    assert "partitions on login1.hpc.example.edu: cpu" in unknown.value.hint
    small = {"gpu": Partition("gpu", 2, True, True)}
    with pytest.raises(InputError, match="nodes=3 but Slurm partition 'gpu' has 2 nodes"):
        check_partition(sj, small)
    default = slurm_of(write, inventory="slurm: {login: l1}")  # Slurm's default partition
    assert check_partition(default, {**parts, "cpu": Partition("cpu", 3, True, True)}) == "cpu"


def test_node_directories_never_take_the_name_of_the_job_roots_own_files() -> None:
    assert node_dir_name("gpu07") == "gpu07"
    for name in ("code", "agent", "outputs", "snapshot.json", "seal.json", "slurm"):
        assert node_dir_name(name) == f"node-{name}"


def test_the_cli_dry_run_prints_the_batch_script_and_refuses_ssh_keys(
    orch: Orch, write: WriteFile, workdir: Path
) -> None:
    inventory = write("hpc.yaml", HPC)
    result = orch("submit", write("job.yaml", job_text()), "-i", inventory, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "#SBATCH --nodes=3" in result.stdout and "sbatch --parsable" in result.stdout
    assert result.stdout.rstrip().endswith(f"pushes 3 files from {workdir}")  # train.py, yamls
    bad = write("bad.yaml", job_text("labels: [a100]\n").replace("nodes: 3\n", ""))
    refused = orch("submit", bad, "-i", inventory, "--dry-run")
    assert refused.returncode == 2
    assert "labels: selects SSH hosts" in refused.stderr
    assert "hint: ask Slurm for node features" in refused.stderr
    high = orch(
        "submit", write("job.yaml", job_text()), "-i", inventory, "--dry-run", "--priority", "high"
    )
    assert high.returncode == 2
    assert "priority: high orders a shared SSH host's line" in high.stderr
    assert "hint: leave priority: (and --priority) out" in high.stderr


def test_launcher_python_runs_the_entry_once_per_node_with_the_output_the_nodes(
    write: WriteFile, workdir: Path
) -> None:
    spec = script.node_specs(slurm_of(write, "launcher: python\nargs: [-i, '{node_rank}']\n"))
    assert spec.launcher == "python"
    assert spec.entry == ["agent/run.py", "rank", "-", "code", "script", "train.py", "--"]
    described = script.describe(slurm_of(write, "launcher: python\n"))
    assert "  MASTER_ADDR=<master>, MASTER_PORT=<port>, NODE_RANK=<node rank>" in described
    assert [n.args for n in spec.nodes] == [["-i", "0"], ["-i", "1"], ["-i", "2"]]


def test_the_jobs_gpus_per_node_is_slurms_gres_request_and_wins_over_the_inventorys(
    write: WriteFile, workdir: Path
) -> None:
    sj = slurm_of(write, "gpus_per_node: 2\n")
    assert "#SBATCH --gres=gpu:2\n" in script.batch_script(sj)
    assert (sj.gpus, sj.nproc) == (2, 2)
    assert slurm_of(write, "gpus_per_node: 2\nnproc_per_node: 1\n").nproc == 1
    none = slurm_of(write, "gpus_per_node: 0\n")
    assert "--gres" not in script.batch_script(none) and none.nproc == 1
