"""A rank that draws a real tqdm bar on stderr, as training scripts do.

Prints `start rank=N` (in green), then a bar of --steps steps over --seconds, each
redraw carrying the wall-clock time it was written (`t=...`, so that a test can tell
how late it reached the screen), then `done rank=N`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from tqdm import tqdm


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    print(f"\x1b[32mstart rank={rank}\x1b[0m", flush=True)
    # mininterval=0: every step is a redraw, as a slow real bar's would be.
    with tqdm(total=args.steps, desc=f"train r{rank}", file=sys.stderr, mininterval=0) as bar:
        for _ in range(args.steps):
            time.sleep(args.seconds / args.steps)
            bar.set_postfix_str(f"t={time.time():.3f}", refresh=False)
            bar.update(1)
    print(f"done rank={rank}", flush=True)


if __name__ == "__main__":
    main()
