"""The agent's kernel: what both ends import, the controller from the package and the
agent on every host. Standard library only, valid on Python 3.8, and free of host
effects at import: the protocol and job-directory layout, placement, the waiting
line's rounds, open-file limits. Nothing outside the agent imports any other room."""
