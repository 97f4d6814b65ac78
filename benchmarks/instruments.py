"""Overhead of the instrument callbacks and of the Q/K update control, measured inside a Lightning training run.

    python benchmarks/instruments.py                                  # tiny preset, B=16, T=128, CPU or GPU
    python benchmarks/instruments.py --steps 200 --grad_norm_every 1 --attn_every 50 --threads 2

Every hook of every instrument is wrapped with a timer (on CUDA the device is synchronised around each hook so its
kernels are charged to it), and the wrapped run's training time per step is measured with a clock around the whole
fit (validation off). Reported per callback: milliseconds per optimizer step spent in its hooks and the share of the
step time. The optimizer-side controllers (QuacK, QK-clip with `--logit_control`) are timed around LitLM's
`optimizer_step` wrapper (before_step + after_step, and QK-clip's measuring forward hooks). Random tokens; the model
trains on them as on text, so the costs are those of a real run.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import defaultdict

import lightning as L
import torch
from torch.utils.data import DataLoader

from lightning_cqk.callbacks import AttentionStats, GradNormMonitor, LossSpikeMonitor, Throughput, TokenBudget
from lightning_cqk.model_config import ModelConfig
from lightning_cqk.module import LitLM
from lightning_cqk.optim import OptimConfig

HOOKS = (
    "on_train_batch_start",
    "on_before_backward",
    "on_before_optimizer_step",
    "on_train_batch_end",
    "on_validation_start",
    "on_validation_end",
)


class HookClock:
    """Seconds spent in the hooks of each wrapped object, by name."""

    def __init__(self, cuda: bool) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.cuda = cuda

    def wrap(self, name: str, obj: object, methods: tuple[str, ...]) -> None:
        for method in methods:
            if not hasattr(obj, method):
                continue
            if method.startswith("on_") and getattr(type(obj), method) is getattr(L.Callback, method, None):
                continue  # not overridden: nothing to time
            inner = getattr(obj, method)

            def timed(*args, __inner=inner, **kwargs):
                if self.cuda:
                    torch.cuda.synchronize()
                start = time.perf_counter()
                out = __inner(*args, **kwargs)
                if self.cuda:
                    torch.cuda.synchronize()
                self.seconds[name] += time.perf_counter() - start
                return out

            setattr(obj, method, timed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--attention", default="standard")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq_len", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=257)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--grad_norm_every", type=int, default=5, help="GradNormMonitor interval (1 = every step)")
    parser.add_argument("--attn_every", type=int, default=50, help="AttentionStats interval (its default is 100)")
    parser.add_argument("--logit_control", default="none", choices=["none", "quack", "fixed", "qk_clip"])
    parser.add_argument("--precision", default=None)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = torch.cuda.is_available()
    L.seed_everything(0, verbose=False)
    config = ModelConfig(preset=args.preset, vocab_size=args.vocab, block_size=args.seq_len, attention=args.attention)
    optim = OptimConfig(lr=3e-3, warmup_steps=10, logit_control={"method": args.logit_control, "tau_clip": 30.0})
    module = LitLM(config, optim)
    data = torch.randint(0, args.vocab, ((args.steps + 5) * args.batch, args.seq_len + 1))
    loader = DataLoader(data, batch_size=args.batch, drop_last=True)
    callbacks = {
        "GradNormMonitor": GradNormMonitor(every_n_steps=args.grad_norm_every),
        "LossSpikeMonitor": LossSpikeMonitor(),
        "AttentionStats": AttentionStats(every_n_steps=args.attn_every),
        "Throughput": Throughput(),
        "TokenBudget": TokenBudget(batch_size=args.batch, seq_len=args.seq_len),
    }
    clock = HookClock(cuda)
    for name, callback in callbacks.items():
        clock.wrap(name, callback, HOOKS)
    if module.logit_control is not None:
        clock.wrap(f"logit_control ({args.logit_control})", module.logit_control, ("before_step", "after_step"))
        if args.logit_control == "qk_clip":  # the measuring forward hooks
            from lightning_cqk.optim import qk_clip

            original = qk_clip.head_max_logits

            def timed_measure(*a, **k):
                start = time.perf_counter()
                out = original(*a, **k)
                clock.seconds["logit_control (qk_clip)"] += time.perf_counter() - start
                return out

            qk_clip.head_max_logits = timed_measure
    trainer = L.Trainer(
        max_steps=args.steps,
        accelerator="auto",
        devices=1,
        precision=args.precision or ("bf16-mixed" if cuda else "32-true"),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        log_every_n_steps=10,
        callbacks=list(callbacks.values()),
        default_root_dir=tempfile.mkdtemp(prefix="instruments-"),  # budget.json and spikes.json land here
    )
    start = time.perf_counter()
    trainer.fit(module, loader)
    if cuda:
        torch.cuda.synchronize()
    total = time.perf_counter() - start
    per_step = total / args.steps
    device = torch.cuda.get_device_name() if cuda else f"CPU ({torch.get_num_threads()} threads)"
    print(f"\n{args.preset} {args.attention}, B={args.batch}, T={args.seq_len}, {args.steps} steps on {device}:")
    print(f"  step time {per_step * 1e3:.1f} ms (whole fit / steps, hooks included)")
    print(f"  {'instrument':<28} {'ms/step':>9} {'share':>8}")
    for name, seconds in sorted(clock.seconds.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<28} {seconds / args.steps * 1e3:9.3f} {seconds / total:8.2%}")
    attn = callbacks["AttentionStats"]
    if attn.calls:
        print(f"  AttentionStats: {attn.calls} probes, {attn.seconds / attn.calls * 1e3:.1f} ms each")


if __name__ == "__main__":
    main()
