"""Step time of byte-level candidate models on one CPU thread: the calibration of
lightning_cqk/study/design/cost_estimate.py.

    OMP_NUM_THREADS=1 python benchmarks/cpu_step_time.py & OMP_NUM_THREADS=1 python benchmarks/cpu_step_time.py

Run two at once (side by side, as a sweep's two jobs share 2 cores). Plain torch loop per candidate: forward,
cross-entropy, backward, clip, AdamW; 3 warm-up steps, then the mean of 12. Prints ms per step, training GFLOPs
per step (lightning_cqk.model.flops) and parameters, then one JSON line.
"""

from __future__ import annotations

import json
import sys
import time

import torch

from lightning_cqk.model.flops import training_flops_per_batch
from lightning_cqk.model.gpt import GPT
from lightning_cqk.model_config import ModelConfig

CANDIDATES = {
    "tiny-B16T128": (dict(preset="tiny"), 16, 128),
    "tiny-B8T256": (dict(preset="tiny"), 8, 256),
    "d192L6-B16T128": (dict(preset="tiny", n_layer=6, n_embd=192, n_head=6, mlp_hidden=768), 16, 128),
    "d160L4-B16T128": (dict(preset="tiny", n_layer=4, n_embd=160, n_head=5, mlp_hidden=640), 16, 128),
    "d64L2-B16T128": (dict(preset="tiny", n_layer=2, n_embd=64, mlp_hidden=256), 16, 128),
    "tiny-coupled": (dict(preset="tiny", attention="coupled"), 16, 128),
    "tiny-coupled7": (dict(preset="tiny", attention="coupled", attention_options={"steps": 7}), 16, 128),
    "tiny-uncoupled": (dict(preset="tiny", attention="uncoupled_mlp"), 16, 128),
    "tiny-differential": (dict(preset="tiny", attention="differential"), 16, 128),
    "tiny-mla": (dict(preset="tiny", attention="mla"), 16, 128),
    "tiny-non_approximate": (dict(preset="tiny", attention="non_approximate"), 16, 128),
    "tiny-approximate": (dict(preset="tiny", attention="approximate"), 16, 128),
    "tiny-rnd_emb_qk": (dict(preset="tiny", attention="rnd_emb_qk"), 16, 128),
    "tiny-L2": (dict(preset="tiny", n_layer=2), 16, 128),
}
VOCAB = 257


def time_step(kwargs: dict, batch: int, seq: int, steps: int = 12, warmup: int = 3) -> float:
    """Mean seconds per optimizer step of a fresh model on random byte windows."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=VOCAB, **kwargs))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, VOCAB, (batch, seq + 1))  # (B, T + 1)

    def step() -> None:
        logits = model(x[:, :-1])  # (B, T, V)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), x[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps


def main(names: list[str]) -> None:
    torch.set_num_threads(1)
    out = {}
    for name in names or list(CANDIDATES):
        kwargs, batch, seq = CANDIDATES[name]
        cfg = ModelConfig(vocab_size=VOCAB, **kwargs)
        out[name] = {
            "ms": round(time_step(kwargs, batch, seq) * 1e3, 1),
            "gflop": training_flops_per_batch(cfg, batch, seq) / 1e9,
            "params": sum(p.numel() for p in GPT(cfg).parameters()),
        }
        print(name, out[name], flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
