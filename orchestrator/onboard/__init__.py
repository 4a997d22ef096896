"""First contact with a set of machines: `orch keys` installs the user's SSH key on
each host (keys.py), `orch init` writes an inventory from what a probe finds there
(init.py, render.py). Both take hosts from the command line (targets.py) or, for
keys, from an inventory."""
