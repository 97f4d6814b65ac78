"""QuacK and the fixed Q/K factor: factors at init, the per-head rule, and the exact effect on an AdamW update."""

from __future__ import annotations

import copy
import math

import lightning as L
import pytest
import torch
from tiny_run import tiny_trainer
from torch.utils.data import DataLoader

from lightning_cqk.model import GPT
from lightning_cqk.model_config import ModelConfig
from lightning_cqk.module import LitLM
from lightning_cqk.optim import FixedQKFactor, OptimConfig, QuacK, build_logit_control, weight_decay_groups

HS = 8


def tiny(attention: str = "standard", **options) -> GPT:
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=64, n_layer=2, n_embd=32, n_head=4, block_size=16, attention=attention, attention_options=options
    )
    return GPT(config)


CASES = {
    "mha": ("standard", {}),
    "gqa": ("standard", {"n_kv_groups": 2}),
    "q_eq_k": ("standard", {"qkv_sharing": "q_eq_k"}),
    "coupled": ("coupled", {}),
    "differential": ("differential", {}),
    "mla": ("mla", {}),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("tau", [0.1, 1.0])
def test_every_factor_equals_tau_at_init(case: str, tau: float):
    attention, options = CASES[case]
    control = QuacK(tiny(attention, **options), tau=tau)
    factors = control.factors()
    assert len(factors) == len(control.targets) > 0
    for factor in factors:
        assert torch.allclose(factor, torch.full_like(factor, tau), rtol=1e-6)


def test_target_shapes():
    roles = [(t.role, t.n_blocks) for t in QuacK(tiny()).targets if t.layer == 0]
    assert roles == [("q", 4), ("k", 4)]
    assert [(t.role, t.n_blocks) for t in QuacK(tiny(n_kv_groups=2)).targets if t.layer == 0] == [("q", 4), ("k", 2)]
    assert [t.role for t in QuacK(tiny(qkv_sharing="q_eq_k")).targets if t.layer == 0] == ["qk"]
    mla = [(t.role, t.n_blocks) for t in QuacK(tiny("mla")).targets if t.layer == 1]
    assert mla == [("dq", 1), ("uq", 4), ("qr", 4), ("dkv", 1), ("uk", 4), ("kr", 1)]


def test_doubling_a_key_head_halves_that_query_head_only():
    model = tiny()
    control = QuacK(model, tau=0.5)
    with torch.no_grad():
        model.blocks[1].attn.k_proj.weight[1 * HS : 2 * HS] *= 2.0  # head 1 of layer 1
    factors = {(t.layer, t.role): f for t, f in zip(control.targets, control.factors(), strict=True)}
    assert torch.allclose(factors[(1, "q")], torch.tensor([0.5, 0.25, 0.5, 0.5]))
    for key in [(0, "q"), (0, "k"), (1, "k")]:
        assert torch.allclose(factors[key], torch.full((4,), 0.5)), key


def test_gqa_key_head_takes_the_largest_query_head():
    model = tiny(n_kv_groups=2)
    control = QuacK(model)
    with torch.no_grad():
        model.blocks[0].attn.q_proj.weight[3 * HS : 4 * HS] *= 4.0  # query head 3 reads K head 1
    n0 = model.blocks[0].attn.q_proj.weight.detach().view(4, -1).norm(dim=1)  # head 3 already scaled
    factors = {(t.layer, t.role): f for t, f in zip(control.targets, control.factors(), strict=True)}
    old_max, new_max = max(n0[2].item(), n0[3].item() / 4), max(n0[2].item(), n0[3].item())
    assert factors[(0, "k")][1].item() == pytest.approx(old_max / new_max, rel=1e-6)
    assert factors[(0, "k")][0].item() == pytest.approx(1.0)
    assert torch.allclose(factors[(0, "q")], torch.ones(4)), "the K weights did not change"


def adam_updates(scale_weight_decay: bool, lr: float = 3e-3, weight_decay: float = 0.1):
    """One AdamW step from identical states with and without QuacK; W_K head 2 of layer 0 doubled in both."""
    torch.manual_seed(0)
    base = tiny().double()
    control_model = copy.deepcopy(base)
    control = QuacK(control_model, tau=1.0, scale_weight_decay=scale_weight_decay)  # norms at init: this copy's
    for model in (base, control_model):
        with torch.no_grad():
            model.blocks[0].attn.k_proj.weight[2 * HS : 3 * HS] *= 2.0
    idx = torch.randint(0, 64, (2, 16))
    deltas = []
    for model, ctl in ((base, None), (control_model, control)):
        opt = torch.optim.AdamW(weight_decay_groups(model, weight_decay), lr=lr, betas=(0.9, 0.95))
        schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.37)  # factor composes with a schedule
        model(idx).square().mean().backward()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        if ctl is not None:
            ctl.before_step(opt)
        opt.step()
        if ctl is not None:
            ctl.after_step(opt)
        schedule.step()
        deltas.append({n: p.detach() - before[n] for n, p in model.named_parameters()})
        deltas[-1]["_before"] = before
    return deltas, lr * 0.37 * weight_decay


@pytest.mark.parametrize("scale_weight_decay", [True, False])
def test_adam_update_of_the_query_head_shrinks_by_its_factor(scale_weight_decay: bool):
    (plain, quack), decay = adam_updates(scale_weight_decay)
    name = "blocks.0.attn.q_proj.weight"
    rows = slice(2 * HS, 3 * HS)
    if scale_weight_decay:
        torch.testing.assert_close(quack[name][rows], 0.5 * plain[name][rows], rtol=1e-12, atol=0)
    else:  # only the Adam direction is halved; the decoupled decay keeps the scheduled rate
        w0 = plain["_before"][name][rows]
        torch.testing.assert_close(quack[name][rows], 0.5 * (plain[name][rows] + decay * w0) - decay * w0)
    others = torch.cat([plain[name][: 2 * HS], plain[name][3 * HS :]])
    torch.testing.assert_close(torch.cat([quack[name][: 2 * HS], quack[name][3 * HS :]]), others, rtol=1e-12, atol=0)
    for other in plain:
        if other not in (name, "_before"):
            torch.testing.assert_close(quack[other], plain[other], rtol=1e-12, atol=0, msg=other)


def test_skipped_update_stays_skipped():
    model = tiny()
    control = QuacK(model, scale_weight_decay=False)
    opt = torch.optim.AdamW(weight_decay_groups(model, 0.1), lr=1e-2)
    before = [p.detach().clone() for p in model.parameters()]
    control.before_step(opt)
    opt.step()  # no gradients at all
    control.after_step(opt)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_mla_rule():
    model = tiny("mla")
    control = QuacK(model, tau=1.0)
    attn = model.blocks[0].attn
    with torch.no_grad():
        attn.uk_proj.weight[2 * HS : 3 * HS] *= 3.0  # W_uk head 2
        attn.kr_proj.weight *= 2.0  # the shared rope key
    blocks = {"dq": 1, "uq": 4, "qr": 4, "dkv": 1, "uk": 4, "kr": 1}
    n = {name: getattr(attn, f"{name}_proj").weight.detach().reshape(b, -1).norm(dim=1) for name, b in blocks.items()}
    uk0 = n["uk"].clone()
    uk0[2] /= 3.0
    kr0 = n["kr"] / 2.0
    got = {t.role: f for t, f in zip(control.targets, control.factors(), strict=True) if t.layer == 0}
    torch.testing.assert_close(got["uq"], uk0 / n["uk"])  # (|W_dq| |W_uk^h| |W_dkv|)^-1, relative to init
    torch.testing.assert_close(got["qr"], torch.full((4,), 0.5))  # (|W_dq| |W_kr|)^-1
    torch.testing.assert_close(got["uk"], torch.ones(4))  # depends on W_uq, W_dq, W_dkv only
    dq = torch.minimum(1 / (n["uq"] * n["uk"] * n["dkv"]).amax(), 1 / (n["qr"] * n["kr"]).amax())
    dq0 = torch.minimum(1 / (n["uq"] * uk0 * n["dkv"]).amax(), 1 / (n["qr"] * kr0).amax())
    torch.testing.assert_close(got["dq"], (dq / dq0).reshape(1))
    torch.testing.assert_close(got["dkv"], ((n["uq"] * uk0).amax() / (n["uq"] * n["uk"]).amax()).reshape(1))
    torch.testing.assert_close(got["kr"], torch.ones(1))  # depends on W_qr, W_dq only
    assert min(f.min().item() for f in got.values()) < 1.0


def test_fixed_factor_ignores_the_weights():
    model = tiny("mla")
    control = FixedQKFactor(model, tau=0.1)
    with torch.no_grad():
        model.blocks[0].attn.uk_proj.weight.mul_(5.0)
    assert len(control.targets) == 12
    assert all(torch.allclose(f, torch.full_like(f, 0.1)) for f in control.factors())


def test_refuses_models_without_qk_heads():
    with pytest.raises(ValueError, match="per-head query and key"):
        QuacK(tiny("mlp"))


def test_lightning_run_bf16_checkpoint_and_off_is_unchanged(tmp_path):
    L.seed_everything(0, verbose=False)
    config = ModelConfig(vocab_size=64, n_layer=2, n_embd=32, n_head=4, block_size=16)
    optim = OptimConfig(lr=3e-2, warmup_steps=1, logit_control={"method": "quack", "tau": 0.5})
    module = LitLM(config, optim)
    raw0 = {k: v.clone() for k, v in module.state_dict().items() if k.startswith("logit_control.")}
    assert len(raw0) == 4  # q and k of two layers
    data = DataLoader(torch.randint(0, 64, (32, 17)), batch_size=4)
    trainer = tiny_trainer(max_steps=4, precision="bf16-mixed", default_root_dir=tmp_path, log_every_n_steps=2)
    trainer.fit(module, data)
    assert all(torch.isfinite(p).all() for p in module.parameters())
    stats = module.logit_control.stats()
    assert all(torch.isfinite(v) for v in stats.values()) and "optim/quack/q/layer_01" in stats
    assert stats["optim/quack/min"] < 0.5, "the Q/K norms grew at this learning rate"
    # The init norms travel with the checkpoint (a resumed run keeps them).
    ckpt = torch.load(trainer.checkpoint_callback.last_model_path or trainer.checkpoint_callback.best_model_path)
    L.seed_everything(1, verbose=False)
    restored = LitLM.load_from_checkpoint(trainer.checkpoint_callback.best_model_path)
    for key, value in raw0.items():
        assert torch.equal(restored.state_dict()[key], value) and torch.equal(ckpt["state_dict"][key], value)
    off = LitLM(config, OptimConfig())
    assert off.logit_control is None
    assert not any(k.startswith("logit_control") for k in off.state_dict())
    assert build_logit_control(off.model, OptimConfig().logit_control) is None
    assert math.isclose(optim.logit_control.tau, 0.5)


def test_lightning_applies_the_factor_to_qk_weights_only(tmp_path):
    """Through LitLM.optimizer_step (a LightningOptimizer): a tiny fixed factor freezes W_Q, W_K and nothing else."""
    L.seed_everything(0, verbose=False)
    config = ModelConfig(vocab_size=64, n_layer=2, n_embd=32, n_head=4, block_size=16)
    module = LitLM(config, OptimConfig(lr=1e-2, warmup_steps=1, logit_control={"method": "fixed", "tau": 1e-9}))
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    trainer = tiny_trainer(max_steps=3, enable_checkpointing=False, default_root_dir=tmp_path)
    trainer.fit(module, DataLoader(torch.randint(0, 64, (12, 17)), batch_size=4))
    for name, p in module.named_parameters():
        change = (p.detach() - before[name]).abs().max().item()
        if ".q_proj." in name or ".k_proj." in name:
            assert change < 1e-9, name
        elif name.endswith("weight") and p.dim() == 2:
            assert change > 1e-4, name
