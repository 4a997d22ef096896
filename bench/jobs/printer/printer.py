"""Benchmark job: print as fast as possible, or print timestamps for latency.

--lines N --width W   N lines of W bytes each, as fast as the rank can write them
--probe S             then, for S seconds, one `lat <time.time()>` line every 20 ms
--start-file PATH     before the probe: print `ready r<RANK>`, then wait until PATH
                      exists (the test hosts see the controller's files), so that
                      every rank probes at once, once the controller follows
No torch.distributed: the ranks only write, so the figures measure the log path.
"""

import argparse
import os
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--lines", type=int, default=0)
parser.add_argument("--width", type=int, default=100)
parser.add_argument("--probe", type=float, default=0.0)
parser.add_argument("--start-file", default=None)
args = parser.parse_args()

rank = os.environ["RANK"]
out = sys.stdout.buffer
pad = b"x" * max(0, args.width - 20)
block = []
for i in range(args.lines):
    block.append(b"r%s %09d %s\n" % (rank.encode(), i, pad))
    if len(block) == 1000:
        out.write(b"".join(block))
        block.clear()
out.write(b"".join(block))
out.flush()
if args.start_file:
    out.write(b"ready r%s\n" % rank.encode())
    out.flush()
    while not os.path.exists(args.start_file):
        time.sleep(0.05)
deadline = time.monotonic() + args.probe
while time.monotonic() < deadline:
    out.write(b"lat %.6f\n" % time.time())
    out.flush()
    time.sleep(0.02)
