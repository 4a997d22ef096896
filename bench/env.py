"""Environments (docs/ENVIRONMENTS.md): what `environment:` costs, against doing it by hand.

On N hosts (default 3), with two small wheels made here (the hosts reach no index), a
job of one rank per host that prints a line and ends (launcher python, no torch), each
command timed from its start to its exit:

- first build, orch:    `orch submit` of the job with `environment:` and `wheels:` on
                        hosts that have no environment (the code push, the wheels'
                        copy, the build and the run, all included);
- first build, by hand: per host in parallel, one `ssh` that receives the wheels (a tar
                        on stdin), makes a venv (`python -m venv --system-site-packages`),
                        `pip install --no-index --find-links` and runs the script;
- unchanged resubmit:   `orch submit` of the job with `environment:` (built already),
                        against the same job without it: the difference is what
                        checking the environment adds;
- edit-resubmit:        the same after editing the script each time.

Runs alternate; the median of each is reported. Needs root (the namespace test cluster).
`--torch`: the first build only, of an environment of torch's CPU wheel and numpy (with
their dependencies, about 210 MB of wheels the controller's pip downloads once) over a
bare python (the hosts' venv's base, which has no torch), on `--hosts` hosts (8: the
issue's figure, at most 0.7x by hand): orch where the hosts have uv (in `~/.local/bin`,
where its installer puts it), orch where they have only pip, and by hand with pip; the
job imports torch. Each host's environment takes about 0.8 GB; each is removed after
its run, and so is uv's cache, so that every build is a first one.

    .venv/bin/python bench/env.py [--hosts 3] [--repeat 5]
    .venv/bin/python bench/env.py --torch [--hosts 8] [--repeat 3]
"""

from __future__ import annotations

import argparse
import io
import shutil
import subprocess
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ssh_argv
from bench.report import machine, median, write_section
from tests.cluster import Cluster, orch_command, repo_python

SCRIPT = "import socket\nprint('up on', socket.gethostname(), flush=True)\n"
PACKAGES = ("orchbenchone", "orchbenchtwo")
TORCH_SCRIPT = (
    "import socket, torch\nprint('up on', socket.gethostname(), torch.__version__, flush=True)\n"
)
TORCH_PACKAGES = ("torch==2.13.0", "numpy")
BASELINE_DIR = "/root/bench-env"


def make_wheels(root: Path, out: Path) -> None:
    for name in PACKAGES:
        src = root / f"src-{name}"
        (src / name).mkdir(parents=True)
        (src / name / "__init__.py").write_text("VALUE = 1\n")
        (src / "pyproject.toml").write_text(
            f'[project]\nname = "{name}"\nversion = "1.0"\n'
            '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        )
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--no-build-isolation",
                "-q",
                "-w",
                str(out),
                str(src),
            ],
            check=True,
        )


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stdout}\n{done.stderr}")
    return time.perf_counter() - start


def by_hand(
    cluster: Cluster,
    controller: object,
    n: int,
    wheels: Path,
    script: Path,
    python: str | None = None,
    packages: tuple[str, ...] = PACKAGES,
) -> float:
    """Per host at once: one ssh that unpacks the wheels and the script it is sent,
    builds a venv over the hosts' python, installs with no index and runs the script."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(wheels, arcname="wheels")
        tar.add(script, arcname="job.py")
    data = buf.getvalue()
    python = python or str(repo_python())
    command = (
        f"rm -rf {BASELINE_DIR} && mkdir -p {BASELINE_DIR} && cd {BASELINE_DIR} && tar x && "
        f"{python} -m venv --system-site-packages venv && "
        "venv/bin/python -m pip install -q --no-index --find-links wheels "
        f"{' '.join(packages)} && venv/bin/python job.py"
    )
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            ssh_argv(cluster, controller, host.address, command),  # type: ignore[arg-type]
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for host in cluster.hosts[:n]
    ]
    # Every host's copy and build at once, as a parallel ssh would: each one's stdin is
    # written by a thread of its own (one communicate after another would run the hosts
    # one after another).
    with ThreadPoolExecutor(len(procs)) as pool:
        outcomes = list(pool.map(lambda proc: proc.communicate(data), procs))
    for proc, (_, err) in zip(procs, outcomes, strict=True):
        if proc.returncode != 0:
            raise SystemExit(f"by hand failed: {err.decode()[-2000:]}")
    return time.perf_counter() - start


def torch_first_build(n: int, repeat: int) -> None:
    """`--torch`: the first build of torch's environment on n hosts, orch with uv, orch
    with pip and by hand with pip, alternating; the median of each."""
    bare = getattr(sys, "_base_executable", sys.executable)
    if subprocess.run([bare, "-c", "import torch"], capture_output=True).returncode == 0:
        raise SystemExit(f"{bare} has torch: the hosts need a python without it")
    uv = shutil.which("uv", path=str(Path(sys.executable).parent))
    if uv is None:
        raise SystemExit("no uv beside this python: make setup installs it (the dev extra)")
    runs: dict[str, list[float]] = {k: [] for k in ("uv", "pip", "hand")}
    with Cluster(n) as cluster:
        controller = cluster.new_controller()
        env = controller.env()
        work = controller.home / "envbench"
        wheels = work / "wheels"
        wheels.mkdir(parents=True)
        download = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:"]
        subprocess.run([*download, "-d", str(wheels), *TORCH_PACKAGES], check=True)
        size_mb = sum(p.stat().st_size for p in wheels.iterdir()) / 1e6
        (work / "job.py").write_text(TORCH_SCRIPT)
        hosts = cluster.hosts[:n]
        inventory = cluster.write_inventory(
            controller.home / "inv.yaml", hosts=[h.name for h in hosts], defaults={"python": bare}
        )
        job = controller.home / "torch.yaml"
        job.write_text(
            f"name: torchenv\nworkdir: {work}\nscript: job.py\nnodes: {n}\nlauncher: python\n"
            f"environment: [{', '.join(TORCH_PACKAGES)}]\nwheels: {wheels}\n"
        )
        plain = controller.home / "plain.yaml"
        (work / "up.py").write_text(SCRIPT)
        plain.write_text(
            f"name: plain\nworkdir: {work}\nscript: up.py\nnodes: {n}\nlauncher: python\n"
            "environment: [numpy]\nwheels: " + str(wheels) + "\n"
        )
        submit = [*orch_command(), "submit"]
        timed([*submit, str(plain), "-i", str(inventory)], env)  # agent and code there once

        def clean(with_uv: bool) -> None:
            for host in hosts:
                shutil.rmtree(host.home / ".orch" / "envs", ignore_errors=True)
                shutil.rmtree(host.home / ".cache" / "uv", ignore_errors=True)
                shutil.rmtree(host.home / BASELINE_DIR.removeprefix("/root/"), ignore_errors=True)
                link = host.home / ".local" / "bin" / "uv"
                link.unlink(missing_ok=True)
                if with_uv:
                    link.parent.mkdir(parents=True, exist_ok=True)
                    link.symlink_to(uv)

        try:
            for r in range(repeat):
                order = ["uv", "pip", "hand"] if r % 2 == 0 else ["hand", "pip", "uv"]
                for name in order:
                    clean(with_uv=name == "uv")
                    (work / "job.py").write_text(TORCH_SCRIPT + f"# round {r}\n")
                    time.sleep(2)
                    if name == "hand":
                        runs[name].append(
                            by_hand(
                                cluster,
                                controller,
                                n,
                                wheels,
                                work / "job.py",
                                bare,
                                TORCH_PACKAGES,
                            )
                        )
                    else:
                        runs[name].append(timed([*submit, str(job), "-i", str(inventory)], env))
                    print(name, f"{runs[name][-1]:.1f} s", flush=True)
        finally:
            clean(with_uv=False)
    m = {k: median(v) for k, v in runs.items()}
    each = "; ".join(f"{k} " + ", ".join(f"{x:.1f}" for x in v) for k, v in runs.items())
    body = f"""### The first build of torch's environment on {n} hosts

`.venv/bin/python bench/env.py --torch --hosts {n} --repeat {repeat}` ({machine()}):
an environment of `{", ".join(TORCH_PACKAGES)}` ({size_mb:.0f} MB of wheels with their
dependencies, no index) over a bare python, on hosts that have none; the job (one rank
a host, launcher python) imports torch and prints; each command to its exit, the median
of {repeat} alternating runs. By hand: per host at once, one `ssh` that receives the wheels
(a tar on stdin), makes a venv, `pip install --no-index --find-links` and runs the
script.

| {n} hosts | seconds | against by hand |
|---|---:|---:|
| orch, the hosts have uv (push, wheels' copy, build, run) | {m["uv"]:.1f} | {m["uv"] / m["hand"]:.2f}x |
| orch, the hosts have only pip | {m["pip"]:.1f} | {m["pip"] / m["hand"]:.2f}x |
| by hand with pip (ssh, tar of the wheels, venv, pip, run) | {m["hand"]:.1f} | 1.00x |

The runs (s): {each}.
"""
    print(body)
    write_section("env-torch", body)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hosts", type=int, default=None)
    parser.add_argument("--repeat", type=int, default=None)
    parser.add_argument("--torch", action="store_true", help="torch's first build only")
    args = parser.parse_args()
    if args.torch:
        torch_first_build(args.hosts or 8, args.repeat or 3)
        return
    n = args.hosts or 3
    args.repeat = args.repeat or 5
    runs: dict[str, list[float]] = {
        k: [] for k in ("orch", "hand", "same", "plain", "edit", "edit_plain")
    }
    with Cluster(n) as cluster:
        controller = cluster.new_controller()
        env = controller.env()
        work = controller.home / "envbench"
        (work / "wheels").mkdir(parents=True)
        make_wheels(controller.home, work / "wheels")
        (work / "job.py").write_text(SCRIPT)
        inventory = cluster.write_inventory(
            controller.home / "inv.yaml", hosts=[h.name for h in cluster.hosts[:n]]
        )
        common = f"workdir: {work}\nscript: job.py\nnodes: {n}\nlauncher: python\n"
        with_env = controller.home / "with_env.yaml"
        with_env.write_text(
            f"name: withenv\n{common}environment: [{', '.join(PACKAGES)}]\nwheels: {work}/wheels\n"
        )
        plain = controller.home / "plain.yaml"
        plain.write_text(f"name: plain\n{common}")
        submit = [*orch_command(), "submit"]
        timed([*submit, str(plain), "-i", str(inventory)], env)  # agent and code there once
        for r in range(args.repeat):
            for host in cluster.hosts[:n]:
                shutil.rmtree(host.home / ".orch" / "envs", ignore_errors=True)
            # No environment on the hosts at each round's start; pip's own cache on the
            # hosts is as warm for orch as for the hand-made venv.
            (work / "job.py").write_text(SCRIPT + f"# round {r}\n")
            runs["orch"].append(timed([*submit, str(with_env), "-i", str(inventory)], env))
            runs["hand"].append(by_hand(cluster, controller, n, work / "wheels", work / "job.py"))
            time.sleep(2)  # the hand-made venvs' last writes settle
            # Which of the pair goes first alternates: neither gains from the other.
            pair = [("same", with_env), ("plain", plain)]
            for name, job in pair if r % 2 == 0 else pair[::-1]:
                runs[name].append(timed([*submit, str(job), "-i", str(inventory)], env))
            pair = [("edit", with_env), ("edit_plain", plain)]
            for i, (name, job) in enumerate(pair if r % 2 == 0 else pair[::-1]):
                (work / "job.py").write_text(SCRIPT + f"# round {r}, edit {i}\n")
                runs[name].append(timed([*submit, str(job), "-i", str(inventory)], env))
    m = {k: median(v) for k, v in runs.items()}
    added_ms = (m["same"] - m["plain"]) * 1000
    body = f"""## Environments: `environment:` against a venv and pip by hand

`.venv/bin/python bench/env.py --hosts {n} --repeat {args.repeat}` ({machine()}; two small
wheels, one rank per host, launcher python; the median of {args.repeat} runs, each command
to its exit):

| {n} hosts | seconds |
|---|---|
| first build, orch (push, wheels' copy, build, run) | {m["orch"]:.2f} |
| first build, by hand (ssh, tar of the wheels, venv, pip, run) | {m["hand"]:.2f} |
| unchanged resubmit with `environment:` | {m["same"]:.2f} |
| the same job without it | {m["plain"]:.2f} |
| edit-resubmit with `environment:` | {m["edit"]:.2f} |
| edit-resubmit without it | {m["edit_plain"]:.2f} |

First build: orch takes {m["orch"] / m["hand"]:.2f}x the time by hand, its whole submit
included (by hand, `python -m venv` installs pip into each venv with ensurepip; orch makes
the venv without it and installs with the host python's own pip). An unchanged
resubmit with `environment:` takes {added_ms:.0f} ms more than without it, the {n} hosts
at once (it is checked in the code push's own round trip; the rest is the ranks'
python starting in the venv, over the host's site packages); an edit-resubmit takes
{m["edit"] / m["edit_plain"]:.2f}x the same without `environment:`. torch's CPU wheel on 8
hosts, the issue's figure, is not measured here (1 GB per host's environment).
"""
    print(body)
    write_section("env", body)


if __name__ == "__main__":
    main()
