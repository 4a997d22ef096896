"""orch example job: distributed training on a synthetic "digits" dataset.

This is the example workload that ``orch`` launches on every host via torchrun
(``python -m torch.distributed.run ... train.py --epochs 3``). It is meant to be
small, fast and fully self-contained:

* no downloads -- the data set is generated in code: ten hand-drawn 8x8 glyphs
  for the digits 0-9, randomly shifted by up to one pixel and covered with
  Gaussian noise. A fixed seed (``torch.Generator``) makes every rank, on every
  host, generate exactly the same train and test split;
* ``DistributedSampler`` + ``DataLoader`` shard the training set across ranks
  and a tiny MLP wrapped in ``DistributedDataParallel`` is trained with Adam;
* the per-epoch loss and the final test accuracy are all-reduced so that every
  rank prints the same global numbers;
* rank 0 saves ``model.module.state_dict()`` to ``--checkpoint``.

Backend is NCCL when CUDA is available (one GPU per process, picked via
``LOCAL_RANK``), otherwise gloo on CPU. The default run (3 epochs) needs about one
second of compute on CPU with 2 ranks (see the final `done in` line).
"""

from __future__ import annotations

import argparse
import gc
import os
import socket
import sys
import time
import warnings

# numpy is optional for torch; silence the (harmless) import-time warning that
# would otherwise be printed once per rank.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402

# --------------------------------------------------------------------------
# Synthetic data
# --------------------------------------------------------------------------

# 8x8 bitmaps of the digits 0-9 ('#' = ink, '.' = background).
GLYPHS: list[list[str]] = [
    [  # 0
        "..####..",
        ".#....#.",
        ".#...##.",
        ".#..#.#.",
        ".#.#..#.",
        ".##...#.",
        ".#....#.",
        "..####..",
    ],
    [  # 1
        "...##...",
        "..###...",
        ".#.##...",
        "...##...",
        "...##...",
        "...##...",
        "...##...",
        ".######.",
    ],
    [  # 2
        "..####..",
        ".#....#.",
        "......#.",
        ".....#..",
        "....#...",
        "...#....",
        "..#.....",
        ".######.",
    ],
    [  # 3
        "..####..",
        ".#....#.",
        "......#.",
        "...###..",
        "......#.",
        "......#.",
        ".#....#.",
        "..####..",
    ],
    [  # 4
        "....##..",
        "...#.#..",
        "..#..#..",
        ".#...#..",
        ".######.",
        ".....#..",
        ".....#..",
        ".....#..",
    ],
    [  # 5
        ".######.",
        ".#......",
        ".#......",
        ".#####..",
        "......#.",
        "......#.",
        ".#....#.",
        "..####..",
    ],
    [  # 6
        "..####..",
        ".#......",
        ".#......",
        ".#####..",
        ".#....#.",
        ".#....#.",
        ".#....#.",
        "..####..",
    ],
    [  # 7
        ".######.",
        "......#.",
        ".....#..",
        "....#...",
        "...#....",
        "...#....",
        "...#....",
        "...#....",
    ],
    [  # 8
        "..####..",
        ".#....#.",
        ".#....#.",
        "..####..",
        ".#....#.",
        ".#....#.",
        ".#....#.",
        "..####..",
    ],
    [  # 9
        "..####..",
        ".#....#.",
        ".#....#.",
        "..#####.",
        "......#.",
        "......#.",
        ".....#..",
        "..###...",
    ],
]

NUM_CLASSES = len(GLYPHS)
SIDE = 8  # glyphs are SIDE x SIDE pixels


def glyph_templates() -> torch.Tensor:
    """Return the clean digit templates as a float tensor of shape (10, 8, 8)."""
    return torch.tensor(
        [[[1.0 if ch == "#" else 0.0 for ch in row] for row in glyph] for glyph in GLYPHS]
    )


def make_digits(
    n: int, generator: torch.Generator, noise: float = 0.2
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generate ``n`` noisy, randomly shifted digit images.

    Returns ``(images, labels)`` with images of shape (n, 64) and labels of
    shape (n,). All randomness comes from ``generator`` so the result is fully
    deterministic for a given seed.
    """
    templates = glyph_templates()
    labels = torch.randint(0, NUM_CLASSES, (n,), generator=generator)

    # Pad by one pixel on every side, then crop an 8x8 window at a random
    # offset in {0, 1, 2}^2: this shifts each glyph by -1..+1 pixels.
    padded = F.pad(templates[labels], (1, 1, 1, 1))  # (n, 10, 10)
    dy = torch.randint(0, 3, (n,), generator=generator)
    dx = torch.randint(0, 3, (n,), generator=generator)
    images = torch.empty(n, SIDE, SIDE)
    for oy in range(3):
        for ox in range(3):
            mask = (dy == oy) & (dx == ox)
            images[mask] = padded[mask, oy : oy + SIDE, ox : ox + SIDE]

    # Random per-sample stroke intensity plus additive Gaussian pixel noise.
    intensity = 0.7 + 0.6 * torch.rand(n, 1, 1, generator=generator)
    images = images * intensity + noise * torch.randn(n, SIDE, SIDE, generator=generator)
    return images.reshape(n, SIDE * SIDE), labels


def make_splits(seed: int, n_train: int, n_test: int) -> tuple[TensorDataset, TensorDataset]:
    """Build the train and held-out test datasets from a single fixed seed."""
    generator = torch.Generator().manual_seed(seed)
    x_train, y_train = make_digits(n_train, generator)
    x_test, y_test = make_digits(n_test, generator)
    return TensorDataset(x_train, y_train), TensorDataset(x_test, y_test)


# --------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------


class DigitsMLP(nn.Module):
    """A tiny two-layer MLP: 64 pixels -> hidden -> 10 logits."""

    def __init__(self, hidden: int = 128) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(SIDE * SIDE, hidden),
            nn.ReLU(),
            nn.Linear(hidden, NUM_CLASSES),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.net(x)
        return logits


# --------------------------------------------------------------------------
# Training / evaluation
# --------------------------------------------------------------------------


def log(message: str) -> None:
    """Print one line with a single write() so lines from concurrent ranks never interleave.

    ``print()`` issues separate writes for the text and the newline, which under
    ``PYTHONUNBUFFERED=1`` lets the output of several ranks sharing one pipe mix.
    """
    sys.stdout.write(message + "\n")
    sys.stdout.flush()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="orch example: DDP training on synthetic digits")
    parser.add_argument(
        "--epochs", type=int, default=3, help="number of training epochs (default: 3)"
    )
    parser.add_argument("--lr", type=float, default=0.01, help="Adam learning rate (default: 0.01)")
    parser.add_argument(
        "--batch-size", type=int, default=64, help="per-rank batch size (default: 64)"
    )
    parser.add_argument(
        "--checkpoint",
        default=os.path.join(os.environ.get("ORCH_OUTPUT_DIR", "."), "checkpoint.pt"),
        help="where rank 0 saves the trained weights (default: checkpoint.pt in "
        "$ORCH_OUTPUT_DIR, the job's output directory, which orch keeps and copies back)",
    )
    parser.add_argument(
        "--seed", type=int, default=1234, help="seed for data generation and model init"
    )
    parser.add_argument("--train-size", type=int, default=3000, help="number of training samples")
    parser.add_argument(
        "--test-size", type=int, default=1000, help="number of held-out test samples"
    )
    return parser.parse_args()


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    """Sum a list of scalars over all ranks and return the global sums."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def train_epoch(
    model: nn.Module,
    loader: DataLoader[tuple[torch.Tensor, ...]],
    optimizer: torch.optim.Optimizer,
    device: torch.device,
) -> float:
    """Run one epoch and return the global (all-reduced) mean training loss."""
    model.train()
    loss_sum, count = 0.0, 0
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        torch.autograd.backward(loss)  # DDP all-reduces the gradients here
        optimizer.step()
        loss_sum += loss.item() * y.numel()
        count += y.numel()
    total_loss, total_count = all_reduce_sum([loss_sum, float(count)], device)
    return total_loss / max(total_count, 1.0)


@torch.no_grad()
def evaluate(
    model: nn.Module, test_set: TensorDataset, rank: int, world: int, device: torch.device
) -> float:
    """Each rank scores a disjoint stride of the test set; return global accuracy."""
    model.eval()
    x, y = test_set.tensors
    x, y = x[rank::world].to(device), y[rank::world].to(device)
    correct = (model(x).argmax(dim=1) == y).sum().item() if y.numel() else 0
    total_correct, total = all_reduce_sum([float(correct), float(y.numel())], device)
    return total_correct / max(total, 1.0)


def setup_distributed() -> tuple[str, torch.device]:
    """Join the process group torchrun set up; return (backend, device).

    torchrun provides RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT
    in the environment, so ``init_process_group`` needs no explicit arguments.
    """
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)  # one GPU per process
        backend, device = "nccl", torch.device("cuda", local_rank)
    else:
        backend, device = "gloo", torch.device("cpu")
    dist.init_process_group(backend=backend)
    return backend, device


RESUME = os.path.join(os.environ.get("ORCH_OUTPUT_DIR", "."), "resume.pt")


def resume(model: DistributedDataParallel, optimizer: torch.optim.Optimizer, device: torch.device) -> int:
    """The epoch to start from: 0, or where the last attempt left off when orch
    restarted the job (`restarts:` in the job file). Rank 0 reads the state (its host
    keeps the output directory) and hands it to the others."""
    box = [None]
    if int(os.environ.get("ORCH_ATTEMPT", "0")) > 0 and dist.get_rank() == 0:
        if os.path.exists(RESUME):
            box = [torch.load(RESUME, map_location="cpu")]
    dist.broadcast_object_list(box, src=0)
    state = box[0]
    if state is None:
        return 0
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    log(f"resumed from epoch {state['epoch']} (attempt {os.environ['ORCH_ATTEMPT']})")
    return int(state["epoch"])


def train_and_evaluate(args: argparse.Namespace, device: torch.device) -> None:
    """Train the DDP model, report the test accuracy and save the checkpoint (rank 0)."""
    start = time.monotonic()
    rank, world = dist.get_rank(), dist.get_world_size()

    # Identical data on every rank (same seed); the sampler picks each rank's shard.
    train_set, test_set = make_splits(args.seed, args.train_size, args.test_size)
    sampler: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(
        train_set, num_replicas=world, rank=rank, shuffle=True, seed=args.seed
    )
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)

    # Same init on every rank (DDP also broadcasts rank 0's weights at construction).
    torch.manual_seed(args.seed)
    model = DigitsMLP().to(device)
    ddp_model = DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None
    )
    optimizer = torch.optim.Adam(ddp_model.parameters(), lr=args.lr)
    first = resume(ddp_model, optimizer, device)

    for epoch in range(first, args.epochs):
        sampler.set_epoch(epoch)  # reshuffle differently every epoch
        loss = train_epoch(ddp_model, loader, optimizer, device)
        log(f"epoch {epoch + 1}/{args.epochs} loss {loss:.4f}")
        if rank == 0:  # where a restarted attempt (ORCH_ATTEMPT > 0) picks up
            state = {"model": ddp_model.module.state_dict(), "optimizer": optimizer.state_dict()}
            torch.save({**state, "epoch": epoch + 1}, RESUME)

    accuracy = evaluate(ddp_model, test_set, rank, world, device)
    if rank == 0:
        log(f"accuracy {accuracy:.3f}")
        path = os.path.abspath(args.checkpoint)  # relative to the working directory
        os.makedirs(os.path.dirname(path), exist_ok=True)
        torch.save(ddp_model.module.state_dict(), path)
        log(f"saved checkpoint to {path}")
        log(f"done in {time.monotonic() - start:.2f}s")


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)  # several ranks share few cores: avoid oversubscription

    backend, device = setup_distributed()
    log(
        f"rank {dist.get_rank()}/{dist.get_world_size()} on {socket.gethostname()} backend {backend}"
    )

    train_and_evaluate(args, device)

    # The DDP model (whose reducer holds a reference to the process group) went
    # out of scope with train_and_evaluate; collect any reference cycles now so
    # the group is torn down here, while the interpreter is fully alive, rather
    # than during interpreter shutdown (which can abort the process).
    gc.collect()
    dist.barrier()  # keep every rank alive until rank 0 has written the checkpoint
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
