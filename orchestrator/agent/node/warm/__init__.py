"""Warm starts: a node's ranks forked from an interpreter that imported torch already,
instead of each importing it.

- `interpreters`: the warm interpreters of this user on this host: where they live,
  their key, start (`ensure`), list, stop;
- `commands`: the agent's `warm ahead|list|stop|serve` command;
- `serve`: the warm interpreter itself, which forks a launcher per request;
- `fork`: the node supervisor's side, which asks one to fork the node's launcher
  (starting it where none runs for the node), or says why the node starts cold;
- `launch`: the forked launcher, which takes the node's start (spawn.py) on itself
  and does torchrun's job for the node.
"""
