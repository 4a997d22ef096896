"""The SSH backend: jobs on the inventory's hosts, each reached over its own SSH
connection (or run locally). plan.py works out node ranks and the rendezvous (pure);
submit, watch, keep and queue start a job and see it through; logs, top, pull,
reconcile and teardown manage it afterwards; check/ finds what would make it hang.
backends/ssh.py puts these behind the Backend protocol; ssh/ never imports slurm/."""
