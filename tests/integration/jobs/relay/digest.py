"""Prints the sha256 of every file the job's snapshot holds, one line, so that tests can
check that each host got exactly the pushed tree: ``tree <hex>``."""

import hashlib
import os

digest = hashlib.sha256()
for root, dirs, files in os.walk("."):
    dirs.sort()
    for name in sorted(files):
        path = os.path.join(root, name)
        with open(path, "rb") as f:
            digest.update(path.encode() + b"\0" + hashlib.sha256(f.read()).digest())
print("tree", digest.hexdigest())
