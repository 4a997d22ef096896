"""The requests the controller sends the agent (agent/kernel/requests.py): each built by
name on one side and parsed by name on the other, the same after the trip through the
wire; a field built under a wrong name caught by the type checker where the package is
checked, and by the parser at run time."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from mypy import api as mypy_api

from orchestrator.agent.kernel import requests
from orchestrator.agent.kernel.messages import MessageError, parse_message
from orchestrator.agent.kernel.requests import (
    Candidate,
    EnvRequest,
    GcRequest,
    KeeperConfig,
    LeaseRequest,
    LeaseUnits,
    MemberConfig,
    NodeTemplate,
    OutputsRequest,
    Placement,
    ProbeOptions,
    PushHeader,
    RelayConfig,
    RelayOrder,
    Request,
    SetupRequest,
    SlurmChain,
    SlurmNode,
    SlurmSpec,
    SlurmTopRequest,
    SnapshotRequest,
    StackRequest,
    StartRequest,
    TopRequest,
    WarmOptions,
)

KERNEL = Path(requests.__file__).parent
TEMPLATE = NodeTemplate(
    job_id="j-1",
    launcher="torchrun",
    entry=["script", "train.py"],
    max_restarts=1,
    args=["--rank", "{node_rank}"],
    env={"WORLD": "{world_size}"},
    host="node1",
    python="/opt/venv/bin/python",
    workdir="~/.orch",
    host_env={"NCCL_SOCKET_IFNAME": "eth0"},
    gpus=[0, 1],
    iface="eth0",
    addr="10.77.0.11",
    warm=WarmOptions(preload=["torch"], idle=600),
)
LEASE = LeaseRequest(
    kind="gpu", pool=[0, 1], count=2, job="j-1", ticket=[1.5, "j-1"], wait=False, self_start=True
)
EVERY_REQUEST: list[Request] = [
    WarmOptions(off="orch submit --cold"),
    TEMPLATE,
    LeaseUnits(kind="slot", pool=[], count=0),
    LEASE,
    StartRequest(argv=["python", "-m", "torch.distributed.run"], env={"A": "1"}),
    StartRequest(argv=["python"], env={}, lease=LEASE, warm=WarmOptions(off="warm: false")),
    SetupRequest(script="pip install -e .", env={"A": "1"}, store="~/s", key="k", manifest="m"),
    EnvRequest(envs="~/.orch/envs", digest="d" * 64, requirements=["numpy==2.3.1"], wheels="w"),
    TopRequest(job_id="j-1", offsets={"rank-0": 120}),
    SlurmTopRequest(job_id="j-1", offsets={"node1": {"rank-0": 3}}),
    StackRequest(job_id="j-1", ranks=[0, 3], native=True, pyspy={"x86_64": "ab" * 32}),
    OutputsRequest(paths=["*.pt"], have={"a.pt": [10, 1700000000000000000]}),
    GcRequest(workdir="~/.orch", keep=3, grace=0.5, outputs=True),
    MemberConfig(
        secret="ab" * 32,
        addr="10.77.0.11",
        port=4100,
        template=TEMPLATE,
        store="~/.orch/store",
        digest="d" * 64,
        node_dir=None,
        lost_after=30.0,
        lease=LeaseUnits(kind="gpu", pool=[0], count=1),
    ),
    ProbeOptions(master="10.77.0.11", port=29500, workdir="~/.orch", gpus=False),
    ProbeOptions(modules=["torch"], mark="m1", look=["m1", "m2"]),
    Placement(hosts=["node1"], nprocs=[2], master_addr="10.77.0.11", master_port=None),
    Candidate(host="node3", nproc=2, addr=None, workdir="~/.orch"),
    KeeperConfig(
        secret="ab" * 32,
        job_id="j-1",
        restarts=2,
        lost_after=30.0,
        bind="10.77.0.11",
        host="node1",
        line="together",
        place=Placement(
            hosts=["node1", "node2"],
            nprocs=[2, 1],
            master_addr="10.77.0.11",
            master_port=29500,
            attempt=1,
            ticket=[1.5, "j-1"],
        ),
        candidates=[Candidate(host="node1", nproc=2, addr="10.77.0.11", workdir="~/.orch")],
    ),
    SlurmSpec(
        job_id="j-1",
        python="python3",
        port=None,
        entry=["agent/run.py", "rank", "logs", "code", "script", "train.py", "--"],
        nodes=[SlurmNode(nproc=2, args=["--lr", "0.1"], env={"ORCH_NODE_RANK": "0"})],
    ),
    SlurmNode(nproc=1, args=[], env={}),
    SlurmChain(restarts=1, sbatch=["--qos=high"]),
    PushHeader(store="~/.orch/store", push="t1"),
    RelayOrder(addr="10.77.0.11", port=4200, secret="cd" * 32, keys=["e" * 64]),
    SnapshotRequest(digest="d" * 64, job_dir="~/.orch/jobs/j-1/node1", keep=5, nodes=["n2"]),
    RelayConfig(store="~/.orch/store", secret="cd" * 32, expect=2),
]


def test_every_request_class_is_in_the_round_trip() -> None:
    """A request added to the kernel is added below too."""
    classes = {cls for cls in vars(requests).values() if isinstance(cls, type)}
    kinds = {c for c in classes if issubclass(c, Request) and c is not Request}
    assert kinds == {type(r) for r in EVERY_REQUEST}


@pytest.mark.parametrize("request_", EVERY_REQUEST, ids=lambda r: type(r).__name__)
def test_a_request_reads_back_the_same_after_the_wire(request_: Request) -> None:
    sent = request_.to_json()
    received = parse_message(type(request_), json.loads(sent))
    assert received.as_dict() == request_.as_dict()
    assert received.to_json() == sent


def test_a_request_inside_a_request_is_parsed_as_its_class() -> None:
    data = json.loads(StartRequest(argv=["p"], env={}, lease=LEASE).to_json())
    received = parse_message(StartRequest, data)
    assert isinstance(received.lease, LeaseRequest)
    assert received.lease.pool == [0, 1] and received.lease.self_start is True
    assert received.warm is None  # left out: the reader's default


def test_fields_a_newer_controller_adds_are_ignored() -> None:
    data = {"store": "~/s", "push": "t1", "compression": "zstd"}
    assert parse_message(PushHeader, data).as_dict() == {"store": "~/s", "push": "t1"}


def test_the_parser_names_a_required_field_sent_under_a_wrong_name() -> None:
    data = {"argvs": ["python"], "env": {}}
    with pytest.raises(MessageError, match=r"StartRequest from node3 lacks 'argv'"):
        parse_message(StartRequest, data, host="node3")


def test_the_parser_names_a_field_of_the_wrong_type() -> None:
    with pytest.raises(MessageError, match=r"GcRequest.keep is str, not int"):
        parse_message(GcRequest, {"workdir": "~/.orch", "keep": "3"})
    with pytest.raises(MessageError, match=r"StartRequest.lease: LeaseRequest lacks 'pool'"):
        parse_message(StartRequest, {"argv": [], "env": {}, "lease": {"kind": "gpu"}})


BUILDS = """\
from kernel.requests import GcRequest, StartRequest, WarmOptions

good = StartRequest(argv=["python"], env={"A": "1"}, warm=WarmOptions(idle=60))
good.warm = WarmOptions(off="cold")
misspelt = StartRequest(argvs=["python"], env={})
wrong_type = GcRequest(workdir="~", keep="3")
missing = WarmOptions(preload=["torch"], idel=60)
"""


def test_the_type_checker_catches_a_request_built_with_a_wrong_field(tmp_path: Path) -> None:
    """The kernel's own modules, as they are, checked with the code that builds a
    request: what mypy says of the package's callers."""
    (tmp_path / "kernel").mkdir()
    (tmp_path / "kernel" / "__init__.py").write_text("")
    for name in ("messages.py", "requests.py", "cjson.py"):
        shutil.copy(KERNEL / name, tmp_path / "kernel" / name)
    (tmp_path / "builds.py").write_text(BUILDS)
    out, err, code = mypy_api.run(
        [
            "--strict",
            "--python-version=3.11",
            f"--cache-dir={tmp_path / 'cache'}",
            str(tmp_path / "builds.py"),
        ]
    )
    errors = [line.split(": error: ")[1] for line in out.splitlines() if ": error: " in line]
    assert any('Unexpected keyword argument "argvs"' in e for e in errors), out + err
    assert any('"keep"' in e and "incompatible type" in e for e in errors), out + err
    assert any('Unexpected keyword argument "idel"' in e for e in errors), out + err
    lines = {int(line.split(":")[1]) for line in out.splitlines() if ": error: " in line}
    assert lines == {5, 6, 7}, out  # the good lines pass
    assert code == 1
