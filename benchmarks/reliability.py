"""Costs of the reliability machinery: atomic checkpoint writes, CRC verification before loading, and the
per-step NaN/Inf check of NonFiniteGuard.

    python benchmarks/reliability.py                         # 512 MiB checkpoint; tiny preset, B=16, T=128
    python benchmarks/reliability.py --size_mb 2048 --preset 60m --batch 8 --seq 1024 --steps 60   # on a GPU

Checkpoint I/O (into --dir, default a temporary folder): median of --repeats of Lightning's `TorchCheckpointIO.save`
(serialise into memory, write through an fsspec transaction, no fsync) vs `AtomicCheckpointIO.save` (stream to a
temporary file, fsync, rename), `checkpoint_problem` (the CRC check) and a load without and with verification.
Page cache effects are not controlled (the file was just written), so loads measure memory bandwidth more than disk.

Guard: the same training run (random tokens, validation off) with and without `NonFiniteGuard`, interleaved
--rounds times; reported: median ms per optimizer step of each and the time inside the guard's hooks per step.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO
from torch.utils.data import DataLoader

from lightning_cqk.callbacks import AtomicCheckpointIO, NonFiniteGuard
from lightning_cqk.checkpoint.reading import checkpoint_problem
from lightning_cqk.model_config import ModelConfig
from lightning_cqk.module import LitLM
from lightning_cqk.optim import OptimConfig


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def checkpoint_io(size_mb: int, folder: Path, repeats: int) -> None:
    n = size_mb * 2**20 // 4 // 2**20
    checkpoint = {"state_dict": {f"w{i}": torch.randn(2**20) for i in range(n)}, "global_step": 1}
    plain, atomic = TorchCheckpointIO(), AtomicCheckpointIO()
    a, b = folder / "plain.ckpt", folder / "atomic.ckpt"
    rows = [
        ("save, Lightning TorchCheckpointIO", timed(lambda: plain.save_checkpoint(checkpoint, a), repeats)),
        ("save, AtomicCheckpointIO (fsync + rename)", timed(lambda: atomic.save_checkpoint(checkpoint, b), repeats)),
        ("verify (zip CRCs)", timed(lambda: checkpoint_problem(b), repeats)),
        ("load, unverified", timed(lambda: plain.load_checkpoint(b), repeats)),
        ("load, verified (AtomicCheckpointIO)", timed(lambda: atomic.load_checkpoint(b), repeats)),
    ]
    print(f"\ncheckpoint of {b.stat().st_size / 2**20:.0f} MiB in {folder} (median of {repeats}):")
    print(f"| {'operation':<42} | seconds |\n|{'-' * 44}|---------|")
    for name, seconds in rows:
        print(f"| {name:<42} | {seconds:7.3f} |")


class HookTimer(NonFiniteGuard):
    """NonFiniteGuard that adds up the seconds spent in its hooks."""

    seconds = 0.0

    def on_before_backward(self, *args) -> None:
        start = time.perf_counter()
        super().on_before_backward(*args)
        HookTimer.seconds += time.perf_counter() - start

    def on_before_optimizer_step(self, *args) -> None:
        start = time.perf_counter()
        super().on_before_optimizer_step(*args)
        HookTimer.seconds += time.perf_counter() - start


class StepClock(L.Callback):
    def __init__(self, warmup: int) -> None:
        self.warmup, self.start, self.steps = warmup, None, 0

    def on_train_batch_start(self, trainer, *args) -> None:
        if trainer.global_step == self.warmup:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.start = time.perf_counter()

    def on_train_end(self, trainer, *args) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.steps = trainer.global_step - self.warmup
        self.seconds = time.perf_counter() - self.start


def guard_cost(args: argparse.Namespace) -> None:
    config = ModelConfig(preset=args.preset, vocab_size=args.vocab, block_size=args.seq)
    data = torch.randint(0, args.vocab, ((args.steps + 2) * args.batch, args.seq + 1))
    results: dict[str, list[float]] = {"without guard": [], "with NonFiniteGuard": []}
    hook_ms = []
    for _ in range(args.rounds):
        for name in results:
            L.seed_everything(0, verbose=False)
            module = LitLM(config, OptimConfig(warmup_steps=2))
            clock = StepClock(warmup=args.warmup)
            callbacks = [clock] + ([HookTimer()] if "with" in name else [])
            HookTimer.seconds = 0.0
            trainer = L.Trainer(
                max_steps=args.steps,
                accelerator="auto",
                devices=1,
                precision="bf16-mixed" if torch.cuda.is_available() else "32-true",
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                limit_val_batches=0,
                callbacks=callbacks,
            )
            trainer.fit(module, DataLoader(data, batch_size=args.batch))
            results[name].append(1000 * clock.seconds / clock.steps)
            if "with" in name:
                hook_ms.append(1000 * HookTimer.seconds / args.steps)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU, {torch.get_num_threads()} threads"
    n_params = sum(p.numel() for p in LitLM(config).parameters())
    print(
        f"\nNonFiniteGuard on {device}: preset {args.preset} ({n_params / 1e6:.1f}M parameters), B={args.batch}, "
        f"T={args.seq}, {args.steps - args.warmup} timed steps x {args.rounds} rounds (median):"
    )
    print("| run | ms per step |\n|---|---|")
    for name, values in results.items():
        print(f"| {name} | {statistics.median(values):.2f} |")
    print(f"| time inside the guard's hooks | {statistics.median(hook_ms):.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size_mb", type=int, default=512)
    parser.add_argument("--dir", default=None, help="where to write the checkpoints (default: a temporary folder)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--vocab", type=int, default=257)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--skip_io", action="store_true")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if not args.skip_io:
        with tempfile.TemporaryDirectory(dir=args.dir) as folder:
            checkpoint_io(args.size_mb, Path(folder), args.repeats)
    guard_cost(args)


if __name__ == "__main__":
    main()
