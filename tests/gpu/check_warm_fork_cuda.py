"""Run by hand on a GPU host (no GPU in CI): a rank forked from a process that imported
torch, as a warm start forks it, against a fresh process (cold), on CUDA.

Checks: the parent never initialised CUDA; each forked rank can use CUDA after
`fresh_random_state`; CUDA's default generator is seeded per process in forked ranks
as in cold ones (two cold processes differ: then two forked ranks differ too); its CPU
draws differ from its sibling's; its thread count is what OMP_NUM_THREADS says. Also
says whether the forked ranks' CUDA seeds differ without the reseed (what CUDA's
seed depends on). Prints one JSON line per check and exits 1 on a mismatch.

    python tests/gpu/check_warm_fork_cuda.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

PROBE = """
import json, torch
x = torch.rand(2, device="cuda")
print(json.dumps({"cuda_seed": torch.cuda.initial_seed(), "cpu_seed": torch.initial_seed(),
                  "cpu": torch.rand(1).item(), "gpu_ok": bool(x.is_cuda),
                  "threads": torch.get_num_threads()}))
"""


def main() -> int:
    os.environ["OMP_NUM_THREADS"] = "1"  # as torchrun gives two ranks a node
    cold = [
        json.loads(
            subprocess.run(
                [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True
            ).stdout
        )
        for _ in range(2)
    ]
    import torch

    assert not torch.cuda.is_initialized(), "the parent must not initialise CUDA"
    forked = fork_two(reseed=True)
    unseeded = fork_two(reseed=False)
    checks = {
        "gpu usable in a forked rank": all(f["gpu_ok"] for f in forked),
        "cuda seeds per process as cold": (cold[0]["cuda_seed"] != cold[1]["cuda_seed"])
        == (forked[0]["cuda_seed"] != forked[1]["cuda_seed"]),
        "cpu seeds differ per rank": forked[0]["cpu_seed"] != forked[1]["cpu_seed"],
        "cpu draws differ per rank": forked[0]["cpu"] != forked[1]["cpu"],
        "threads as cold": [f["threads"] for f in forked] == [c["threads"] for c in cold],
    }
    print(
        json.dumps(
            {
                "torch": torch.__version__,
                "device": torch.cuda.get_device_name(0),
                "cold": cold,
                "forked": forked,
                "forked_without_reseed": unseeded,
            }
        )
    )
    for name, ok in checks.items():
        print(json.dumps({"check": name, "ok": ok}))
    print(
        json.dumps(
            {
                "cuda seeds differ without the reseed": unseeded[0]["cuda_seed"]
                != unseeded[1]["cuda_seed"]
            }
        )
    )
    return 0 if all(checks.values()) else 1


def fork_two(reseed: bool) -> list[dict[str, object]]:
    """Two ranks forked from this process, each running PROBE."""
    from orchestrator.agent.node.warm.launch import fresh_random_state

    forked = []
    for _ in range(2):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            if reseed:
                fresh_random_state()
            scope: dict[str, object] = {}
            import contextlib
            import io

            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(PROBE, scope)
            os.write(write, out.getvalue().encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as f:
            forked.append(json.loads(f.read()))
        os.waitpid(pid, 0)
    return forked


if __name__ == "__main__":
    sys.exit(main())
