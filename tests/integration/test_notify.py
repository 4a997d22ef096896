"""`notify:` on the test cluster: word of a job's events, once each. An attached job's
controller tells its end (and restarts) from the laptop, through a shell command or a
webhook (a server of this test process, on loopback) that fails without changing the
job's exit code; a detached job's keeper tells them on its host with no orch process
left on the laptop, the failing rank's last lines in the message, and a webhook's
token in no command line or log. Every job here is torch-free (jobs/notify/end.py)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import Cluster, OrchRunner
from tests.support import controller_processes, job_id_of, wait_for, write_job

pytestmark = pytest.mark.cluster

TOKEN = "T0KEN-b4c6a1f0e9"  # a webhook's secret part, as Slack's URLs hold one


def end_job(tmp_path: Path, notify: str, *args: str, **keys: Any) -> Path:
    keys.setdefault("nodes", 1)
    return write_job(
        tmp_path, "notify", "end.py", launcher="python", args=list(args), notify=notify, **keys
    )


def telling(path: str) -> str:
    """A notify command that appends one line per event to `path`, and keeps each
    event's message (its stdin) beside it."""
    line = '"$ORCH_EVENT $ORCH_STATE $ORCH_EXIT_CODE $ORCH_JOB_ID"'
    return f"echo {line} >> {path}; cat > {path}.$ORCH_EVENT"


class Hook(BaseHTTPRequestHandler):
    """A webhook that keeps what it was sent and answers with the server's `status`."""

    server: HookServer

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.posts.append((self.path, json.loads(body)))
        self.send_response(self.server.status)
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


class HookServer(ThreadingHTTPServer):
    def __init__(self, status: int) -> None:
        super().__init__(("127.0.0.1", 0), Hook)
        self.status = status
        self.posts: list[tuple[str, dict[str, Any]]] = []


@pytest.fixture
def failing_hook() -> Iterator[HookServer]:
    server = HookServer(500)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_an_attached_job_tells_its_end_once_with_its_state_in_the_commands_env(
    orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    said = tmp_path / "said"
    done = orch("submit", end_job(tmp_path, telling(str(said))), "-i", inventory, timeout=90)
    assert done.returncode == 0, done.stderr
    ok = job_id_of(done.stdout)
    assert said.read_text().splitlines() == [f"ended succeeded 0 {ok}"]
    assert (tmp_path / "said.ended").read_text().startswith(f"orch: job {ok} succeeded")

    job = end_job(tmp_path, telling(str(said)), "--fail-node", "1", nodes=2)
    done = orch("submit", job, "-i", inventory, timeout=90)
    assert done.returncode == 1, done.stderr
    failed = job_id_of(done.stdout)
    assert said.read_text().splitlines() == [f"ended succeeded 0 {ok}", f"failed failed 1 {failed}"]
    message = (tmp_path / "said.failed").read_text()
    assert message.startswith(f"orch: job {failed} failed (exit code 1)\n"), message
    assert "last lines of [node2]:" in message, message  # launcher: python has no ranks
    assert "RuntimeError: node 1 gave up on purpose" in message, "the failing rank's last lines"
    assert f"orch logs {failed}" in message, "how to see more"


def test_an_attached_job_tells_its_restart_then_its_end(
    orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    said = tmp_path / "said"
    job = end_job(tmp_path, telling(str(said)), "--fail-node", "0", "--first-only", restarts=1)
    done = orch("submit", job, "-i", inventory, timeout=90)
    assert done.returncode == 0, done.stderr
    job_id = job_id_of(done.stdout)
    assert said.read_text().splitlines() == [
        f"restarted restarting  {job_id}",
        f"ended succeeded 0 {job_id}",
    ]


def test_a_failing_webhook_is_tried_again_and_leaves_the_jobs_exit_code_alone(
    orch: OrchRunner, inventory: Path, tmp_path: Path, failing_hook: HookServer
) -> None:
    url = f"http://127.0.0.1:{failing_hook.server_port}/hooks/{TOKEN}"
    started = time.monotonic()
    done = orch("submit", end_job(tmp_path, url), "-i", inventory, timeout=90)
    assert done.returncode == 0, done.stderr
    job_id = job_id_of(done.stdout)
    assert len(failing_hook.posts) == 3, "three tries"
    for path, body in failing_hook.posts:
        assert path == f"/hooks/{TOKEN}"
        assert body["text"].startswith(f"orch: job {job_id} succeeded"), body
        assert (body["event"], body["state"], body["exit_code"]) == ("ended", "succeeded", 0)
    tries = [line for line in done.stderr.splitlines() if "warning: notify:" in line]
    assert len(tries) == 3, done.stderr
    assert (
        f"to http://127.0.0.1:{failing_hook.server_port}/…: try 1 of 3 failed: HTTP 500"
        in (tries[0])
    )
    assert TOKEN not in done.stderr + done.stdout, "the token is never shown"
    assert time.monotonic() - started < 60


def test_a_detached_job_is_told_by_its_keeper_once_with_the_laptop_gone(
    orch: OrchRunner, cluster: Cluster, inventory: Path, tmp_path: Path
) -> None:
    job = end_job(tmp_path, telling("$HOME/said-$ORCH_JOB_ID"), "--sleep", "2")
    done = orch("submit", "-d", job, "-i", inventory, timeout=90)
    assert done.returncode == 0, done.stderr
    job_id = job_id_of(done.stdout)
    assert "notify: a keeper on node1 tells the job's end" in done.stderr
    assert controller_processes(orch) == [], "no orch process left on the laptop"
    said = cluster.home(1) / f"said-{job_id}"
    wait_for(said.exists, 60, "the keeper's word")
    time.sleep(1.5)  # a second word would come now
    assert said.read_text().splitlines() == [f"ended succeeded 0 {job_id}"]


def test_a_detached_jobs_failure_is_told_with_the_failing_ranks_last_lines(
    orch: OrchRunner, cluster: Cluster, inventory: Path, tmp_path: Path
) -> None:
    job = end_job(
        tmp_path, telling("$HOME/said-$ORCH_JOB_ID"), "--fail-node", "1", "--sleep", "1", nodes=2
    )
    done = orch("submit", "-d", job, "-i", inventory, timeout=90)
    assert done.returncode == 0, done.stderr
    job_id = job_id_of(done.stdout)
    said = cluster.home(1) / f"said-{job_id}"
    wait_for(said.exists, 60, "the keeper's word")
    time.sleep(1.5)
    assert said.read_text().splitlines() == [f"failed failed 1 {job_id}"]
    message = (cluster.home(1) / f"said-{job_id}.failed").read_text()
    assert "node node2 exited with code 1" in message, message
    assert "last lines of [node2]:" in message, message  # launcher: python has no ranks
    assert "RuntimeError: node 1 gave up on purpose" in message, message


def test_a_detached_jobs_failing_webhook_keeps_its_token_out_of_argv_and_logs(
    orch: OrchRunner, cluster: Cluster, inventory: Path, tmp_path: Path
) -> None:
    # Nothing listens on the host's port 9: every try fails at once.
    job = end_job(tmp_path, f"http://127.0.0.1:9/hooks/{TOKEN}", "--sleep", "3")
    done = orch("submit", "-d", job, "-i", inventory, timeout=90)
    assert done.returncode == 0, done.stderr
    job_id = job_id_of(done.stdout)
    seen = [cmd for _, cmd in cluster.host_pids(1)]
    assert any("keeper" in cmd for cmd in seen), seen
    assert not any(TOKEN in cmd for cmd in seen), "the token in no command line"
    node_dir = cluster.home(1) / ".orch" / "jobs" / job_id / "node1"
    log = node_dir / "keeper.log"
    wait_for(lambda: log.exists() and "try 3 of 3" in log.read_text(), 60, "three tries")
    text = log.read_text()
    assert "notify: ended of" in text and "http://127.0.0.1:9/…" in text, text
    record = json.loads((node_dir / "keeper.json").read_text())
    assert record["state"] == "succeeded", "the hook's failure leaves the outcome alone"
    for path in node_dir.rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), f"the token in {path}"
    assert oct(log.stat().st_mode & 0o777) == "0o600"


def test_orch_kill_of_a_detached_job_is_told_once_and_never_waits_for_the_hook(
    orch: OrchRunner, cluster: Cluster, inventory: Path, tmp_path: Path
) -> None:
    # The hook holds until this test lets it go: the kill must return before.
    hold = 'while [ ! -e "$HOME/go-$ORCH_JOB_ID" ]; do sleep 0.1; done; '
    job = end_job(tmp_path, hold + telling("$HOME/said-$ORCH_JOB_ID"), "--sleep", "60")
    done = orch("submit", "-d", job, "-i", inventory, timeout=90)
    assert done.returncode == 0, done.stderr
    job_id = job_id_of(done.stdout)
    started = time.monotonic()
    killed = orch("kill", job_id, timeout=60)
    assert killed.returncode == 0, killed.stderr
    # A kill that waited for the keeper to leave would wait out the hook's 27 s.
    assert time.monotonic() - started < 20, "the kill waited for the hook"

    # Its ORCH_NOTIFY=1 keeps the hook out of the kill, which stops every process that
    # carries the job's id.
    def holding() -> bool:
        return any("go-" in cmd for _, cmd in cluster.host_pids(1))

    wait_for(holding, 5, "the hook, holding after the kill")
    said = cluster.home(1) / f"said-{job_id}"
    assert not said.exists(), "the kill returned while the hook still held"
    (cluster.home(1) / f"go-{job_id}").touch()
    wait_for(said.exists, 30, "the keeper's word")
    time.sleep(1.0)
    assert said.read_text().splitlines() == [f"ended killed 1 {job_id}"]
