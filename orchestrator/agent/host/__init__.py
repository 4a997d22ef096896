"""This host's facts, for the agent's commands: /proc (`proc.py`, its one reader), the
probe, network tests, and daemons that outlive the SSH channel that started them."""
