"""Analytic peak training memory of every configs/papers/ setting at its stated micro-batch, one GPU, bf16-mixed,
with activation checkpointing off and on, and with the plain or the chunked (loss_chunk) head + loss.

    python benchmarks/memory_table.py            # prints the markdown table committed to docs/speed.md

ANALYTIC, not measured (no GPU was lent when it was written): parameters are counted exactly (the model built on
the meta device); the rest follows these rules, in bytes, for P parameters, micro-batch B, length T, width C, MLP
width M, L layers, V (padded) vocabulary:

    states       16 P with AdamW (fp32 weights 4 + grads 4 + two moments 8); Muon: 12 P on its matrices (one momentum)
    bf16 copies  2 P (autocast's cast of every weight, kept for the backward)
    activations  per layer, what autograd keeps with the fused SDPA kernel (no T x T map), by the rule of
                 `memory_check.block_activation_bytes` (measured under autocast: tests/e2e/test_memory_check.py):
                 BT x [8C (the two norm inputs: the fp32 residual stream) + 2C x (2 norm outputs, each cast once
                 + q + 2 k/v (x n_kv/n_head) + output + out-proj input) + 2M x (2 for GELU | 4 for SwiGLU)]
                 checkpointing on: 4BTC per layer (the fp32 block input) + one layer's activations, recomputed
    logits       plain: B T V x 10 (bf16 logits 2 + their fp32 copy 4 + its gradient 4); chunked: 4096 V x 12
    peak         states + bf16 copies + activations + logits (the backward starts with all activations alive)

Allocator fragmentation, CUDA context (~0.5 GB), the learned transforms' extra saved tensors (coupled: q, k per
layer with recompute flow) and temporary workspace are not counted: add 10-20% before trusting a fit near 80 GB.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lightning_cqk.data.tokenizers import vocab_size_of  # noqa: E402
from lightning_cqk.model import GPT  # noqa: E402
from lightning_cqk.model_config import ModelConfig, upgrade_config_dict  # noqa: E402
from lightning_cqk.optim.muon import muon_split  # noqa: E402
from lightning_cqk.run.memory_check import block_activation_bytes  # noqa: E402

GB = 1e9
CHUNK = 4096


def setting(path: Path) -> dict:
    raw = yaml.safe_load(path.read_text())
    model = raw.get("model") or {}
    data = raw.get("data", {}).get("init_args", raw.get("data", {}))
    cfg = dict(upgrade_config_dict(model.get("config") or {}))
    tokenizer = data.get("tokenizer", "gpt2")
    cfg.setdefault("vocab_size", vocab_size_of(tokenizer))
    cfg["block_size"] = data.get("seq_len", cfg.get("block_size"))
    return {
        "config": ModelConfig(**cfg),
        "batch": int(data.get("batch_size", 1)),
        "seq": int(data.get("seq_len", cfg["block_size"])),
        "optim": ((model.get("optim") or {}).get("name") or "adamw"),
    }


def activations_per_layer(c: ModelConfig, B: int, T: int) -> float:
    opts = c.attention_options or {}
    kv = (opts.get("n_kv_groups") or c.n_head) / c.n_head
    per_token = block_activation_bytes(c.n_embd, c.mlp_hidden, "bf16-mixed", c.ffn == "swiglu", kv)
    return B * T * per_token


def row(path: Path) -> dict:
    s = setting(path)
    c, B, T = s["config"], s["batch"], s["seq"]
    with torch.device("meta"):
        model = GPT(c)
    P = model.num_parameters()["total"]
    muon = sum(p.numel() for p in muon_split(model)[0]) if s["optim"] == "muon" else 0
    states = 16 * (P - muon) + 12 * muon
    copies = 2 * P
    per_layer = activations_per_layer(c, B, T)
    act_off = c.n_layer * per_layer
    act_on = c.n_layer * 4 * B * T * c.n_embd + per_layer
    V = c.padded_vocab_size
    logits_plain, logits_chunked = 10 * B * T * V, 12 * min(CHUNK, B * T) * V
    return {
        "name": str(path.relative_to(REPO / "configs" / "papers")),
        "params": P,
        "BxT": f"{B}x{T}",
        "states": states + copies,
        "off": states + copies + act_off + logits_plain,
        "on": states + copies + act_on + logits_plain,
        "on_chunked": states + copies + act_on + logits_chunked,
        "act_off": act_off,
        "logits": logits_plain,
    }


def main() -> None:
    rows = [row(p) for p in sorted((REPO / "configs" / "papers").glob("*/*.yaml"))]
    print(
        "| setting | params | micro-batch | weights+grads+optimizer+bf16 copies | activations (AC off) | logits "
        "(plain) | peak, AC off | peak, AC on | peak, AC on + loss_chunk |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        gb = {k: f"{r[k] / GB:.1f} GB" for k in ("states", "act_off", "logits", "off", "on", "on_chunked")}
        cells = [r["name"], f"{r['params'] / 1e6:.0f}M", r["BxT"], *gb.values()]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
