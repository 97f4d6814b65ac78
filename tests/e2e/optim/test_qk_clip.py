"""QK-clip: after a step, every head's max logit on the batch it measured is at most tau_clip."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from tiny_run import tiny_trainer
from torch.utils.data import DataLoader

from lightning_cqk.model import GPT
from lightning_cqk.model_config import ModelConfig
from lightning_cqk.module import LitLM
from lightning_cqk.optim import OptimConfig, QKClip
from lightning_cqk.optim.qk_clip import head_max_logits

CASES = {
    "mha": ("standard", {}),
    "mha_bias": ("standard", {}),
    "gqa": ("standard", {"n_kv_groups": 2}),
    "q_eq_k": ("standard", {"qkv_sharing": "q_eq_k"}),
    "differential": ("differential", {}),
    "mla": ("mla", {}),
}


def sharp_model(case: str) -> GPT:
    """A tiny GPT whose Q/K weights are scaled up per head (x1..x4), so heads have very different max logits."""
    attention, options = CASES[case]
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=64,
        n_layer=2,
        n_embd=32,
        n_head=4,
        block_size=16,
        attention=attention,
        attention_options=options,
        bias=case == "mha_bias",
    )
    model = GPT(config).double()
    names = ("uq_proj", "uk_proj") if attention == "mla" else ("q_proj", "k_proj")
    with torch.no_grad():
        for block in model.blocks:
            for name in names:
                linear = getattr(block.attn, name)
                if linear is None:
                    continue
                blocks = linear.weight.view(4, -1)  # four contiguous row blocks (the heads, for MHA)
                blocks.mul_(torch.tensor([6.0, 12.0, 18.0, 24.0], dtype=blocks.dtype).view(4, 1))
                if linear.bias is not None:
                    linear.bias.normal_(0, 0.5)
    return model


def record_inputs(model: GPT, idx: torch.Tensor) -> dict[int, tuple]:
    """A training forward (grad enabled, train mode) that also keeps every layer's attention input."""
    inputs = {}
    handles = [
        b.attn.register_forward_pre_hook(lambda m, a, i=i: inputs.__setitem__(i, a)) for i, b in enumerate(model.blocks)
    ]
    model.train()
    model(idx)
    for h in handles:
        h.remove()
    return inputs


@pytest.mark.parametrize("case", CASES)
def test_clip_caps_the_max_logit_it_measured(case: str):
    model = sharp_model(case)
    clip = QKClip(model, tau_clip=1.0)  # placeholder threshold, set from the measurement below
    idx = torch.randint(0, 64, (3, 16), generator=torch.Generator().manual_seed(1))
    inputs = record_inputs(model, idx)
    measured = clip.measured()
    for layer, (x, ctx) in inputs.items():  # the hook measured exactly the explicit-math logits of this forward
        with torch.no_grad():
            torch.testing.assert_close(measured[layer], head_max_logits(model.blocks[layer].attn, x, ctx).float())
    clip.tau_clip = tau = float(measured[0].median())  # some heads above the cap, some below
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    clip.after_step()
    for layer, (x, ctx) in inputs.items():
        with torch.no_grad():
            after = head_max_logits(model.blocks[layer].attn, x, ctx)
        before = measured[layer]
        over = before > tau
        assert over.any()
        torch.testing.assert_close(after[over], torch.full_like(after[over], tau), rtol=1e-5, atol=0)
        torch.testing.assert_close(after[~over], before[~over], rtol=1e-5, atol=0)
    assert clip.measured() == {}, "measurements reset after the step"
    layer0 = model.blocks[0].attn
    name = "uq_proj" if case == "mla" else ("k_proj" if case == "q_eq_k" else "q_proj")
    head_rows = getattr(layer0, name).weight.size(0) // 4
    under = (~(measured[0] > tau)).nonzero().flatten().tolist()
    for h in under:  # heads under the cap are left alone
        rows = slice(h * head_rows, (h + 1) * head_rows)
        assert torch.equal(getattr(layer0, name).weight[rows], weights[f"blocks.0.attn.{name}.weight"][rows])
    stats = clip.stats()
    assert stats["optim/qk_clip/clipped_heads/layer_00"].item() == int((measured[0] > tau).sum())


def test_validation_forwards_are_not_measured():
    model = sharp_model("mha")
    clip = QKClip(model, tau_clip=1.0)
    idx = torch.randint(0, 64, (2, 16))
    model.eval()
    with torch.no_grad():
        model(idx)
    model.train()
    with torch.no_grad():
        model(idx)
    assert clip.measured() == {}
    model(idx)
    assert sorted(clip.measured()) == [0, 1]


def test_lightning_run_caps_logits():
    L.seed_everything(0, verbose=False)
    config = ModelConfig(vocab_size=64, n_layer=2, n_embd=32, n_head=4, block_size=16)
    module = LitLM(config, OptimConfig(lr=3e-2, warmup_steps=1, logit_control={"method": "qk_clip", "tau_clip": 2.0}))
    data = DataLoader(torch.randint(0, 64, (24, 17)), batch_size=4)
    trainer = tiny_trainer(max_steps=6, precision="bf16-mixed", enable_checkpointing=False, log_every_n_steps=1)
    trainer.fit(module, data)
    stats = module.logit_control.stats()
    assert set(stats) == {f"optim/qk_clip/{k}/layer_{i:02d}" for k in ("max_logit", "clipped_heads") for i in (0, 1)}
    assert all(torch.isfinite(v) for v in stats.values())
