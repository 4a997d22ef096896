"""Warm starts: resubmitting an unchanged job, orch warm against orch cold and by hand.

For each host count, time from the command's start until every rank printed its first
line (the job imports torch, joins a gloo group, all-reduces once, prints), one rank
per host:

- orch warm:   `orch submit job.yaml` with a warm interpreter waiting on every host
               (left there by the run before; code push included, nothing changed);
- orch warm, one changed file: the same after editing one file the script imports;
- orch cold:   `orch submit --cold job.yaml`;
- first:       `orch submit job.yaml` on hosts with no warm interpreter (`orch warm
               --stop` first), as a job's first submit: each node starts one and its
               ranks are forked from it once it imported torch;
- by hand:     one `ssh host 'cd dir && python -m torch.distributed.run ...'` per host,
               in parallel (OpenSSH), the code already on the hosts, with no warm
               interpreter on them (`orch warm --stop` first: they hold memory).

Runs alternate and the median of each is reported. Then the memory of two ranks on one
host (the sum of their PSS, read from /proc/PID/smaps_rollup while they hold), started
warm and cold, and the warm interpreter's own. Needs root (the namespace test cluster).

    .venv/bin/python bench/warm.py [--hosts 1 8] [--repeat 3] [--transformers]

With --transformers the script also builds a small Hugging Face transformers model
(`--hf`), the job preloads `[torch, transformers]`, and the figures go to their own
section (transformers must be installed: `make bench-deps`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import place_file
from bench.launch import baseline_commands, time_to_all_ranks
from bench.report import machine, median, write_section
from tests.cluster import Cluster, Controller, orch_command

JOB_DIR = Path(__file__).resolve().parent / "jobs" / "warm_line"
SCRIPT = "warm_line.py"
BASELINE_DIR = "/root/bench-warm"


def warm_ready(cluster: Cluster, n: int) -> bool:
    for host in cluster.hosts[:n]:
        folder = host.home / ".orch" / "warm"
        states = []
        for path in folder.glob("*/*.json") if folder.exists() else []:
            with contextlib.suppress(ValueError):  # being written
                states.append(json.loads(path.read_text()).get("state"))
        if "ready" not in states:
            return False
    return True


def wait_warm(cluster: Cluster, n: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not warm_ready(cluster, n):
        if time.monotonic() > deadline:
            raise RuntimeError("no warm interpreter became ready")
        time.sleep(0.2)


def ranks_pss_kb(cluster: Cluster, job_id: str, host_index: int, ranks: int) -> int:
    """The sum of the PSS of a job's ranks on one host, once all of them run."""
    host = cluster.hosts[host_index]
    logs = host.home / ".orch" / "jobs" / job_id / host.name / "logs"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        pids = [p.read_text().split()[0] for p in logs.glob("rank-*.pid")] if logs.exists() else []
        ready = sum("ready rank" in p.read_text() for p in logs.glob("rank-*.log"))
        if len(pids) == ranks and ready == ranks:
            return sum(pss_kb(cluster, host_index, int(pid)) for pid in pids)
        time.sleep(0.2)
    raise RuntimeError("the ranks did not start")


def pss_kb(cluster: Cluster, host_index: int, pid: int) -> int:
    out = cluster.exec_on(host_index + 1, ["cat", f"/proc/{pid}/smaps_rollup"]).stdout
    return next(int(line.split()[1]) for line in out.splitlines() if line.startswith("Pss:"))


def warm_pss_kb(cluster: Cluster, host_index: int) -> int:
    folder = cluster.hosts[host_index].home / ".orch" / "warm"
    return sum(
        pss_kb(cluster, host_index, int(json.loads(p.read_text())["pid"]))
        for p in folder.glob("*/*.json")
    )


def memory(cluster: Cluster, controller: Controller, workdir: Path) -> dict[str, int]:
    """Two ranks on one host, started warm and cold: their PSS (kB)."""
    inventory = cluster.write_inventory(
        controller.home / "inv-mem.yaml", hosts=[cluster.hosts[0].name], node1={"slots": 2}
    )
    job = controller.home / "mem.yaml"
    job.write_text(
        f"name: mem\nworkdir: {workdir}\nscript: {SCRIPT}\nnodes: 1\nargs: [--hold, '6']\n"
    )
    env = controller.env()
    found = {}
    for mode in ("cold", "warm"):
        if mode == "warm":  # this job's own (two ranks: another key than one rank's)
            for verb in (["--stop"], [str(job)]):
                warm = [*orch_command(), "warm", *verb, "-i", str(inventory)]
                subprocess.run(warm, env=env, check=True, capture_output=True)
            wait_warm(cluster, 1)
        extra = ["--cold"] if mode == "cold" else []
        run = subprocess.run(
            [*orch_command(), "submit", "-d", *extra, str(job), "-i", str(inventory)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        job_id = run.stdout.split()[1]
        if mode == "warm" and "cold start" in run.stderr:
            raise RuntimeError(f"the warm run started cold: {run.stderr}")
        found[mode] = ranks_pss_kb(cluster, job_id, 0, 2)
        subprocess.run([*orch_command(), "logs", job_id, "-f"], env=env, capture_output=True)
    found["warm interpreter"] = warm_pss_kb(cluster, 0)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hosts", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--transformers", action="store_true", help="the script builds a transformers model"
    )
    args = parser.parse_args()
    hf = args.transformers
    # transformers imports its model classes lazily: the model's module is what to preload.
    preload = "[torch, transformers.models.bert.modeling_bert]"
    job_keys = f"preload: {preload}\nargs: [--hf]\n" if hf else ""

    rows = []
    with Cluster(max(args.hosts)) as cluster:
        controller = cluster.new_controller()
        env = controller.env()
        workdir = controller.home / "warm_line"
        shutil.copytree(JOB_DIR, workdir)
        for name in (SCRIPT, "helper.py"):
            place_file(cluster, controller, JOB_DIR / name, BASELINE_DIR)
        job = controller.home / "job.yaml"
        port = 29800
        for n in args.hosts:
            inventory = cluster.write_inventory(
                controller.home / f"inv{n}.yaml", hosts=[h.name for h in cluster.hosts[:n]]
            )
            job.write_text(
                f"name: warm\nworkdir: {workdir}\nscript: {SCRIPT}\nnodes: {n}\n{job_keys}"
            )
            submit = [*orch_command(), "submit", str(job), "-i", str(inventory)]
            time_to_all_ranks([submit], n, env=env)  # leaves the warm interpreters
            wait_warm(cluster, n)
            runs: dict[str, list[float]] = {
                "warm": [],
                "changed": [],
                "cold": [],
                "hand": [],
                "first": [],
                "warm_cpu": [],
                "cold_cpu": [],
            }
            stop = [*orch_command(), "warm", "--stop", "-i", str(inventory)]
            ahead = [*orch_command(), "warm"]
            for r in range(args.repeat):
                port += 1
                script = f"{SCRIPT} --hf" if hf else SCRIPT
                by_hand = baseline_commands(cluster, controller, n, port, BASELINE_DIR, script)
                # By hand with no warm interpreter holding the hosts' memory.
                subprocess.run(stop, env=env, check=True, capture_output=True)
                runs["hand"].append(time_to_all_ranks(by_hand, n)[0])
                took, used = time_to_all_ranks([[*submit, "--cold"]], n, env=env)
                runs["cold"].append(took)
                runs["cold_cpu"].append(used.cpu_s)
                # `--cold` leaves none: the job's warm interpreters, as a submit leaves them.
                warm = [*ahead, str(job), "-i", str(inventory)]
                subprocess.run(warm, env=env, check=True, capture_output=True)
                wait_warm(cluster, n)
                took, used = time_to_all_ranks([submit], n, env=env)
                runs["warm"].append(took)
                runs["warm_cpu"].append(used.cpu_s)
                (workdir / "helper.py").write_text(f"VALUE = 1  # edit {n}.{r}\n")
                runs["changed"].append(time_to_all_ranks([submit], n, env=env)[0])
                subprocess.run(stop, env=env, check=True, capture_output=True)
                runs["first"].append(time_to_all_ranks([submit], n, env=env)[0])
                wait_warm(cluster, n)
            row = {k: median(v) for k, v in runs.items()}
            rows.append((n, row, runs))
            print(n, {k: round(v, 2) for k, v in row.items()}, runs, flush=True)
        mem = {} if hf else memory(cluster, controller, workdir)
        print("memory", mem, flush=True)

    table = [
        "| hosts | orch warm (s) | warm, one file changed (s) | orch cold (s) "
        "| first submit (s) | by hand (s) "
        "| warm / by hand | changed / warm | cold / by hand | first / by hand "
        "| orch CPU warm, cold (s) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n, r, _ in rows:
        table.append(
            f"| {n} | {r['warm']:.2f} | {r['changed']:.2f} | {r['cold']:.2f} "
            f"| {r['first']:.2f} | {r['hand']:.2f} "
            f"| {r['warm'] / r['hand']:.2f}x | {r['changed'] / r['warm']:.2f}x "
            f"| {r['cold'] / r['hand']:.2f}x | {r['first'] / r['hand']:.2f}x "
            f"| {r['warm_cpu']:.1f}, {r['cold_cpu']:.1f} |"
        )
    if hf:
        write_section("warm-transformers", transformers_body(args, table))
        print("\n".join(table))
        return
    body = "\n".join(
        [
            "## Warm starts: resubmitting a job",
            "",
            "Time from starting the command until every rank printed its first line; the job",
            "imports torch, joins a gloo group, all-reduces once and prints; one rank per",
            "host. orch warm: a warm interpreter waits on every host (left by the run before),",
            "code push included with nothing changed; changed: the same after editing one",
            "file the script imports; orch cold: `orch submit --cold`; by hand: one",
            "`ssh host 'cd dir && python -m torch.distributed.run ...'` per host in parallel,",
            "code already in place and no warm interpreter on the hosts (stopped first);",
            "first: a submit on hosts with no warm interpreter (stopped first), as a job's",
            "first submit: each node starts one and its ranks are forked from it once it",
            "imported torch; orch CPU: the `orch submit` command's CPU seconds, warm and cold.",
            f"Median of {args.repeat} alternating runs; {machine()}.",
            "Targets at 8 hosts: warm at most 0.5x by hand, one changed file within 10% of",
            "unchanged, cold at most 1.15x by hand, first at most cold.",
            "",
            *table,
            "",
            "Memory of two ranks on one host (the sum of their PSS while they run): "
            f"started cold {mem['cold'] / 1024:.0f} MB, forked warm {mem['warm'] / 1024:.0f} MB; "
            f"the warm interpreter itself {mem['warm interpreter'] / 1024:.0f} MB PSS.",
            "",
            f"Reproduce: `sudo .venv/bin/python bench/warm.py --hosts "
            f"{' '.join(map(str, args.hosts))} --repeat {args.repeat}`",
        ]
    )
    write_section("warm", body)
    print("\n".join(table))


def transformers_body(args: argparse.Namespace, table: list[str]) -> str:
    return "\n".join(
        [
            "## Warm starts with transformers: resubmitting a job that imports it",
            "",
            "As the warm-start section, but the script also builds a one-layer BERT from",
            "Hugging Face transformers 4.57 before joining the group (no download), and the",
            "job preloads `[torch, transformers.models.bert.modeling_bert]`; by hand runs the",
            "same script. transformers imports its model classes lazily, on first use: with",
            "`preload: [torch, transformers]` alone each warm rank still imported the BERT",
            "module (1.2 s of CPU each), and warm was 0.33x by hand at 8 hosts (7.47 s",
            "against 22.40 s, the run before this one). Median of",
            f"{args.repeat} alternating runs; {machine()}. Target at 8 hosts: warm at most",
            "0.3x by hand.",
            "",
            *table,
            "",
            f"Reproduce: `make bench-deps && sudo .venv/bin/python bench/warm.py --hosts "
            f"{' '.join(map(str, args.hosts))} --repeat {args.repeat} --transformers`",
        ]
    )


if __name__ == "__main__":
    main()
