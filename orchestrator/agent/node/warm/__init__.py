"""Warm starts: a node's ranks forked from an interpreter that imported torch already,
instead of each importing it.

- `interpreters`: the warm interpreters of this user on this host (where they live,
  their key, start, list, stop) and the `warm` command; the supervisor's side that
  asks one to fork a node's launcher;
- `serve`: the warm interpreter itself, which forks a launcher per request;
- `launch`: the forked launcher, which does torchrun's job for one node.
"""
