"""`notify:`, the pure parts and the sender: a target read and checked at load (a URL
that does not parse is exit 2 there, naming no token), the default in the user's
config, Slurm's refusal, what a log line may name of a URL, the message, the keeper's
events once each, and the sender's tries through a real /bin/sh and a real HTTP
server on loopback."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from orchestrator import backends
from orchestrator.agent.keeper.decisions import Keeping
from orchestrator.agent.keeper.notify import KeeperNotify, last_lines
from orchestrator.agent.kernel import notify, placement
from orchestrator.models.errors import InputError, SpecError, Unsupported
from orchestrator.models.inventory import load_inventory
from orchestrator.models.job import Overrides, load_job, with_overrides
from orchestrator.models.notify import config_path, default_notify, target_problem
from tests.unit.conftest import Orch, WriteFile
from tests.unit.keeping_driver import Driven

TOKEN = "T0KEN-9f8e7d"
HOOK = f"https://hooks.slack.com/services/T000/B000/{TOKEN}"


def job_file(write: WriteFile, notify_line: str) -> Path:
    write("train.py", "")
    return write("job.yaml", f"script: train.py\n{notify_line}\n")


# ---------------------------------------------------------------- at load


@pytest.mark.parametrize(
    ("target", "problem"),
    [
        ("https://", "names no host"),
        (f"https:///services/{TOKEN}", "names no host"),
        (f"https://hooks.slack.com:99999/{TOKEN}", "does not parse"),
        (f"https://hooks.slack.com:abc/{TOKEN}", "does not parse"),
        (f"https://hooks.slack.com/a b/{TOKEN}", "has a space"),
        (f"slack://{TOKEN}/B000/C000", "http:// and https:// webhooks only"),
        ("   ", "empty"),
    ],
)
def test_a_target_that_is_no_webhook_is_named_without_its_token(target: str, problem: str) -> None:
    found = target_problem(target)
    assert found is not None and problem in found
    assert TOKEN not in found


@pytest.mark.parametrize(
    "target", [HOOK, "http://10.0.0.5:8080/hook", 'echo "$ORCH_JOB_ID" >> ~/done.log']
)
def test_a_webhook_or_a_command_is_a_target(target: str) -> None:
    assert target_problem(target) is None


def test_a_webhook_url_that_does_not_parse_is_exit_2_at_load(orch: Orch, write: WriteFile) -> None:
    job = job_file(write, f"notify: 'https://hooks.slack.com:port/{TOKEN}'")
    done = orch("submit", job, "--dry-run")
    assert done.returncode == 2
    first, hint = done.stderr.splitlines()[:2]
    assert first.startswith("error: ") and "job.yaml:2:" in first and "notify:" in first, first
    assert hint.startswith("hint: ") and "webhook" in hint
    assert TOKEN not in done.stderr + done.stdout


def test_a_bad_notify_flag_is_exit_2(orch: Orch, write: WriteFile) -> None:
    done = orch("submit", job_file(write, ""), "--notify", "https://", "--dry-run")
    assert done.returncode == 2 and "error: --notify: the https:// URL names no host" in done.stderr


def test_the_flag_replaces_the_jobs_notify(write: WriteFile) -> None:
    job = load_job(job_file(write, "notify: echo from-the-file"))
    assert job.notify == "echo from-the-file"
    assert with_overrides(job, Overrides(notify=HOOK)).notify == HOOK
    assert with_overrides(job, Overrides()).notify == "echo from-the-file"
    with pytest.raises(InputError):
        with_overrides(job, Overrides(notify="ftp://x/y"))


def test_the_default_is_read_from_the_users_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    assert config_path() == tmp_path / "config" / "orch" / "notify.yaml"
    assert default_notify() is None  # no file: no default
    config_path().parent.mkdir(parents=True)
    config_path().write_text(f"notify: {HOOK}\n")
    assert default_notify() == HOOK
    config_path().write_text("notfiy: echo\n")
    with pytest.raises(SpecError, match="notfiy"):
        default_notify()


def test_the_dry_run_names_the_default_target_without_its_token(
    orch: Orch, write: WriteFile, tmp_path: Path
) -> None:
    write("config/orch/notify.yaml", f"notify: {HOOK}\n")
    done = orch(
        "submit",
        job_file(write, ""),
        "--dry-run",
        env={"XDG_CONFIG_HOME": str(tmp_path / "config")},
    )
    assert done.returncode == 0, done.stderr
    assert (
        "notify: the job's end, failure, restarts and stalls go to https://hooks.slack.com/…"
        in (done.stdout)
    )
    assert TOKEN not in done.stdout + done.stderr


def test_slurm_refuses_notify_by_name(write: WriteFile) -> None:
    inventory = load_inventory(write("hpc.yaml", "slurm:\n  login: login1\n  partition: gpu\n"))
    job = load_job(job_file(write, "notify: echo done"))
    with pytest.raises(Unsupported) as caught:
        backends.for_inventory(inventory).dry_run(job, inventory)
    assert "job.yaml:2:9: notify: is not for the slurm backend yet" in caught.value.message
    assert "--mail-type" in caught.value.hint and caught.value.exit_code == 2


# ---------------------------------------------------------------- what is said


def test_a_log_line_names_a_webhook_by_its_scheme_and_host_only() -> None:
    assert notify.redact(f"https://user:{TOKEN}@hooks.example.com:8443/x?t={TOKEN}") == (
        "https://hooks.example.com:8443/…"
    )
    assert notify.redact(HOOK) == "https://hooks.slack.com/…"
    assert notify.redact(f"curl -d @- https://x/{TOKEN}") == "command"


def test_the_message_says_the_job_its_state_and_exit_code() -> None:
    assert notify.message("digits-3fa9c2", notify.FAILED, "failed", 1) == (
        "orch: job digits-3fa9c2 failed (exit code 1)"
    )
    assert notify.message("digits-3fa9c2", notify.RESTARTED, "running", None) == (
        "orch: job digits-3fa9c2 restarted"
    )


def test_a_failed_nodes_last_lines_are_its_failing_ranks(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "rank-2.log").write_text("step 1\nstep 2\n")
    (logs / "rank-3.log").write_text("step 1\nTraceback (most recent call last):\nValueError: x\n")
    (tmp_path / "torchrun.log").write_text("torchrun's own\n")
    assert last_lines(str(tmp_path)) == (
        3,
        ["step 1", "Traceback (most recent call last):", "ValueError: x"],
    )
    (logs / "rank-3.log").write_text("fine\n")
    (tmp_path / "torchrun.log").write_text("Traceback (most recent call last):\nOSError: y\n")
    assert last_lines(str(tmp_path)) == (None, ["Traceback (most recent call last):", "OSError: y"])
    assert last_lines(str(tmp_path / "nowhere")) == (None, [])


# ---------------------------------------------------------------- the keeper's events


def kept_job(restarts: int, **more: Any) -> Driven:
    config = {
        **more,
        "job_id": "j-1",
        "restarts": restarts,
        "lost_after": 3,
        "place": placement.placement(["node1", "node2"], [1, 1], "10.0.0.1", 29500),
        "candidates": [
            {"host": h, "nproc": 1, "addr": f"10.0.0.{h[-1]}", "workdir": "~/.orch"}
            for h in ("node1", "node2")
        ],
    }
    kept = Driven(Keeping(config, now=0.0, wall=lambda: 1700000000.0))
    for host in ("node1", "node2"):
        kept.hear(host, {"k": "hello", "host": host}, 0.0)
    return kept


class Told:
    """A KeeperNotify whose target is a real command that keeps every event it is told
    (its ORCH_ variables, then its message) in a file."""

    def __init__(self, kept: Driven, tmp_path: Path) -> None:
        self.path = tmp_path / "told"
        line = '"== $ORCH_EVENT $ORCH_STATE $ORCH_EXIT_CODE"'
        self.notify = KeeperNotify(f"{{ echo {line}; cat; }} >> {self.path}", kept.keeping)

    def events(self) -> list[tuple[str, list[str]]]:
        """(the variables' line, the message's lines) of each event told so far."""
        if self.notify.courier is not None:
            self.notify.courier.finish()
        if not self.path.exists():
            return []
        told = []
        for part in self.path.read_text().split("== ")[1:]:
            head, *text = part.splitlines()
            told.append((head, text))
        return told


def test_the_keeper_tells_a_restart_and_the_failure_once_each_with_the_last_lines(
    tmp_path: Path,
) -> None:
    kept = kept_job(restarts=1)
    told = Told(kept, tmp_path)
    told.notify.observe(kept.keeping)
    kept.hear("node2", {"k": "end", "attempt": 0, "returncode": 3}, 1.0)
    kept.hear("node1", {"k": "stopped", "attempt": 0}, 2.0)
    kept.hear("node1", {"k": "port", "port": 40001}, 2.1)
    for _ in range(3):
        told.notify.observe(kept.keeping)
    ((head, text),) = told.events()
    assert head == "restarted restarting "
    assert text[:2] == ["orch: job j-1 restarted", "attempt 1 failed on node2"]
    for host in ("node1", "node2"):
        kept.hear(host, {"k": "started", "attempt": 1, "ok": True}, 3.0)
    told.notify.heard_end("node2", 1, 1, ["Traceback (most recent call last):", "OSError: z"])
    kept.hear("node2", {"k": "end", "attempt": 1, "returncode": 1}, 4.0)
    kept.hear("node1", {"k": "stopped", "attempt": 1}, 4.5)
    assert kept.done
    for _ in range(3):
        told.notify.observe(kept.keeping)
    events = told.events()
    assert [head for head, _ in events] == ["restarted restarting ", "failed failed 1"]
    assert events[1][1] == [
        "orch: job j-1 failed (exit code 1)",
        "attempt 2 failed on node2",
        "node node2 exited with code 1",
        "last lines of [node2 r1]:",
        "  Traceback (most recent call last):",
        "  OSError: z",
        "more: orch status j-1; orch logs j-1",
    ]


def test_a_keeper_that_took_over_does_not_tell_again_what_its_predecessor_saw(
    tmp_path: Path,
) -> None:
    kept = kept_job(restarts=0)
    for host in ("node1", "node2"):
        kept.hear(host, {"k": "end", "attempt": 0, "returncode": 0}, 1.0)
    told = Told(kept, tmp_path)
    told.notify.observe(kept.keeping)
    assert told.events() == []  # it was done when this one started


def test_the_keeper_tells_a_success_as_ended(tmp_path: Path) -> None:
    kept = kept_job(restarts=0)
    told = Told(kept, tmp_path)
    for host in ("node1", "node2"):
        kept.hear(host, {"k": "end", "attempt": 0, "returncode": 0}, 1.0)
        told.notify.observe(kept.keeping)
    assert told.events() == [
        (
            "ended succeeded 0",
            ["orch: job j-1 succeeded (exit code 0)", "more: orch status j-1; orch logs j-1"],
        )
    ]


def test_the_keeper_tells_a_stall_then_the_failure_it_made(tmp_path: Path) -> None:
    kept = kept_job(restarts=0, stall_after=10)
    told = Told(kept, tmp_path)
    for host in ("node1", "node2"):
        kept.hear(host, {"k": "hb", "idle": 11.0}, 11.0)
    sends = kept.tick(11.0)
    assert [m["k"] for _, m in sends] == ["stacks", "stacks"]
    for host in ("node1", "node2"):
        kept.hear(host, {"k": "stacks", "attempt": 0, "reply": {"ranks": []}}, 11.5)
    told.notify.observe(kept.keeping)
    for host in ("node1", "node2"):
        kept.hear(host, {"k": "stopped", "attempt": 0}, 12.0)
    told.notify.observe(kept.keeping)
    told.notify.observe(kept.keeping)
    events = told.events()
    assert [head for head, _ in events] == ["stalled running ", "failed failed 1"]
    assert events[0][1][:2] == [
        "orch: job j-1 stalled",
        "no rank printed a line for 10 s in attempt 1; every rank's stack was taken (stopped)",
    ]
    assert "stalled: no output for 10 s" in events[1][1][1]


# ---------------------------------------------------------------- sending


def event(text: str = "orch: job j-1 failed (exit code 1)") -> notify.Event:
    return notify.Event("j-1", notify.FAILED, "failed", 1, text)


def test_a_command_gets_the_events_variables_and_the_message_on_stdin(tmp_path: Path) -> None:
    out = tmp_path / "out"
    names = "ORCH_JOB_ID ORCH_EVENT ORCH_STATE ORCH_EXIT_CODE ORCH_MESSAGE"
    command = f"for v in {names}; do printenv $v; done > {out}; cat > {out}.stdin"
    assert notify.send(command, event("line one\nline two"), log=pytest.fail)
    assert out.read_text().splitlines() == ["j-1", "failed", "failed", "1", "line one", "line two"]
    assert (tmp_path / "out.stdin").read_text() == "line one\nline two\n"


def test_a_failing_command_is_tried_three_times_and_never_raises() -> None:
    logged: list[str] = []
    waits: list[float] = []
    assert not notify.send("echo nope >&2; exit 7", event(), logged.append, waits.append)
    assert waits == [1.0, 2.0]
    assert len(logged) == 3
    assert logged[0] == (
        "notify: failed of job j-1 to command: try 1 of 3 failed: "
        "the command exited with 7: nope; again in 1 s"
    )


class Hook(BaseHTTPRequestHandler):
    server: HookServer

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.posts.append(json.loads(body))
        status = self.server.answers.pop(0) if self.server.answers else 200
        self.send_response(status)
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


class HookServer(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Hook)
        self.answers: list[int] = []
        self.posts: list[dict[str, Any]] = []


@pytest.fixture
def hook() -> Iterator[HookServer]:
    server = HookServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_a_webhook_that_fails_once_gets_the_message_on_the_second_try(hook: HookServer) -> None:
    hook.answers = [500]
    logged: list[str] = []
    url = f"http://127.0.0.1:{hook.server_port}/hooks/{TOKEN}"
    assert notify.send(url, event("all\nof it"), logged.append, lambda _: None)
    assert [p["text"] for p in hook.posts] == ["all\nof it", "all\nof it"]
    assert hook.posts[0]["event"] == "failed" and hook.posts[0]["exit_code"] == 1
    (line,) = logged
    assert "HTTP 500" in line and f"http://127.0.0.1:{hook.server_port}/…" in line
    assert TOKEN not in line


def test_a_webhook_no_one_answers_is_logged_without_its_token() -> None:
    logged: list[str] = []
    url = f"http://127.0.0.1:9/hooks/{TOKEN}?key={TOKEN}"
    assert not notify.send(url, event(), logged.append, lambda _: None)
    assert len(logged) == 3 and all(TOKEN not in line for line in logged), logged


def test_the_courier_sends_in_order_and_finish_waits_for_it(hook: HookServer) -> None:
    courier = notify.Courier(f"http://127.0.0.1:{hook.server_port}/h", pytest.fail)
    for name in (notify.RESTARTED, notify.STALLED, notify.FAILED):
        courier.tell(notify.Event("j-1", name, "running", None, name))
    courier.finish()
    assert [p["event"] for p in hook.posts] == ["restarted", "stalled", "failed"]
