"""Writes outputs into ORCH_OUTPUT_DIR, for orch's output tests (one process per node).

    write_outputs.py [--fail-on HOST] [--wait]

Writes ``data-<host>.bin`` (1 MB of bytes derived from the host's name), ``logs/<host>.txt``
and a symlink ``latest -> data-<host>.bin``, then prints ``wrote <host>``. ``--fail-on
HOST``: that host exits 1 3 s after writing (the other node has written by then). ``--wait``: then waits for a file ``next`` in the
output directory, writes ``more-<host>.txt``, and waits for ``stop`` (tests drive it).
"""

import argparse
import contextlib
import hashlib
import os
import socket
import time

parser = argparse.ArgumentParser()
parser.add_argument("--fail-on")
parser.add_argument("--wait", action="store_true")
args = parser.parse_args()
host = socket.gethostname()
out = os.environ["ORCH_OUTPUT_DIR"]
seed = hashlib.sha256(host.encode()).digest()
with open(os.path.join(out, f"data-{host}.bin"), "wb") as f:
    f.write(seed * (1 << 15))
os.makedirs(os.path.join(out, "logs"), exist_ok=True)
with open(os.path.join(out, "logs", f"{host}.txt"), "w") as f:
    f.write(f"log of {host}\n")
# The first node's: nodes sharing one output directory (a Slurm job's) race here.
with contextlib.suppress(FileExistsError):
    os.symlink(f"data-{host}.bin", os.path.join(out, "latest"))
print("wrote", host, flush=True)
if args.fail_on == host:
    # Not before the other node wrote its own: the failure ends the job everywhere, and a
    # node that started later (on a loaded machine, up to a second or so) would be
    # stopped before its first line. Nodes need not share a directory to see it.
    time.sleep(3)
    raise SystemExit(1)
if args.wait:
    while not os.path.exists(os.path.join(out, "next")):
        time.sleep(0.1)
    with open(os.path.join(out, f"more-{host}.txt"), "w") as f:
        f.write("more\n")
    while not os.path.exists(os.path.join(out, "stop")):
        time.sleep(0.1)
