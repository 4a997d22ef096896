"""`warm ahead|list|stop|serve`: the agent's command for warm interpreters
(interpreters.py).

- `ahead` (stdin: the node's argv, env and warm options): start the warm process
  this node of a job will be forked from, before the job's first submit;
- `list`: every live one of this user here, with its memory; `stop [KEY]`: end them
  (all without KEY);
- `serve KEY IDLE PRELOAD ROOM`: the warm process itself (serve.py); in a launcher it
  forks, the node's launcher (launch.py).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from ...kernel.messages import parse_message
from ...kernel.requests import StartRequest, WarmOptions
from .interpreters import ensure_for, key_file, listing, stop, version_dir
from .serve import serve


def main(args: list[str]) -> int:
    verb, rest = (args[0], args[1:]) if args else ("", [])
    if verb == "serve":
        launch = serve(rest, key_file, version_dir())
        if isinstance(launch, int):
            return launch
        from . import launch as launcher
        from .rank_end import end_rank

        # In the forked launcher: returns only in a forked rank, which runs the user's
        # code and ends as a cold rank's interpreter would (rank_end.py).
        end_rank(launcher.run_node(*launch).run)
    if verb == "ahead":
        try:
            given = parse_message(StartRequest, json.loads(sys.stdin.read() or "{}"))
        except ValueError as exc:  # bad JSON, or a MessageError: a controller of another version
            print(json.dumps({"error": f"warm ahead: {exc}"}))
            return 2
        print(json.dumps(ahead(list(given.argv), given.env, given.warm or WarmOptions())))
        return 0
    if verb == "list":
        print(json.dumps({"warm": listing()}))
        return 0
    if verb == "stop":
        print(json.dumps({"stopped": stop(rest[0] if rest else None)}))
        return 0
    sys.stderr.write("usage: warm ahead|list|stop [KEY]|serve KEY IDLE PRELOAD ROOM\n")
    return 2


def ahead(argv: list[str], env: dict[str, str], options: WarmOptions) -> dict[str, Any]:
    """`orch warm JOB`: start the warm process that this node of the job will be forked
    from, before its first submit. `argv` and `env` are the node's (stdin: the env may
    hold secrets); its supervisor's environment is this session's with the node's on
    top, and so is the key here.

    Returns:
        As `ensure`; `{"error"}` where the node would start cold whatever runs.
    """
    if options.off:
        return {"error": f"the job starts cold: {options.off}"}
    from . import launch  # the fork's side: only `ahead` needs it

    request = launch.node_request([os.path.expanduser(argv[0]), *argv[1:]])
    if request.get("cold"):
        return {"error": f"the job starts cold: {request['cold']}"}
    return ensure_for(options, request, {**os.environ, **env})
