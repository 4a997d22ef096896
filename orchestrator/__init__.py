"""orch: launch PyTorch distributed training on machines you can reach over SSH."""

__version__ = "0.1.0"
