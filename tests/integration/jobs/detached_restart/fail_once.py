"""A job without torch (fast to start) for a detached job's restarts: every rank prints
`attempt <a> rank <r>`; in attempt 0 the rank FAIL_RANK (when set) exits with code 3,
at once or, with RELEASE set, once the file RELEASE exists on its host, and the others wait SLEEP seconds (default 30) for the keeper to stop them;
later attempts print `finished attempt <a>` and end."""

import os
import sys
import time

attempt, rank = int(os.environ["ORCH_ATTEMPT"]), os.environ["RANK"]
print("attempt", attempt, "rank", rank, flush=True)
if attempt == 0:
    if rank == os.environ.get("FAIL_RANK"):
        release = os.path.expanduser(os.environ.get("RELEASE", ""))
        while release and not os.path.exists(release):
            time.sleep(0.1)
        sys.exit(3)
    time.sleep(float(os.environ.get("SLEEP", "30")))
print("finished attempt", attempt, flush=True)
