"""Side-by-side table of every attention backend's size: parameters and analytic FLOPs at a preset.

    python benchmarks/backends.py                       # 60m sizes, GPT-2 vocabulary, T = 1024
    python benchmarks/backends.py --size_preset 150m --seq_len 2048

A second table gives each q/k transform composed with each base mechanism (`<base>+<transform>`, as the rows of
`benchmarks/bench.py`) against its own base. Nothing is allocated (the models are built on the meta device). Step
times and memory of the same backends, measured side by side against `standard` (compositions: against their base),
are in `benchmarks/bench.py` (`make bench`).
"""

from __future__ import annotations

import argparse

import torch

from lightning_cqk import attention
from lightning_cqk.model import GPT
from lightning_cqk.model.flops import forward_flops_per_step, forward_flops_per_token
from lightning_cqk.model_config import ModelConfig

#: Base mechanisms of the composition table (label -> backend name and options).
COMPOSITION_BASES = {
    "standard": ("standard", {}),
    "gqa": ("standard", {"n_kv_groups": 2}),
    "differential": ("differential", {}),
    "mla": ("mla", {}),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size_preset", default="60m", help="preset for parameter and FLOP columns")
    parser.add_argument("--seq_len", type=int, default=1024, help="context for the FLOP column")
    parser.add_argument("--backends", nargs="*", default=None)
    args = parser.parse_args()
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

    p0, f0, _ = size["standard"]
    print(f"sizes at {args.size_preset} (GPT-2 vocab, T={args.seq_len})")
    print("| backend | params | extra params | fwd FLOPs/token vs standard | per-step GFLOP |")
    print("|---|---|---|---|---|")
    for name in names:
        p, f, s = size[name]
        print(f"| {name} | {p:,} | {p - p0:+,} ({(p - p0) / p0 * 100:+.3f}%) | {f / f0:.3f} | {s / 1e9:.1f} |")

    print(f"\ncompositions at {args.size_preset}: each q/k transform on each base, against that base")
    print("| composition | params | extra params vs base | fwd FLOPs/token vs base |")
    print("|---|---|---|---|")
    for base, (name, options) in COMPOSITION_BASES.items():
        cfg = base_cfg = ModelConfig(preset=args.size_preset, attention=name, attention_options=options)
        with torch.device("meta"):
            pb = GPT(base_cfg).num_parameters()["total"]
        fb = forward_flops_per_token(base_cfg, args.seq_len)
        for kind in ("coupled", "invertible"):
            cfg = base_cfg.replace(attention_options={**options, "qk_transform": {"kind": kind}})
            with torch.device("meta"):
                p = GPT(cfg).num_parameters()["total"]
            f = forward_flops_per_token(cfg, args.seq_len)
            print(f"| {base}+{kind} | {p:,} | {p - pb:+,} ({(p - pb) / pb * 100:+.3f}%) | {f / fb:.3f} |")


if __name__ == "__main__":
    main()
