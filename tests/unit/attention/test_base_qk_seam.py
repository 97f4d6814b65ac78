"""The one seam for Q/K weights: a backend defined in this file alone (registered by name for the test, no other
edit) gets QuacK, QK-clip and the gradient-norm groups, through `AttentionBackend.qk_weights()` and
`parameter_group()`. Its attribute names (`wq`, `wk`, `wv`, `proj_out`) appear nowhere in the package."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from lightning_cqk import attention
from lightning_cqk.attention import AttentionBackend, AttentionContext
from lightning_cqk.attention.base import QKWeight, QKWeights
from lightning_cqk.attention.kernels.functional import causal_attention, causal_logits
from lightning_cqk.callbacks.grad_norm_computer import GradNormComputer, param_groups
from lightning_cqk.model import GPT
from lightning_cqk.model_config import ModelConfig
from lightning_cqk.optim import QKClip
from lightning_cqk.optim.quack import QuacK


class ToyAttention(AttentionBackend):
    """Plain causal MHA without RoPE whose projections have names no other code knows."""

    name = "toy_seam"
    PARAMETER_GROUPS = {"proj_out": "out", "wv": "v"}

    def __init__(self, config, layer_idx, options) -> None:
        super().__init__(config, layer_idx, options)
        C, self.nh = config.n_embd, config.n_head
        self.wq, self.wk, self.wv = (nn.Linear(C, C, bias=True) for _ in range(3))
        self.proj_out = nn.Linear(C, C, bias=False)
        self.gate = nn.Parameter(torch.ones(()))  # something that is neither q, k, v nor out

    def heads(self, t: torch.Tensor) -> torch.Tensor:
        return t.unflatten(-1, (self.nh, -1)).transpose(1, 2)  # (B, nh, T, hs)

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        q, k, v = self.heads(self.wq(x)), self.heads(self.wk(x)), self.heads(self.wv(x))
        y = causal_attention(q, k, v, impl=self.options.impl)  # (B, nh, T, hs)
        return self.gate * self.proj_out(y.transpose(1, 2).flatten(2))  # (B, T, C)

    def attention_logits(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        return causal_logits(self.heads(self.wq(x)), self.heads(self.wk(x)))  # (B, nh, T, T)

    def qk_weights(self) -> QKWeights:
        return QKWeights("mha", (QKWeight("wq", "q", self.nh), QKWeight("wk", "k", self.nh)))

    @classmethod
    def forward_flops_per_token(cls, config, options, seq_len: int) -> int:
        return 8 * config.n_embd**2 + 4 * seq_len * config.n_embd


@pytest.fixture
def toy_model(monkeypatch) -> GPT:
    monkeypatch.setitem(attention.ATTENTION_BACKENDS, ToyAttention.name, ToyAttention)
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=64, n_layer=2, n_embd=32, n_head=4, block_size=16, attention="toy_seam")
    model = GPT(config).double()
    with torch.no_grad():  # heads with very different logit scales
        for block in model.blocks:
            for linear in (block.attn.wq, block.attn.wk):
                linear.weight.view(4, -1).mul_(torch.tensor([6.0, 12.0, 18.0, 24.0], dtype=torch.float64)[:, None])
    return model


def test_quack_factors_follow_the_stated_rows(toy_model):
    control = QuacK(toy_model, tau=0.5)
    assert [(t.path, t.role, t.n_blocks) for t in control.targets if t.layer == 0] == [
        ("blocks.0.attn.wq", "q", 4),
        ("blocks.0.attn.wk", "k", 4),
    ]
    for f in control.factors():
        torch.testing.assert_close(f, torch.full_like(f, 0.5))
    with torch.no_grad():
        toy_model.blocks[1].attn.wk.weight[8:16].mul_(2.0)  # double key head 1 of layer 1
    factors = control.factors()
    q1 = factors[2]  # layer 1, role q
    torch.testing.assert_close(q1, torch.tensor([0.5, 0.25, 0.5, 0.5]))


def test_qk_clip_caps_the_stated_heads(toy_model):
    clip = QKClip(toy_model, tau_clip=1.0)
    idx = torch.randint(0, 64, (3, 16), generator=torch.Generator().manual_seed(1))
    inputs = {}
    hooks = [b.attn.register_forward_pre_hook(lambda m, a, i=i: inputs.__setitem__(i, a)) for i, b in
             enumerate(toy_model.blocks)]  # fmt: skip
    toy_model.train()
    toy_model(idx)
    for h in hooks:
        h.remove()
    measured = clip.measured()
    clip.tau_clip = tau = float(measured[0].median())
    clip.after_step()
    x, ctx = inputs[0]
    with torch.no_grad():
        after = toy_model.blocks[0].attn.attention_logits(x, ctx).amax(dim=(0, 2, 3))
    over = measured[0] > tau
    assert over.any() and (~over).any()
    torch.testing.assert_close(after[over].float(), torch.full_like(after[over], tau).float(), rtol=1e-5, atol=0)
    torch.testing.assert_close(after[~over].float(), measured[0][~over], rtol=1e-5, atol=0)


def test_grad_norm_groups_come_from_the_backend(toy_model):
    groups = param_groups(toy_model)
    assert groups["blocks.1.attn.wq.weight"] == groups["blocks.1.attn.wq.bias"] == "q"
    assert groups["blocks.1.attn.wk.weight"] == "k"
    assert groups["blocks.1.attn.wv.weight"] == "v"
    assert groups["blocks.1.attn.proj_out.weight"] == "out"
    assert groups["blocks.1.attn.gate"] == "backend"
    toy_model(torch.randint(0, 64, (2, 16))).square().mean().backward()
    norms = GradNormComputer(toy_model).norms()
    q_manual = math.sqrt(sum(p.grad.square().sum().item() for n, p in toy_model.named_parameters() if ".wq." in n))
    assert norms["q"].item() == pytest.approx(q_manual, rel=1e-5)


def test_a_malformed_statement_is_refused():
    with pytest.raises(ValueError, match="roles"):
        QKWeights("mha", (QKWeight("wk", "k", 4), QKWeight("wq", "q", 4)))
    with pytest.raises(ValueError, match="multiple"):
        QKWeights("mha", (QKWeight("wq", "q", 4), QKWeight("wk", "k", 3)))
