"""Domain models: inventory, job spec, errors. They import nothing else from orch."""
