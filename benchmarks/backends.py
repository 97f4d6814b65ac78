"""Side-by-side table of every attention backend: parameters and FLOPs at a preset, CPU/GPU step time vs standard.

    python benchmarks/backends.py                       # 60m sizes, tiny step times, on this machine
    python benchmarks/backends.py --steps 30 --threads 2

Step time = forward + backward + AdamW step on random tokens, median of `--steps` measured steps after
`--warmup`, with the backends interleaved round-robin so that load changes hit all of them alike. Ratios are
against `standard` measured in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from lightning_cqk import attention
from lightning_cqk.config import ModelConfig
from lightning_cqk.model import GPT
from lightning_cqk.model.flops import forward_flops_per_step, forward_flops_per_token


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size_preset", default="60m", help="preset for parameter and FLOP columns")
    parser.add_argument("--seq_len", type=int, default=1024, help="context for the FLOP column")
    parser.add_argument("--time_preset", default="tiny", help="preset for the step-time column")
    parser.add_argument("--vocab", type=int, default=257, help="vocabulary for the step-time model")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--time_seq_len", type=int, default=256)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--backends", nargs="*", default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    names = args.backends or attention.available()
    if "standard" not in names:
        names = ["standard", *names]

    size = {}
    base = ModelConfig(preset=args.size_preset)
    for name in names:
        cfg = base.replace(attention=name)
        with torch.device("meta"):
            params = GPT(cfg).num_parameters()["total"]
        size[name] = (params, forward_flops_per_token(cfg, args.seq_len), forward_flops_per_step(cfg))

    models, optimizers = {}, {}
    for name in names:
        torch.manual_seed(0)
        cfg = ModelConfig(preset=args.time_preset, vocab_size=args.vocab, block_size=args.time_seq_len, attention=name)
        models[name] = GPT(cfg).to(device)
        optimizers[name] = torch.optim.AdamW(models[name].parameters(), lr=1e-4)
    idx = torch.randint(0, args.vocab, (args.batch, args.time_seq_len + 1), device=device)
    times: dict[str, list[float]] = {name: [] for name in names}
    for step in range(args.warmup + args.steps):
        for name in names:
            model, opt = models[name], optimizers[name]
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            logits = model(idx[:, :-1])
            F.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten()).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if step >= args.warmup:
                times[name].append(time.perf_counter() - t0)

    p0, f0, _ = size["standard"]
    t0 = statistics.median(times["standard"])
    print(
        f"device {device}, threads {torch.get_num_threads()}; sizes at {args.size_preset} "
        f"(GPT-2 vocab, T={args.seq_len}); step times at {args.time_preset} "
        f"(vocab {args.vocab}, {args.batch}x{args.time_seq_len})"
    )
    header = ["backend", "params", "extra params", "fwd FLOPs/token vs standard", "per-step GFLOP", "step ms"]
    print("| " + " | ".join([*header, "step vs standard"]) + " |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        p, f, s = size[name]
        t = statistics.median(times[name])
        print(
            f"| {name} | {p:,} | {p - p0:+,} ({(p - p0) / p0 * 100:+.3f}%) | {f / f0:.3f} | {s / 1e9:.1f} | "
            f"{t * 1e3:.1f} | {t / t0:.2f} |"
        )


if __name__ == "__main__":
    main()
