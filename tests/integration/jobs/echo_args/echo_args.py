"""Integration-test job for orch: echo the script arguments and ORCH_TEST_* environment.

Prints exactly two lines::

    ARGS=<json list of sys.argv[1:]>
    ENV=<json object of every ORCH_TEST_* environment variable>

Tests use it to check that orch passes job arguments (quoting included) and
environment variables through SSH and torchrun unchanged. It uses no
torch.distributed at all, so it is harmless under torchrun with world size 1
(with a larger world size every rank simply prints the same two lines).
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    env = {k: os.environ.get(k) for k in sorted(os.environ) if k.startswith("ORCH_TEST_")}
    # One write() for both lines so output of concurrent ranks never interleaves.
    sys.stdout.write("ARGS=" + json.dumps(sys.argv[1:]) + "\n" + "ENV=" + json.dumps(env) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
