"""The transform stage on the recipe options of issue 17: grouped differential and MLA without a query latent.

Each composes with the q/k transform (identity at init equals the base exactly, fp64) and states its Q/K rows
through the seam, so QuacK finds the right blocks: grouped differential keys have n_kv_groups blocks; MLA without a
query latent has five matrices (no W_dq).
"""

from __future__ import annotations

import pytest
import torch

from lightning_cqk.attention.base import QKWeights
from lightning_cqk.config import ModelConfig
from lightning_cqk.model import GPT
from lightning_cqk.optim.quack import QuacK

CASES = [
    ("differential", {"n_kv_groups": 2}),
    ("mla", {"d_cq": 0}),
]


def _model(attention: str, options: dict) -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(preset="tiny", n_layer=2, vocab_size=257, block_size=16, attention=attention)
    return GPT(cfg.replace(attention_options=options)).double()


@pytest.mark.parametrize("kind", ["invertible", "coupled"])
@pytest.mark.parametrize(("attention", "options"), CASES)
def test_transform_is_the_identity_at_init_on_recipe_options(attention, options, kind):
    base = _model(attention, options)
    with_transform = _model(attention, {**options, "qk_transform": {"kind": kind}})
    if kind == "invertible":  # v2 starts as the identity; v1 dynamics do not, so only check it runs and is causal
        shared = {k: v for k, v in with_transform.state_dict().items() if k in base.state_dict()}
        assert set(shared) == set(base.state_dict())
        base.load_state_dict(shared)
    x = torch.randint(0, 257, (2, 12))
    y = with_transform(x)
    if kind == "invertible":
        assert torch.equal(y, base(x))
    x2 = x.clone()
    x2[:, 7:] = (x2[:, 7:] + 1) % 257
    assert torch.allclose(with_transform(x2)[:, :7], y[:, :7], atol=1e-12, rtol=0), "causal"


def test_the_seam_states_grouped_keys_and_five_mla_matrices():
    diff = _model("differential", {"n_kv_groups": 2}).blocks[0].attn.qk_weights()
    assert isinstance(diff, QKWeights) and [w.n_blocks for w in diff.weights] == [4, 2]
    mla = _model("mla", {"d_cq": 0}).blocks[0].attn.qk_weights()
    assert [w.role for w in mla.weights] == ["uq", "qr", "dkv", "uk", "kr"]
    for attention, options in CASES:
        quack = QuacK(_model(attention, options))
        assert all(torch.allclose(f, torch.full_like(f, quack.tau)) for f in quack.factors()), "tau at init"
