"""The Slurm backend: the same job file on a Slurm cluster, through its login node.

`orch submit` connects to the login node alone, pushes the code into the shared home
(the content store and a per-job snapshot, as for SSH hosts that share a filesystem),
writes a batch script beside it and runs `sbatch`. The batch script starts one
torchrun per allocated node with `srun --kill-on-bad-exit=1` (the agent's `slurm-node`,
agent/node/srun.py, runs on each node: rank, master, port, interface); every rank writes its own log file on the shared
home, and the login node's one SSH connection streams them back as for SSH hosts.

- script.py: the batch script, each node's spec and the sbatch command (pure).
- queue.py: Slurm's words (squeue, sinfo, node lists, states) read into orch's (pure).
- login.py: what runs on the login node: sbatch, squeue, scancel, sinfo, files.
- submit.py: `orch submit` for a Slurm inventory; follow.py: its output and end.
- jobs.py: `orch status`, `logs`, `kill` of recorded Slurm jobs; check.py: `orch check`.
- unsupported.py: what orch cannot do on Slurm yet, refused with one error.

backends/slurm.py puts these behind the Backend protocol; slurm/ never imports ssh/.
"""
