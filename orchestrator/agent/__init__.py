"""orch's host agent: the only code orch runs on a host. Standard library only, valid
on Python 3.8.

Its rooms:

- `kernel/`: what the controller imports too, written once for both ends: the
  job-directory layout, frames, file IO, the messages and replies, placement (a
  node's torchrun command, the rules of restarts), the waiting line's rounds, open-file limits, a
  Slurm job's names. Pure or nearly: nothing here runs a command or reads /proc.
- `host/`: this host's facts: /proc (`proc.py` is its one reader), nvidia-smi, the
  probe, network tests, daemons that outlive their SSH channel.
- `node/`: one node of a job on this host: its supervisor (`start`), status, logs,
  kill, each rank's entry, setup, outputs, a `top` sample; on a Slurm compute node,
  the launcher srun starts (`srun`); warm starts in `node/warm/`.
- `store/`: the content store, the snapshots a push builds from it, the relay between
  hosts, takeover of a shared snapshot and gc.
- `keeper/`: a detached job's restarts on its hosts: what the keeper decides (pure),
  the keeper daemon, its members and the wire between them.
- `leases/`: the host's GPUs and slots and the line jobs wait in: the policy (pure),
  its storage, GPU discovery, the supervisor's side and the commands.

`main.py` maps each command to its module. The controller ships the package as a
deterministic archive whose hash is its version (`nodes/agent.py`); each host unpacks
a version once, compiled, under WORKDIR/agent/<version>, and runs every command from
there. A job pins the version that built its snapshot (the job directory's `agent`
link).
"""
