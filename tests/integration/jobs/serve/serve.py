"""Integration-test job for `orch forward`: each node's first rank serves a page that
names its node on 127.0.0.1:PORT of its host (the port is the first argument), as
TensorBoard would, until the job is killed, or for SECONDS (the second argument).
Torch-free."""

from __future__ import annotations

import functools
import http.server
import os
import sys
import tempfile
import time

port = int(sys.argv[1])
seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
if os.environ.get("LOCAL_RANK", "0") != "0":
    raise SystemExit(0)
root = tempfile.mkdtemp()
with open(os.path.join(root, "index.html"), "w") as f:
    f.write(f"served by node {os.environ.get('GROUP_RANK', '?')}\n")
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=root)
server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
print(f"serving on {port}", flush=True)
if not seconds:
    server.serve_forever()
server.timeout = 0.2
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    server.handle_request()
print("done serving", flush=True)
