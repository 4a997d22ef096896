"""`orch ui` in a real browser on the test cluster: Debian's Chromium, headless, driven by
Playwright for Python. A 2-node job whose rank 0 prints Hugging Face Trainer dict lines
and rank 1 `loss=` lines, and rank 0 a hostile line (HTML, a script, escape sequences,
bytes that are not UTF-8, a megabyte on one line): the job shows in the list within 2 s
of its submit, a line a rank prints on cue within 2 s, both ranks' loss curves get
points, the hostile line is text, requests without the token (or from another origin)
are refused, and the kill button ends the job. Screenshots of each page go to the
test's directory (and, with ORCH_UI_DOCS_SHOTS=1, to docs/). Beside the killed job, a
second ended job is compared with it; a restarted 32-host job is drawn on its time line."""

from __future__ import annotations

import csv
import io
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.cluster import REPO_ROOT, Cluster, OrchRunner, orch_command
from tests.support import UiProcess, assert_no_job_left, chromium, job_id_of, status_json

pytestmark = pytest.mark.cluster

try:
    from playwright import sync_api as playwright_api
except ImportError:  # make setup installs it (the dev extra); chromium() says so
    playwright_api = None  # type: ignore[assignment]

# No torch in the ranks: each is up in a moment. Rank 0 prints the Trainer's dict lines,
# rank 1 `step=N loss=X`; rank 0 prints the hostile lines once, and every rank the
# marker's text once the file named by $MARKER exists.
RANKS = r"""
import os, sys, time
rank = int(os.environ["RANK"])
marker = os.environ["MARKER"]
out = sys.stdout
if rank == 0:
    print("<script>window.pwned=1</script><img src=x onerror='window.pwned=2'><b>bold</b>")
    print("\x1b[31mred\x1b[0m \x1b]0;a title\x07after the title \x07 bell")
    out.flush()
    out.buffer.write(b"not utf-8: \xff\xfe\xfd end\n")
    out.buffer.write(b"Z" * 1_000_000 + b"\n")
    out.buffer.flush()
said = False
i = 0
while True:
    loss = 2.0 - 0.01 * i
    if rank == 0:  # as the Trainer does: a tqdm bar, and its logs printed through it
        out.write("\rtrain %d/1000 [%s]" % (i, "#" * (i % 20)))
        out.flush()
        time.sleep(0.1)
        print("\r{'loss': %.4f, 'grad_norm': 1.5, 'learning_rate': 5e-05, 'epoch': %.2f}" % (loss, i / 10))
    else:
        print("step=%d loss=%.4f lr=0.001" % (i, loss))
        time.sleep(0.1)
    if not said and os.path.exists(marker):
        print("marker %s at %.3f" % (open(marker).read(), time.time()))  # the hosts' clock is ours
        said = True
    out.flush()
    i += 1
    time.sleep(0.1)
"""
# A stand-in nvidia-smi on node2 (its PATH only): one GPU at 55%, held by its ranks
# (as tests/integration/test_top.py has it).
FAKE_SMI = """\
#!/bin/sh
case "$1" in
  --query-gpu=*) echo "0, GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0, 55, 20480, 81559" ;;
  --query-compute-apps=*)
    for f in logs/rank-*.pid; do
      read -r pid rest < "$f"
      echo "$pid, GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0, 20470"
    done ;;
esac
"""
HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
APPEAR_S = 2.0  # the bound: a job, and a line, on the page within 2 s


def fetch(url: str, method: str = "GET", **headers: str) -> tuple[int, bytes]:
    request = urllib.request.Request(url, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read()


@pytest.fixture
def ui(orch: OrchRunner, inventory: Path) -> Iterator[UiProcess]:
    started = UiProcess(orch, inventory)
    try:
        yield started
    finally:
        code, err = started.stop()
        assert (code, "Traceback" in err) == (130, False), err


def test_the_page_shows_a_job_live_with_its_curves_and_kills_it(
    cluster: Cluster, orch: OrchRunner, ui: UiProcess, tmp_path: Path
) -> None:
    browser_path = chromium()
    work = tmp_path / "work"
    work.mkdir()
    (work / "ranks.py").write_text(RANKS)
    marker = tmp_path / "marker"  # the hosts see this machine's /tmp
    job = tmp_path / "train.yaml"
    job.write_text(
        yaml.safe_dump(
            {
                "name": "train",
                "workdir": "work",
                "script": "ranks.py",
                "nodes": 2,
                "env": {"MARKER": str(marker)},
                "warm": False,
            }
        )
    )
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "nvidia-smi").write_text(FAKE_SMI)
    (fake_bin / "nvidia-smi").chmod(0o755)
    inventory = cluster.write_inventory(
        tmp_path / "two.yaml", hosts=[1, 2], node2={"env": {"PATH": f"{fake_bin}:{HOST_PATH}"}}
    )
    with playwright_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=browser_path)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(ui.url)
            page.wait_for_selector("#jobs")

            submit = subprocess.Popen(  # in its directory, as a user types it
                [*orch_command(), "submit", "-d", job.name, "-i", inventory.name],
                cwd=tmp_path,
                env=orch.controller.env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            assert submit.stdout is not None
            job_id = job_id_of(submit.stdout.readline())
            submitted = time.monotonic()
            page.wait_for_selector(f'#jobs tr[data-job="{job_id}"]', timeout=APPEAR_S * 1000)
            appeared = time.monotonic() - submitted
            _out, err = submit.communicate(timeout=90)
            assert submit.returncode == 0, err
            assert appeared <= APPEAR_S
            try:
                page.wait_for_selector(
                    f'#jobs tr[data-job="{job_id}"] [data-state="running"]', timeout=20_000
                )
                page.screenshot(path=tmp_path / "ui-jobs.png", full_page=True)
                page.click(f'#jobs tr[data-job="{job_id}"] a')
                page.wait_for_selector("#log .line", timeout=30_000)

                cue = uuid.uuid4().hex
                marker.write_text(cue)
                said = page.locator(f'#log .line:has-text("marker {cue}")').first
                said.wait_for(timeout=10_000)
                seen = time.time()
                printed = float((said.text_content() or "").rsplit(" at ", 1)[1])
                assert seen - printed <= APPEAR_S, "from the rank's print to the page"

                # rank 0's bar, condensed as a terminal shows it, while it moves
                bar = page.locator('#bars .bar:has-text("train ")')
                bar.wait_for(timeout=10_000)
                assert (bar.text_content() or "").startswith("[node1 r0]train ")
                assert_loss_curves_of_both_ranks(page, job_id)
                assert_hostile_lines_are_text(page)
                assert_refused_without_the_token(ui, job_id)
                # Each rank's row, from orch top's samples, with how long since it printed.
                page.wait_for_selector('#ranks tr[data-rank="1"]', timeout=30_000)
                assert "ago" in (page.locator('#ranks tr[data-rank="0"]').text_content() or "")
                page.wait_for_selector('#ranks tr[data-rank="0"] td:has-text("%")', timeout=30_000)
                bar.wait_for(timeout=10_000)
                # The attempt on its time line: each node a span, running.
                for host in ("node1", "node2"):
                    page.wait_for_selector(
                        f'#timeline g.span[data-attempt="0"][data-host="{host}"]'
                        '[data-state="running"]',
                        timeout=10_000,
                    )
                page.screenshot(path=tmp_path / "ui-job.png", full_page=True)

                # Every rank's stack, grouped, as orch stack prints it.
                page.click("#stack")
                taken = page.locator("#stack-output")
                taken.wait_for(state="visible", timeout=60_000)
                page.wait_for_function(
                    "() => /ranks? +node1 r0/.test(document.querySelector('#stack-output')"
                    ".textContent)",
                    timeout=60_000,
                )
                assert "ranks.py" in (taken.text_content() or "")

                page.once("dialog", lambda dialog: dialog.accept())
                page.click("#kill")
                page.wait_for_selector('#job-head [data-state="killed"]', timeout=60_000)
            finally:
                orch("kill", job_id, timeout=60)
            assert status_json(orch, job_id)["state"] == "killed"
            assert_no_job_left(cluster, [1, 2])
            page.wait_for_selector('#timeline g.span[data-host="node2"][data-state="killed"]')

            # A second ended job beside it: the filters, then both on one chart, and CSV.
            baseline = record_an_ended_job(orch.controller.state_dir)
            page.goto(ui.url + "#/")
            page.wait_for_selector(f'#jobs tr[data-job="{baseline}"]', timeout=10_000)
            assert_the_filters_find_each_job(page, job_id, baseline)
            assert_two_ended_jobs_compare_and_export(page, [job_id, baseline])
            page.screenshot(path=tmp_path / "ui-compare.png", full_page=True)

            page.goto(ui.url + "#/hosts")
            page.wait_for_selector("#units", timeout=30_000)
            page.wait_for_selector("#chart-gpu canvas", timeout=30_000)  # node2's GPU
            page.screenshot(path=tmp_path / "ui-hosts.png", full_page=True)
            assert errors == []
        finally:
            browser.close()
    if os.environ.get("ORCH_UI_DOCS_SHOTS"):
        for name in ("ui-jobs.png", "ui-job.png", "ui-hosts.png", "ui-compare.png"):
            shutil.copy(tmp_path / name, REPO_ROOT / "docs" / name)


def assert_loss_curves_of_both_ranks(page: playwright_api.Page, job_id: str) -> None:
    """Rank 0's dict lines and rank 1's `loss=` lines both give loss points, drawn."""
    page.wait_for_function(
        "() => { const i = document.querySelector('#curve-info');"
        " return i && i.dataset.metric === 'loss' && Number(i.dataset.points) >= 10; }",
        timeout=20_000,
    )
    assert page.locator("#chart canvas").count() >= 1
    points = page.evaluate(
        "async (job) => { const t = new URLSearchParams(location.search).get('token');"
        " const r = await fetch(`/api/job/${job}/curves?token=${t}`); return (await r.json()).points; }",
        job_id,
    )
    loss_ranks = {p[0] for p in points if p[1] == "loss"}
    assert loss_ranks == {0, 1}
    assert any(p[1] == "learning_rate" and p[0] == 0 for p in points), "the dict's other pairs"
    steps = sorted(p[2] for p in points if p[1] == "loss" and p[0] == 1)
    assert steps[:3] == [0, 1, 2], "rank 1's own step=N"


def record_an_ended_job(home: Path) -> str:
    """A job of two nodes that succeeded a minute ago, in a controller's records, whose
    ranks printed `step=N loss=X` 20 times each (its log copy; no host holds it)."""
    from orchestrator.models.inventory import Host
    from orchestrator.models.states import JobState
    from orchestrator.records.db import JobDB, JobRecord, NodeRecord
    from orchestrator.records.logmirror import LogMirror

    job_id = "baseline-0ld0ne"
    nodes = [
        NodeRecord(Host(f"node{i + 1}", "127.0.0.2", port=9), i, i, 1, "d", JobState.SUCCEEDED, 0)
        for i in range(2)
    ]
    record = JobRecord(job_id, "baseline", JobState.SUCCEEDED, "127.0.0.2", 29500, {}, nodes)
    record.created = record.started = time.time() - 120
    record.ended, record.exit_code = time.time() - 60, 0
    JobDB(home).add(record)
    mirror = LogMirror(home / "logs", job_id)
    for node in nodes:
        text = "".join(f"step={s} loss={3.0 - s / 10:.2f}\n" for s in range(20))
        mirror.write(node.host.name, str(node.first_rank), 0, text.encode())
    mirror.close()
    return job_id


def shown_jobs(page: playwright_api.Page) -> list[str]:
    return page.eval_on_selector_all("#jobs tbody tr", "rows => rows.map(r => r.dataset.job)")


def assert_the_filters_find_each_job(page: playwright_api.Page, killed: str, ended: str) -> None:
    """By state, by name, by id, and both at once; the rows change as the filter does."""
    for state, text, expected in (
        ("killed", "", [killed]),
        ("succeeded", "", [ended]),
        ("all", "basel", [ended]),
        ("all", killed[-6:], [killed]),  # a job's id
        ("succeeded", "train", []),
        ("all", "", sorted([killed, ended])),
    ):
        page.select_option("#state-filter", state)
        page.fill("#name-filter", text)
        page.wait_for_function(
            "want => [...document.querySelectorAll('#jobs tbody tr')]"
            ".map(r => r.dataset.job).sort().join() === want",
            arg=",".join(sorted(expected)),
            timeout=5_000,
        )
        assert sorted(shown_jobs(page)) == sorted(expected), (state, text)


def assert_two_ended_jobs_compare_and_export(page: playwright_api.Page, ids: list[str]) -> None:
    """Both jobs' loss curves on one chart, and the CSV of both."""
    for job_id in ids:
        page.check(f'input[data-compare="{job_id}"]')
    page.click("text=compare the checked jobs' curves")
    page.wait_for_function(
        "() => { const c = document.querySelector('#compare-chart');"
        " return c && c.dataset.metric === 'loss' && c.dataset.drawn"
        " && c.dataset.drawn.split(',').every(n => Number(n) >= 10); }",
        timeout=10_000,
    )
    labels = page.eval_on_selector_all(
        "#compare-chart .u-legend .u-series .u-label", "ls => ls.map(l => l.textContent)"
    )
    assert sorted(labels[1:]) == sorted(ids), "one curve per job"
    with page.expect_download() as download:
        page.click("#compare-csv")
    path = download.value.path()
    rows = list(csv.DictReader(io.StringIO(Path(path).read_text())))
    assert list(rows[0]) == ["job", "host", "rank", "attempt", "metric", "step", "time", "value"]
    loss = [r for r in rows if r["metric"] == "loss"]
    assert {r["job"] for r in loss} == set(ids)
    ended = [r for r in loss if r["job"] == ids[1]]
    assert len(ended) == 40 and {r["rank"] for r in ended} == {"0", "1"}
    assert ("0", "19", "1.1") in {(r["rank"], r["step"], r["value"]) for r in ended}


def assert_hostile_lines_are_text(page: playwright_api.Page) -> None:
    script = page.locator('#log .line:has-text("window.pwned=1")')
    script.wait_for(timeout=10_000)
    text = script.text_content() or ""
    assert "<script>window.pwned=1</script><img src=x onerror='window.pwned=2'><b>bold</b>" in text
    assert page.evaluate("typeof window.pwned") == "undefined"
    assert page.locator("#log img, #log script, #log b").count() == 0
    coloured = page.locator('#log .line:has-text("after the title")').text_content() or ""
    assert "red after the title" in coloured and "\x1b" not in coloured
    assert "\u2407 bell" in coloured, "a BEL shows as its symbol"
    broken = page.locator('#log .line:has-text("not utf-8")').text_content() or ""
    assert "not utf-8: \ufffd\ufffd\ufffd end" in broken
    long = page.locator('#log .line:has-text("more characters")').text_content() or ""
    assert long.startswith("[node1 r0] ZZZZ") and "more characters]" in long
    assert len(long) < 10_000


def assert_refused_without_the_token(ui: UiProcess, job_id: str) -> None:
    for path in (
        "/",
        "/api/jobs",
        "/static/app.js",
        f"/api/job/{job_id}/curves.csv",
        f"/api/job/{job_id}/timeline",
        "/api/curves.csv",
    ):
        assert fetch(ui.base + path) == (403, b"forbidden\n"), path
        assert fetch(f"{ui.base}{path}?token=not-{ui.token}")[0] == 403, path
    kill = f"{ui.base}/api/action/kill/{job_id}"
    assert fetch(f"{kill}?token={ui.token}", "POST")[0] == 403, "the token in a header only"
    foreign = fetch(kill, "POST", **{"X-Orch-Token": ui.token, "Origin": "http://evil.example"})
    assert foreign[0] == 403, "another origin"
    assert fetch(f"{ui.base}/?token={ui.token}")[0] == 200
    assert fetch(f"{ui.base}/api/curves.csv?token={ui.token}")[0] == 400, "no jobs named"
    assert fetch(f"{ui.base}/api/curves.csv?ids=no-such-job&token={ui.token}")[0] == 404


def test_a_port_in_use_is_an_error_with_a_hint(orch: OrchRunner) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused = orch("ui", "--no-browser", "--port", str(port), timeout=30)
    assert refused.returncode == 2
    assert refused.stdout == ""
    assert f"error: cannot listen on 127.0.0.1:{port}" in refused.stderr
    assert "hint: pick another port: orch ui --port N" in refused.stderr


HOSTS, RANKS_PER_HOST, LINES_PER_RANK = 32, 8, 300


def record_a_job_of_lost_hosts(home: Path) -> str:
    """A running job of 32 hosts x 8 ranks in a controller's records, with 300 lines of
    each rank in its log copy, whose hosts all refuse connections (127.0.0.2, port 9:
    loopback, where nothing listens): a page at scale, every host lost."""
    from orchestrator.models.inventory import Host
    from orchestrator.models.states import JobState
    from orchestrator.records.db import JobDB, JobRecord, NodeRecord
    from orchestrator.records.logmirror import LogMirror

    job_id = "wide-5ca1e0"
    nodes = [
        NodeRecord(
            Host(f"host{i:02d}", "127.0.0.2", port=9),
            i,
            i * RANKS_PER_HOST,
            RANKS_PER_HOST,
            f"~/.orch/jobs/{job_id}/host{i:02d}",
            JobState.RUNNING,
        )
        for i in range(HOSTS)
    ]
    spec = {"path": str(home / "wide.yaml"), "entry": "train.py", "args": [], "restarts": 0}
    started = time.time() - 600
    record = JobRecord(job_id, "wide", JobState.RUNNING, "127.0.0.2", 29500, spec, nodes)
    record.created = record.started = started
    JobDB(home).add(record)
    mirror = LogMirror(home / "logs", job_id)
    for node in nodes:
        for rank in node.ranks:
            text = "".join(
                f"step={s} loss={2.0 - s / LINES_PER_RANK + rank / 1000:.4f} rank {rank}\n"
                for s in range(LINES_PER_RANK)
            )
            mirror.write(node.host.name, str(rank), 0, text.encode())
    mirror.close()
    return job_id


LOST_WHY = "host07 stopped answering <img src=x onerror='window.pwned=3'>"


def record_a_restarted_job(home: Path) -> str:
    """A job of 32 hosts in a controller's records that ran twice: its first attempt
    (T to T+40 s) lost host07 and orch stopped the rest; the second ran on the spare
    host32 in host07's place (node rank 7) from T+50 s, and failed on host12 at T+90 s.
    Each node's log copy says when its first and last pieces came."""
    import struct

    from orchestrator.models.inventory import Host
    from orchestrator.models.states import JobState
    from orchestrator.records.db import JobDB, JobRecord, NodeRecord
    from orchestrator.records.logmirror import LogMirror

    job_id = "wide-2ndg0"
    t0 = time.time() - 300
    first = [
        {
            "host": f"host{i:02d}",
            "node_rank": i,
            "job_dir": "d",
            "state": "lost" if i == 7 else "killed",
            "exit_code": None if i == 7 else -15,
            "error": LOST_WHY if i == 7 else None,
        }
        for i in range(HOSTS)
    ]
    second = [f"host{i:02d}" if i != 7 else "host32" for i in range(HOSTS)]
    nodes = [
        NodeRecord(
            Host(name, "127.0.0.2", port=9),
            i,
            i,
            1,
            "d",
            JobState.FAILED if name == "host12" else JobState.KILLED,
            1 if name == "host12" else -15,
        )
        for i, name in enumerate(second)
    ]
    spec = {"restarts": 3, "attempt": 1, "attempts": [{"attempt": 0, "nodes": first}]}
    record = JobRecord(job_id, "wide2", JobState.FAILED, "127.0.0.2", 29500, spec, nodes)
    record.created = record.started = t0
    record.ended, record.exit_code = t0 + 92, 1
    JobDB(home).add(record)
    for attempt, hosts, start, end in ((0, [n["host"] for n in first], 1, 40), (1, second, 50, 90)):
        mirror = LogMirror(home / "logs", job_id, attempt)
        for name in hosts:
            mirror.write(str(name), "node", 0, b"started\n")
            mirror.write(str(name), "node", 8, b"ended\n")
        mirror.close()
        for name in hosts:  # when they came: the times file's records, rewritten
            last = 40 if name == "host07" else end
            (mirror.dir / str(name) / "node.times").write_bytes(
                struct.pack("<Qd", 8, t0 + start) + struct.pack("<Qd", 14, t0 + last)
            )
    return job_id


def test_the_page_stays_usable_at_32_hosts_and_256_ranks_every_host_lost(
    orch: OrchRunner, tmp_path: Path
) -> None:
    browser_path = chromium()
    home = orch.controller.state_dir
    job_id = record_a_job_of_lost_hosts(home)
    ranks = HOSTS * RANKS_PER_HOST
    inventory = tmp_path / "none.yaml"
    inventory.write_text("hosts:\n  - {name: here, address: localhost}\n")
    ui = UiProcess(orch, inventory)
    try:
        with playwright_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=browser_path)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                errors: list[str] = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                opened = time.monotonic()
                page.goto(f"{ui.url}#/job/{job_id}")
                # Every rank's last lines (the mirror: no host answers), and every point.
                page.wait_for_selector('#log .line:has-text("rank 255")', timeout=30_000)
                page.wait_for_function(
                    f"() => Number(document.querySelector('#curve-info')?.dataset.points) === {ranks * LINES_PER_RANK}",
                    timeout=30_000,
                )
                loaded = time.monotonic() - opened
                assert page.locator("#log .line").count() <= 2000, "the document holds 2,000"
                # Every host lost: the follow stopped, said so, and the page goes on.
                page.wait_for_selector(
                    "#action-message:has-text('following stopped')", timeout=60_000
                )
                # the last lines of each rank, 8,000 in all (31 of each of 256), and orch's
                # notices: a host's that could not be read, each, and the follow's end
                shown = page.locator("#log-count").text_content() or ""
                assert shown == f"{31 * ranks + HOSTS + 1} lines"
                # every rank, every host's own lines, and "every rank"
                assert page.locator("#rank-filter option").count() == ranks + HOSTS + 1
                # The page answers at once: a rank filter and a search, each under a second.
                for act, check in (
                    (
                        lambda: page.select_option("#rank-filter", "r200"),
                        "[...document.querySelectorAll('#log .line')].every(l => l.textContent.startsWith('[host25 r200] '))",
                    ),
                    (
                        lambda: page.fill("#log-search", "step=299 "),
                        "document.querySelectorAll('#log .line').length === 1",
                    ),
                ):
                    started = time.monotonic()
                    act()
                    page.wait_for_function(f"() => {check}", timeout=5_000)
                    assert time.monotonic() - started < 1.0
                page.select_option("#curve-mode", "ranks")
                page.wait_for_selector("#curve-info:has-text('the first 64 drawn')", timeout=5_000)
                # Every host lost, shown as lost.
                page.wait_for_function(
                    f"() => document.querySelectorAll('#nodes [data-state=\"lost\"]').length === {HOSTS}",
                    timeout=60_000,
                )
                page.screenshot(path=tmp_path / "ui-wide.png", full_page=True)

                # A restarted job of 32 hosts on its time line: host07 lost, the spare
                # host32 in its place, the second attempt failed on host12.
                restarted = record_a_restarted_job(home)
                page.goto(f"{ui.url}#/job/{restarted}")
                spans = "#timeline g.span"
                page.wait_for_function(
                    f"() => document.querySelectorAll('{spans}').length === {2 * HOSTS}",
                    timeout=10_000,
                )
                spare = page.locator(f'{spans}[data-spare-for="host07"]')
                assert spare.get_attribute("data-host") == "host32"
                assert spare.get_attribute("data-attempt") == "1"
                assert "took host07's place" in (spare.locator("title").text_content() or "")
                lost = page.locator(f'{spans}[data-attempt="0"][data-host="host07"]')
                assert lost.get_attribute("data-state") == "lost"
                assert lost.locator("path.failure").count() == 1
                # what the records say, as text: the lost node's error is no markup
                assert LOST_WHY in (lost.locator("title").text_content() or "")
                assert page.locator("#timeline img").count() == 0
                assert page.evaluate("typeof window.pwned") == "undefined"
                failed = page.locator(f'{spans}[data-attempt="1"][data-state="failed"]')
                assert failed.get_attribute("data-host") == "host12"
                assert page.locator(f"{spans} path.failure").count() == 2
                rows = page.eval_on_selector_all(
                    "#timeline text.host", "ts => ts.map(t => t.textContent)"
                )
                hosts = [f"host{i:02d}" for i in range(HOSTS)] + ["host32 ← host07"]
                assert rows == hosts, "a row per host; the spare's says whose place it took"
                drawn = page.locator("#timeline svg").bounding_box()
                assert drawn is not None and drawn["height"] < 600, "32 hosts in 600 pixels"
                page.locator("#timeline").screenshot(path=tmp_path / "ui-timeline.png")
                assert errors == []
                print(f"256 ranks: the page had every line and point after {loaded:.1f} s")
            finally:
                browser.close()
    finally:
        code, err = ui.stop()
    assert code == 130, err
    assert "Traceback" not in err
    if os.environ.get("ORCH_UI_DOCS_SHOTS"):
        shutil.copy(tmp_path / "ui-timeline.png", REPO_ROOT / "docs" / "ui-timeline.png")
