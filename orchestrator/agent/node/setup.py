"""`setup JOB_DIR` (stdin: its spec): run the job's setup command with /bin/sh in its code dir,
streaming its output, and mark it done in the store for this code version."""

from __future__ import annotations

import json
import os
import sys
import time

from ..kernel.fileio import write_json
from ..kernel.layout import CODE, SETUP_LOG, setup_marker
from ..kernel.messages import parse_message
from ..kernel.requests import SetupRequest


def main(args: list[str]) -> int:
    """`setup JOB_DIR`, its spec on stdin (the script and env may hold secrets: never
    in an argv): run the job's setup command in its code dir, streaming its output,
    and mark it done for this code version when it succeeds."""
    import subprocess

    os.chdir(os.path.expanduser(args[0]))
    try:
        spec = parse_message(SetupRequest, json.loads(sys.stdin.read()))
    except ValueError as exc:  # bad JSON, or a MessageError: a controller of another version
        sys.stderr.write(f"orch agent setup: {exc}\n")
        return 2
    env = dict(os.environ)
    env.update(spec.env)
    # `pip install ...` should mean the pip of the interpreter that runs the job.
    # (The job's environment's, where it has one.)
    python = os.path.expanduser(spec.python) if spec.python else sys.executable
    env["PATH"] = os.path.dirname(python) + os.pathsep + env.get("PATH", "")
    with open(SETUP_LOG, "ab") as log:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", spec.script],
            cwd=CODE,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()
        code = proc.wait()
    if code == 0:
        marker = setup_marker(os.path.expanduser(spec.store), spec.key)
        os.makedirs(os.path.dirname(marker), exist_ok=True)
        write_json(marker, {"manifest": spec.manifest, "done": time.time()})
    return code
