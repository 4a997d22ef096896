"""orch's host agent: the only code orch runs on a host. Standard library only.

One module per command (`main.py` lists them), plus `protocol.py`, which the
controller imports too: frames, reply kinds and the job-directory layout are written
once. `proc.py` is the one reader of /proc.

The controller ships the package as a deterministic archive whose hash is its version
(`nodes/agent.py`); each host unpacks a version once, compiled, under
WORKDIR/agent/<version>, and runs every command from there. A job pins the version
that built its snapshot (the job directory's `agent` link).
"""
