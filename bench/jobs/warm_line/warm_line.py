"""Benchmark job for warm starts: imports torch, joins a gloo group, one all_reduce,
prints `ready rank R`; `--hold S` keeps every rank S seconds more (memory is read then).
With `--hf` it first builds a one-layer BERT from Hugging Face transformers (no
download), as a script that trains a transformers model imports it."""

import os
import sys
import time
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from helper import VALUE  # noqa: E402  (the file a changed-file run edits)

if "--hf" in sys.argv:
    from transformers import BertConfig, BertModel

    BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2))

dist.init_process_group("gloo")
tensor = torch.tensor([VALUE])
dist.all_reduce(tensor)
print(f"ready rank {os.environ['RANK']} sum {int(tensor.item())}", flush=True)
if "--hold" in sys.argv:
    time.sleep(float(sys.argv[sys.argv.index("--hold") + 1]))
dist.destroy_process_group()
