"""What `orch check` and submit's preflight conclude from probed facts. Pure: no I/O.

Each rule turns facts into Problems: an error (the job would hang or fail, so submit
refuses) or a warning (it would run, maybe badly), each with a one-line fix. The
messages follow the CLI's shape, `<what> (host <name>)`, so that check's report and
submit's refusal read the same.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from orchestrator.agent.kernel.lease_wire import LeaseDir, printable
from orchestrator.agent.kernel.notify import redact
from orchestrator.models.errors import OrchError
from orchestrator.models.facts import HostFacts
from orchestrator.models.inventory import Host
from orchestrator.ssh.plan import IFNAME_VARS

LOW_DISK_BYTES = 1 << 30
CLOCK_WARN_S = 1.0
GPU_LINK_GBITS = 10.0  # what multi-node GPU training needs between nodes, at least


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True)
class Problem:
    """One finding: what is wrong (`what`) on which hosts, and the fix (`hint`).

    `topic` names the part of the report it concerns (a column of check's table:
    ssh, python, torch, gpus, disk, clock, route, port, bandwidth).
    """

    severity: Severity
    what: str
    hint: str
    hosts: tuple[str, ...] = ()
    topic: str = ""

    @property
    def is_error(self) -> bool:
        return self.severity is Severity.ERROR

    @property
    def host(self) -> str | None:
        return self.hosts[0] if self.hosts else None

    @property
    def message(self) -> str:
        """`what (host node2)`, or `(hosts node1, node3)` for several."""
        if not self.hosts:
            return self.what
        label = "host" if len(self.hosts) == 1 else "hosts"
        return f"{self.what} ({label} {', '.join(self.hosts)})"

    def lines(self) -> list[str]:
        """As the CLI prints errors: `error: ...` then `hint: ...`."""
        return [f"{self.severity}: {self.message}"] + ([f"hint: {self.hint}"] if self.hint else [])


def merge_hosts(problems: Sequence[Problem]) -> list[Problem]:
    """The same problem on several hosts, said once for all of them, in first-seen order."""
    merged: dict[tuple[Severity, str, str, str], Problem] = {}
    for p in problems:
        key = (p.severity, p.what, p.hint, p.topic)
        seen = merged.get(key)
        merged[key] = p if seen is None else replace(seen, hosts=seen.hosts + p.hosts)
    return list(merged.values())


def _error(host: str | None, topic: str, what: str, hint: str) -> Problem:
    return Problem(Severity.ERROR, what, hint, (host,) if host else (), topic)


def _warning(host: str | None, topic: str, what: str, hint: str) -> Problem:
    return Problem(Severity.WARNING, what, hint, (host,) if host else (), topic)


def unusable(host: Host, error: OrchError, topic: str) -> Problem:
    """A host that could not be used at all: its connect or probe error, as submit shows it."""
    what = error.message.removesuffix(f" (host {host.name})")
    return Problem(Severity.ERROR, what, error.hint, (host.name,), topic)


def host_problems(host: Host, facts: HostFacts, env: Mapping[str, str]) -> list[Problem]:
    """Everything wrong with one probed host on its own.

    Args:
        host: the inventory's host (declared GPUs, python).
        facts: what its probe found.
        env: the environment a job gets there (inventory's, then the job's).
    """
    found = [
        *_torch_problems(host, facts),
        *_gpu_problems(host, facts),
        *_route_problems(host, facts, env),
    ]
    if facts.disk_free is not None and facts.disk_free < LOW_DISK_BYTES:
        found.append(
            _warning(
                host.name,
                "disk",
                f"only {human_bytes(facts.disk_free)} free in {host.workdir}",
                f"free some space on {host.name}, or move 'workdir:' to a larger disk",
            )
        )
    if facts.clock_offset_s is not None and abs(facts.clock_offset_s) > CLOCK_WARN_S:
        found.append(
            _warning(
                host.name,
                "clock",
                f"clock is {facts.clock_offset_s:+.1f} s off this machine's",
                "enable time sync on both (timedatectl set-ntp true, or chrony)",
            )
        )
    if facts.index is not None and facts.index[1] != "ok":
        url, why = facts.index
        found.append(
            _error(
                host.name,
                "environment",
                f"cannot reach the package index {redact(url)} ({why}): the job's "
                "environment cannot be built there",
                "let this machine download the wheels for the hosts (wheels: download in "
                "the job file, or --wheels download), or give a directory of them (wheels: "
                "DIR): orch carries them to the hosts, which then install with no index",
            )
        )
    for module in facts.modules_missing:
        found.append(
            _error(
                host.name,
                "python",
                f"module {module} is neither in the job's workdir nor importable by {host.python}",
                f"install it for {host.python} on {host.name}, or put it in the workdir",
            )
        )
    return found


def _torch_problems(host: Host, facts: HostFacts) -> list[Problem]:
    # A missing torch is the probe's own error (nodes/probe.py torch_missing), as submit shows it.
    if facts.gpu_count and facts.torch_version and not facts.torch_cuda:
        return [
            _warning(
                host.name,
                "torch",
                f"torch {facts.torch_version} is a CPU-only build, "
                f"but the host has {facts.gpu_count} GPUs",
                f"install a CUDA build of torch for {host.python}",
            )
        ]
    return []


def _gpu_problems(host: Host, facts: HostFacts) -> list[Problem]:
    declared = len(host.gpus)
    needed = max(host.gpus) + 1 if host.gpus else 0
    seen = facts.gpu_count
    if declared and seen is None:
        detail = facts.gpu_error or "nvidia-smi gave no answer"
        return [
            _error(
                host.name,
                "gpus",
                f"cannot count GPUs ({detail}); inventory declares {declared}",
                "check the NVIDIA driver on the host: nvidia-smi",
            )
        ]
    if seen is None:
        return []
    if seen < needed:
        wanted = (
            f"declares {declared}"
            if host.gpus == tuple(range(declared))
            else f"uses GPUs {list(host.gpus)}"
        )
        detail = f": {facts.gpu_error}" if facts.gpu_error else ""
        return [
            _error(
                host.name,
                "gpus",
                f"{_gpu_source(facts)} shows {seen} GPUs, inventory {wanted}{detail}",
                "a GPU may have fallen off the bus (nvidia-smi -q, dmesg | grep Xid; "
                f"a reboot often brings it back), or lower 'gpus:' for {host.name}",
            )
        ]
    problems = []
    if facts.gpu_error:
        problems.append(
            _warning(host.name, "gpus", f"nvidia-smi: {facts.gpu_error}", "see nvidia-smi -q")
        )
    if seen and not declared:
        problems.append(
            _warning(
                host.name,
                "gpus",
                f"host has {seen} GPUs, but the inventory declares none: jobs start "
                f"{host.slots} process{'es' if host.slots > 1 else ''} there, on CPU",
                f"add 'gpus: {seen}' to {host.name} in the inventory",
            )
        )
    return problems


def _gpu_source(facts: HostFacts) -> str:
    return "nvidia-smi" if facts.gpu_names or facts.gpu_error else "the host"


def _route_problems(host: Host, facts: HostFacts, env: Mapping[str, str]) -> list[Problem]:
    if facts.route_error:
        return [
            _error(
                host.name,
                "route",
                f"no route to the master: {facts.route_error}",
                "fix the network (ip route) or the master's address in the inventory",
            )
        ]
    interfaces = sorted({name for _, name in facts.addresses})
    problems = []
    for var in IFNAME_VARS:
        value = env.get(var)
        if value is None or not interfaces:
            continue
        matching = ifname_matches(var, value, interfaces)
        if not matching:
            problems.append(
                _error(
                    host.name,
                    "route",
                    f"{var}={value} matches no interface (it has {', '.join(interfaces)})",
                    f"drop {var} and let orch choose {facts.iface or 'the route to the master'}, "
                    "or name an existing interface",
                )
            )
        elif facts.iface and facts.iface not in matching:
            problems.append(
                _warning(
                    host.name,
                    "route",
                    f"{var}={value}, but the route to the master goes through {facts.iface}",
                    f"drop {var} and let orch choose {facts.iface}",
                )
            )
    return problems


def ifname_matches(var: str, value: str, interfaces: Iterable[str]) -> list[str]:
    """The interfaces a *_SOCKET_IFNAME value selects.

    NCCL takes comma-separated prefixes, `=` for exact names and a leading `^` to
    exclude; gloo takes exact names.
    """
    names = list(interfaces)
    if var != "NCCL_SOCKET_IFNAME":
        wanted = {v.strip() for v in value.split(",")}
        return [n for n in names if n in wanted]
    exclude = value.startswith("^")
    rest = value.removeprefix("^")
    exact = rest.startswith("=")
    parts = [p for p in rest.removeprefix("=").split(",") if p]

    def selected(name: str) -> bool:
        return any(name == p if exact else name.startswith(p) for p in parts)

    return [n for n in names if selected(n) != exclude]


def cluster_problems(hosts: Sequence[Host], facts: Mapping[str, HostFacts]) -> list[Problem]:
    """What is wrong between hosts: torch and NCCL versions that differ."""
    torch = {h.name: facts[h.name].torch_version for h in hosts if h.name in facts}
    present = {name: v for name, v in torch.items() if v}
    problems = _odd_ones_out(
        {name: v.split("+")[0] for name, v in present.items()},
        lambda name, mine, common, others: _error(
            name,
            "torch",
            f"torch {present[name]} differs from {common} on {others}",
            f"install torch=={common} for {_python(hosts, name)}, or point 'python:' "
            f"for {name} at an interpreter that has it",
        ),
    )
    if not problems:  # same release, different builds: gloo works, nccl wants CUDA everywhere
        problems = _odd_ones_out(
            present,
            lambda name, mine, common, others: _warning(
                name,
                "torch",
                f"torch build {mine} differs from {common} on {others}",
                "use the same build everywhere (CPU and CUDA builds mix only with gloo)",
            ),
        )
    nccl = {h.name: facts[h.name].nccl_version or "" for h in hosts if h.name in facts}
    problems += _odd_ones_out(
        {name: v for name, v in nccl.items() if v},
        lambda name, mine, common, others: _warning(
            name,
            "torch",
            f"NCCL {mine} differs from {common} on {others}",
            "install the same torch and nvidia-nccl wheels on every host",
        ),
    )
    return problems


def _python(hosts: Sequence[Host], name: str) -> str:
    return next(h.python for h in hosts if h.name == name)


# (host, its value, the common value, the hosts that have the common value) -> Problem
_ProblemFactory = Callable[[str, str, str, str], Problem]


def _odd_ones_out(values: Mapping[str, str], problem: _ProblemFactory) -> list[Problem]:
    """A problem for each host whose value differs from the most common one.

    Ties go to the first host's value: the master's, which the others must match.
    """
    if len(set(values.values())) < 2:
        return []
    counts = Counter(values.values())
    first = next(iter(values.values()))
    common = max(counts, key=lambda v: (counts[v], v == first))
    others = ", ".join(name for name, v in values.items() if v == common)
    return [problem(name, v, common, others) for name, v in values.items() if v != common]


def port_problems(
    master: str, addr: str, port: int, pinned: bool, free: bool | None, holders: Sequence[str]
) -> list[Problem]:
    """A pinned rendezvous port that something else holds on the master."""
    if free is not False or not pinned:
        return []
    who = "; ".join(holders) if holders else "another process"
    return [
        _error(
            master,
            "port",
            f"rendezvous port {port} on the master {addr} is busy: held by {who}",
            "stop that process (a leftover of an earlier job? orch kill --all), "
            "or drop rendezvous.port so that orch picks a free one",
        )
    ]


def reach_problems(master: str, addr: str, port: int, failures: Mapping[str, str]) -> list[Problem]:
    """Nodes that could not open a TCP connection to the master's rendezvous port."""
    return [
        _error(
            node,
            "port",
            f"cannot connect to the master {master} at {addr}:{port}: {reason}",
            f"open TCP port {port} on {master} to the other nodes (firewall, security "
            "group), and the ports torch picks between nodes",
        )
        for node, reason in failures.items()
    ]


def relay_problems(master: str, failures: Mapping[str, str]) -> list[Problem]:
    """Nodes that cannot fetch the code from the master's relay: pushes to them cross
    this machine's link again, which is slower, not wrong."""
    return [
        _warning(
            node,
            "route",
            f"cannot fetch the code from {master}'s relay: {reason}; orch pushes it to "
            f"{node} directly, over this machine's link",
            f"let {node} open TCP connections to {master} on any port (the relay picks a "
            "free one), or leave it: only first pushes are slower",
        )
        for node, reason in failures.items()
    ]


def bandwidth_problems(
    rates: Mapping[str, tuple[float | None, float | None]], with_gpus: bool
) -> list[Problem]:
    """Links to the master slower than GPU training needs (only when hosts have GPUs)."""
    if not with_gpus:
        return []
    problems = []
    for node, (up, down) in rates.items():
        measured = [r for r in (up, down) if r is not None]
        if measured and min(measured) < GPU_LINK_GBITS:
            problems.append(
                _warning(
                    node,
                    "bandwidth",
                    f"{min(measured):.1f} Gbit/s to the master: GPU training needs "
                    f"{GPU_LINK_GBITS:.0f}+",
                    "use the fast network: give the hosts' addresses on it in the "
                    "inventory, or set NCCL_SOCKET_IFNAME to its interface",
                )
            )
    return problems


def lease_dir_problems(host: str, found: LeaseDir) -> list[Problem]:
    """A shared host's lease directory that root did not make: its owner (the first
    user whose job leased there) may remove anyone's lease, and two jobs then run on
    the same GPUs or slots without a word. And its policy file, where it was
    ignored or has a bad line."""
    fix = (
        f"as root: add 'd {found.dir} 1777 root root -' to /etc/tmpfiles.d/orch.conf "
        "and run systemd-tmpfiles --create (docs/SHARING.md)"
    )
    # The host's policy file, ignored (not root's) or with a bad line: its text comes
    # from the host, perhaps from another user's file: without control characters.
    problems = [
        _warning(
            host,
            "leases",
            printable(said, 1000),
            "as root: fix the policy file (docs/SHARING.md#the-policy-file)",
        )
        for said in found.policy
    ]
    if not found.exists:
        what = f"no lease directory {found.dir} yet: the first user to lease here will own it"
        return [_warning(host, "leases", what, fix), *problems]
    if found.owner not in (None, "root"):
        what = (
            f"lease directory {found.dir} belongs to {found.owner}, not root: "
            f"{found.owner} can remove anyone's lease"
        )
        return [
            _warning(host, "leases", what, f"as root: chown root:root {found.dir}; {fix}"),
            *problems,
        ]
    return problems


def human_bytes(n: int) -> str:
    """Decimal units, as df -H and disk vendors count: `41.2 GB`."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"
