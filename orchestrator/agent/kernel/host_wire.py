"""What the host-facts commands answer (agent/host/): `probe`, this host's facts in one
reply, and `nettest`, the network tests' records. The agent builds them, the
controller parses them (`parse_message`: each field's type checked, a message inside
parsed as its class; fields a newer agent adds are ignored).

Standard library only, valid on Python 3.8, like the rest of the kernel.
"""

from __future__ import annotations

from .messages import Message
from .replies import Reply

TYPE_CHECKING = False  # for the checker: importing typing costs every host command
if TYPE_CHECKING:
    from collections.abc import Sequence

# ---------------------------------------------------------------- probe


class GpuRow(Message):
    """One GPU as nvidia-smi lists it."""

    index: int
    name: str = ""
    memory_mib: int | None = None
    driver: str | None = None


class GpuFacts(Message):
    """The host's GPUs: how many (None: unknown), from where (nvidia-smi, else the
    /dev/nvidiaN nodes), the rows nvidia-smi gave, and what it said of the others."""

    count: int | None = None
    source: str | None = None
    list: Sequence[GpuRow] = ()
    error: str | None = None


class PortHolder(Message):
    """A socket on a port, and its process where /proc lets this user see it."""

    pid: int | None = None
    command: str | None = None
    user: str | None = None
    state: str = ""
    addr: str = ""


class PortFacts(Message):
    """Whether a port can be bound as torchrun's store binds it, and if not, by whom."""

    port: int
    free: bool
    error: str | None = None
    holders: Sequence[PortHolder] = ()


class WheelTags(Message):
    """What this host's python installs, as `pip download` for it is told (`probe`
    with `target`): implementation (`cp`), python_version (`3.11`), abi (`cp311`),
    platform (`linux_x86_64`), glibc (`2.36`; None: another C library)."""

    implementation: str
    python_version: str
    abi: str
    platform: str
    glibc: str | None = None


class ProbeFacts(Reply):
    """`probe`: the host's facts; each is there only when it was asked for or found."""

    hostname: str = ""
    os: str = ""
    python: str = ""
    executable: str = ""
    torch: str | None = None  # its version: None where torch is not installed
    torch_cuda: str | None = None
    torch_hip: str | None = None
    nccl: str | None = None
    ssh_addr: str | None = None  # the address sshd was reached at
    free_port: int | None = None
    addresses: dict[str, str] | None = None  # each IPv4 address: its interface
    iface: str | None = None  # the route to the master, when one was given
    local_addr: str | None = None
    route_error: str | None = None
    port: PortFacts | None = None
    disk_free: int | None = None  # bytes, in the workdir
    fs_seen: Sequence[str] | None = None  # the marks found (None: workdir not writable)
    fs_mark: str | None = None
    modules: dict[str, bool] | None = None  # each module asked for: found
    index_reach: str | None = None  # the index asked about: "ok", or why not
    target: WheelTags | None = None  # asked for: what wheels this python installs
    gpus: GpuFacts | None = None
    time: float | None = None  # the host's clock, read last


# ---------------------------------------------------------------- nettest


class NetReady(Reply):
    """`nettest listen|bwserve`, first record: listening (on `port`), or why not."""

    ready: bool
    port: int | None = None
    error: str | None = None


class NetDone(Reply):
    """`nettest listen|bwserve`, last record: the peers that came (listen), the
    tests served (bwserve)."""

    done: bool
    peers: Sequence[str] = ()
    served: int = 0


class Reached(Reply):
    """`nettest connect`: whether the listener's token came back, in how long."""

    ok: bool
    ms: float | None = None
    error: str | None = None


class Bandwidth(Reply):
    """`nettest bwclient`: Gbit/s each way (None: too short to tell), or why not."""

    up_gbps: float | None = None
    down_gbps: float | None = None
    error: str | None = None
