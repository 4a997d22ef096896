"""The agent's kernel: what both ends import, the controller from the package and the
agent on every host. Standard library only, valid on Python 3.8, and free of host
effects: the job directory and content store (`layout`), the frames and follow records
(`framing`), whole-file writes and trusting-nothing reads (`fileio`), the message
framework (`messages`), what the controller asks (`requests`: the node template, the
start spec, each command's input) and what the commands answer (`replies`), the
replies of leases (`lease_wire`) and of the probe and network tests (`host_wire`), a
node's command and the rules of restarts (`placement`), the waiting line's rounds
(`line`), open-file limits (`limits`), a Slurm job's names (`slurm`). Nothing outside
the agent imports any other room of it."""
