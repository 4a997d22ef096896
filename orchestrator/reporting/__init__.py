"""What a job says back to the user, the same for every backend: the Reporter contract
the CLI and the Python API implement, the follow of each node's output as events,
whether a silent host is lost, progress bars condensed, which lines `orch logs`
shows, and the summary of how a job failed.

- reporter.py: the Reporter, ProgressReporter and PhaseReporter protocols.
- follow.py: Watcher, the events it yields (Output, NodeExit, Notice); contact.py: its
  judge of silent hosts.
- progress.py: progress bars condensed to their last state, and which bars show.
- filters.py: LogFilter and FilteredReporter (`--node`, `--rank`, `--tail`).
- failure.py: the failure summary (first failing rank, its last lines).

It imports neither backend: ssh/ and slurm/ both import it.
"""
