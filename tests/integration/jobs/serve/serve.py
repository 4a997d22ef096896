"""Integration-test job for `orch forward`: each node's first rank serves a page that
names its node on 127.0.0.1:PORT of its host (the port is the first argument), as
TensorBoard would, until the job is killed. Torch-free."""

from __future__ import annotations

import functools
import http.server
import os
import sys
import tempfile

port = int(sys.argv[1])
if os.environ.get("LOCAL_RANK", "0") != "0":
    raise SystemExit(0)
root = tempfile.mkdtemp()
with open(os.path.join(root, "index.html"), "w") as f:
    f.write(f"served by node {os.environ.get('GROUP_RANK', '?')}\n")
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=root)
server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
print(f"serving on {port}", flush=True)
server.serve_forever()
