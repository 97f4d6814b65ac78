"""optim.name muon: the Muon/AdamW split, steps equal torch.optim.Muon + AdamW used directly, QuacK on Muon's update,
exact resume through Lightning, and a clear refusal to resume another optimizer's state."""

from __future__ import annotations

import copy

import lightning as L
import pytest
import torch
from tiny_run import tiny_trainer
from torch.utils.data import DataLoader

from lightning_cqk.model import GPT
from lightning_cqk.model_config import ModelConfig
from lightning_cqk.module import LitLM
from lightning_cqk.optim import MuonAdamW, OptimConfig, QuacK, build_optimizer, muon_split, weight_decay_groups

HS = 8


def tiny(attention: str = "standard", **kw) -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, n_layer=2, n_embd=32, n_head=4, block_size=16, attention=attention, **kw)
    return GPT(cfg)


def test_split_hidden_matrices_to_muon_everything_else_to_adamw():
    model = tiny(bias=True, position="learned", tie_embeddings=False)
    params, names = muon_split(model)
    assert all(p.dim() == 2 for p in params)
    assert not any(n.startswith(("wte", "wpe", "lm_head")) for n in names)
    expected = {f"blocks.{i}.{m}.weight" for i in range(2) for m in ("attn.q_proj", "attn.k_proj", "attn.v_proj")}
    expected |= {f"blocks.{i}.{m}.weight" for i in range(2) for m in ("attn.out_proj", "mlp.up_proj", "mlp.out_proj")}
    assert set(names) == expected
    opt = build_optimizer(model, OptimConfig(name="muon"), fused=False)
    assert [g["name"] for g in opt.param_groups] == ["muon", "decay", "no_decay"]
    adamw = {id(p) for g in opt.adamw.param_groups for p in g["params"]}
    assert {id(model.wte.weight), id(model.lm_head.weight), id(model.wpe.weight)} <= adamw
    assert sum(p.numel() for g in opt.param_groups for p in g["params"]) == model.num_parameters()["total"]
    # Coupled: its per-head MLP banks are 3-D (AdamW); its bias banks are 2-D but biases (AdamW).
    coupled = tiny("coupled")
    _, names = muon_split(coupled)
    assert not any(n.rsplit(".", 1)[-1] in ("b1", "b2") for n in names)


def direct_reference(model: GPT, cfg: OptimConfig) -> list[torch.optim.Optimizer]:
    """torch.optim.Muon and torch.optim.AdamW built by hand on the same split, as the torch docs show."""
    muon_params, _ = muon_split(model)
    chosen = {id(p) for p in muon_params}
    m = cfg.muon
    muon = torch.optim.Muon(
        muon_params, lr=cfg.lr, weight_decay=cfg.weight_decay, momentum=m.momentum, nesterov=m.nesterov,
        ns_steps=m.ns_steps, adjust_lr_fn=m.adjust_lr_fn,
    )  # fmt: skip
    groups = [{**g, "params": [p for p in g["params"] if id(p) not in chosen]} for g in weight_decay_groups(model, 0.1)]
    adamw = torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)
    return [muon, adamw]


@pytest.mark.parametrize("adjust_lr_fn", ["match_rms_adamw", "original"])
def test_steps_equal_torch_muon_and_adamw_used_directly(adjust_lr_fn: str):
    cfg = OptimConfig(name="muon", lr=2e-2, muon={"adjust_lr_fn": adjust_lr_fn})
    ours_model = tiny(bias=True)
    ref_model = copy.deepcopy(ours_model)
    ours = build_optimizer(ours_model, cfg, fused=False)
    refs = direct_reference(ref_model, cfg)
    sched = torch.optim.lr_scheduler.LambdaLR(ours, lambda s: 1.0 / (s + 1))
    ref_scheds = [torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1.0 / (s + 1)) for o in refs]
    torch.manual_seed(1)
    batches = [torch.randint(0, 64, (2, 16)) for _ in range(3)]
    for idx in batches:
        for model, step in ((ours_model, lambda: ours.step()), (ref_model, lambda: [o.step() for o in refs])):
            model(idx).square().mean().backward()
            step()
            model.zero_grad()
        sched.step()
        for s in ref_scheds:
            s.step()
    for (name, a), b in zip(ours_model.named_parameters(), ref_model.parameters(), strict=True):
        assert torch.equal(a, b), name
    # The wrapper's state dict is the standard format, one entry per parameter that has state.
    assert len(ours.state_dict()["state"]) == sum(len(o.state) for o in refs)
    assert ours.param_groups[0]["lr"] == pytest.approx(2e-2 / 4)  # the schedule reaches the Muon group (3 steps)


def test_skipped_step_changes_nothing():
    model = tiny()
    opt = build_optimizer(model, OptimConfig(name="muon"), fused=False)
    model(torch.randint(0, 64, (2, 16))).square().mean().backward()
    opt.step()
    before = copy.deepcopy(opt.state_dict())
    weights = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = None  # what NonFiniteGuard does with a bad step
    opt.step()
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))
    after = opt.state_dict()
    for key, state in before["state"].items():
        for k, v in state.items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(after["state"][key][k]))


@pytest.mark.parametrize("scale_weight_decay", [True, False])
def test_quack_scales_each_heads_muon_update(scale_weight_decay: bool):
    """Per-head QuacK factor on W_Q^h applied to the update torch.optim.Muon makes, against a direct computation;
    without scale_weight_decay only Muon's orthogonalised step is scaled, the decay keeps the scheduled rate."""
    torch.manual_seed(0)
    model = tiny()
    tau = 0.7
    control = QuacK(model, tau=tau, scale_weight_decay=scale_weight_decay)  # init norms recorded here
    with torch.no_grad():
        model.blocks[0].attn.k_proj.weight[2 * HS : 3 * HS] *= 2.0  # head 2's key grows: its query slows down
        model.blocks[1].attn.q_proj.weight[1 * HS : 2 * HS] *= 3.0  # layer 1 head 1's query grows: its key slows down
    ref_model = copy.deepcopy(model)
    cfg = OptimConfig(name="muon", lr=1e-2)
    opt = build_optimizer(model, cfg, fused=False)
    ref = torch.optim.Muon(muon_split(ref_model)[0], lr=1e-2, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    idx = torch.randint(0, 64, (2, 16))
    for m in (model, ref_model):
        m(idx).square().mean().backward()
    init = tiny()  # the same seed: the initial weights whose norms QuacK recorded
    control.before_step(opt)
    opt.step()
    control.after_step(opt)
    before = {n: p.detach().clone() for n, p in ref_model.named_parameters()}
    ref.step()
    ours, plain, init = (dict(m.named_parameters()) for m in (model, ref_model, init))
    factors = []
    for layer in range(2):
        for role, partner in (("q", "k"), ("k", "q")):
            name = f"blocks.{layer}.attn.{role}_proj.weight"
            partner_name = f"blocks.{layer}.attn.{partner}_proj.weight"
            for h in range(4):
                rows = slice(h * HS, (h + 1) * HS)
                # lr(W_Q^h) = tau eta |W_K^h|_0 / |W_K^h| (and the mirror rule), norms before the step.
                factor = tau * init[partner_name][rows].norm() / before[partner_name][rows].norm()
                decayed = before[name][rows] * (1 - 1e-2 * 0.1)  # theta (1 - lr wd), as torch's Muon
                if scale_weight_decay:
                    expected = before[name][rows] + factor * (plain[name][rows] - before[name][rows])
                else:
                    expected = decayed + factor * (plain[name][rows] - decayed)
                torch.testing.assert_close(ours[name][rows], expected, rtol=1e-5, atol=1e-8, msg=f"{name} head {h}")
                factors.append(float(factor.detach()))
    assert factors[2] == pytest.approx(tau / 2, rel=1e-4) and factors[12 + 1] == pytest.approx(tau / 3, rel=1e-4)
    assert not torch.allclose(ours["blocks.0.attn.q_proj.weight"], plain["blocks.0.attn.q_proj.weight"])
    for name, p in ours.items():  # every other Muon matrix: exactly torch's update
        if p.dim() == 2 and "q_proj" not in name and "k_proj" not in name and not name.startswith("wte"):
            assert torch.equal(p, plain[name]), name


def fit(tmp_path, max_steps: int, ckpt: str | None = None, optim: OptimConfig | None = None) -> tuple[LitLM, L.Trainer]:
    L.seed_everything(0, verbose=False)
    config = ModelConfig(vocab_size=64, n_layer=2, n_embd=32, n_head=4, block_size=16)
    optim = optim or OptimConfig(
        name="muon", lr=1e-2, warmup_steps=2, decay_steps=6, logit_control={"method": "quack", "tau": 0.5}
    )
    module = LitLM(config, optim)
    trainer = tiny_trainer(
        max_steps=max_steps, enable_checkpointing=False, default_root_dir=tmp_path, gradient_clip_val=0.5
    )
    torch.manual_seed(5)
    # One batch, repeated: which batch a resumed epoch starts from (a plain DataLoader is not resumable) cannot matter.
    data = DataLoader(torch.randint(0, 64, (4, 17)).repeat(3, 1), batch_size=4)
    trainer.fit(module, data, ckpt_path=ckpt)
    return module, trainer


def test_resume_equals_uninterrupted_run_with_clipping_schedule_and_quack(tmp_path):
    full, _ = fit(tmp_path / "full", 6)
    half, trainer = fit(tmp_path / "half", 3)
    assert isinstance(trainer.optimizers[0], MuonAdamW)
    path = str(tmp_path / "half.ckpt")
    trainer.save_checkpoint(path)
    groups = torch.load(path, weights_only=False)["optimizer_states"][0]["param_groups"]
    assert [g["name"] for g in groups] == ["muon", "decay", "no_decay"]
    resumed, trainer = fit(tmp_path / "resumed", 6, ckpt=path)
    for (name, a), b in zip(full.named_parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b), name
    assert trainer.optimizers[0].param_groups[0]["lr"] == trainer.lr_scheduler_configs[0].scheduler.get_last_lr()[0]
    # Resuming this Muon checkpoint as an AdamW run is refused with the fix.
    with pytest.raises(ValueError, match="--model.optim.name muon"):
        fit(tmp_path / "other", 6, ckpt=path, optim=OptimConfig(lr=1e-2, warmup_steps=2, decay_steps=6))


def test_qk_clip_through_lightning_under_muon(tmp_path):
    """LitLM.optimizer_step with MuonAdamW and QK-clip: after the step every head peaks at tau_clip on its batch
    (a negligible learning rate isolates the clipping from Muon's own update; one layer, so that clipping a layer
    below does not change the input the checked layer sees)."""
    L.seed_everything(0, verbose=False)
    config = ModelConfig(vocab_size=64, n_layer=1, n_embd=32, n_head=4, block_size=16)
    clip = {"method": "qk_clip", "tau_clip": 0.01}
    optim = OptimConfig(name="muon", lr=1e-12, warmup_steps=1, decay_steps=4, logit_control=clip)
    module = LitLM(config, optim)
    batch = torch.randint(0, 64, (4, 17))
    trainer = tiny_trainer(max_steps=1, enable_checkpointing=False, default_root_dir=tmp_path)  # fmt: skip
    trainer.fit(module, DataLoader(batch, batch_size=4))
    assert isinstance(trainer.optimizers[0], MuonAdamW)
    module.train()
    module.loss(batch)  # a training forward: the hooks measure the per-head max logits again
    measured = module.logit_control.measured()
    assert list(measured) == [0]
    for layer, maxima in measured.items():
        torch.testing.assert_close(maxima, torch.full_like(maxima, 0.01), rtol=1e-4, atol=0, msg=f"layer {layer}")
