"""The transform stage on the recipe options of issue 17: grouped differential and MLA without a query latent.

Each states its Q/K rows through the seam, so QuacK finds the right blocks: grouped differential keys have
n_kv_groups blocks; MLA without a query latent has five matrices (no W_dq). That the transforms compose with them
(identity at init, causality, SDPA == math) is checked by the contract harness, `tests/contract/test_contract.py`.
"""

from __future__ import annotations

import torch

from lightning_cqk.attention.base import QKWeights
from lightning_cqk.model import GPT
from lightning_cqk.model_config import ModelConfig
from lightning_cqk.optim.quack import QuacK

CASES = [
    ("differential", {"n_kv_groups": 2}),
    ("mla", {"d_cq": 0}),
]


def _model(attention: str, options: dict) -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(preset="tiny", n_layer=2, vocab_size=257, block_size=16, attention=attention)
    return GPT(cfg.replace(attention_options=options)).double()


def test_the_seam_states_grouped_keys_and_five_mla_matrices():
    diff = _model("differential", {"n_kv_groups": 2}).blocks[0].attn.qk_weights()
    assert isinstance(diff, QKWeights) and [w.n_blocks for w in diff.weights] == [4, 2]
    mla = _model("mla", {"d_cq": 0}).blocks[0].attn.qk_weights()
    assert [w.role for w in mla.weights] == ["uq", "qr", "dkv", "uk", "kr"]
    for attention, options in CASES:
        quack = QuacK(_model(attention, options))
        assert all(torch.allclose(f, torch.full_like(f, quack.tau)) for f in quack.factors()), "tau at init"
