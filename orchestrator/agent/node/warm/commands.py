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
import sys

from ...kernel.messages import parse_message
from ...kernel.requests import StartRequest, WarmOptions
from .interpreters import ahead, key_file, listing, stop, version_dir
from .serve import serve


def main(args: list[str]) -> int:
    verb, rest = (args[0], args[1:]) if args else ("", [])
    if verb == "serve":
        launch = serve(rest, key_file, version_dir())
        if isinstance(launch, int):
            return launch
        from . import launch as launcher

        # In the forked launcher: returns only in a forked rank, which runs the user's code.
        return launcher.run_node(*launch).run()
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
