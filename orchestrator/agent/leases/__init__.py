"""Leases of a host's GPUs and slots, and the line jobs wait in when they are busy
(`commands.py` tells how)."""
