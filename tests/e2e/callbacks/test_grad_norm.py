"""GradNormMonitor: pre-clip norms equal a manual computation, in total, per group and per block."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch

from lightning_cqk.callbacks import GradNormMonitor
from lightning_cqk.callbacks.grad_norm_computer import GROUPS, GradNormComputer, param_group, param_groups
from lightning_cqk.model import GPT

# Independent of `param_group`: which substrings of a standard GPT's parameter names make each group.
MANUAL_GROUPS = {
    "q": (".attn.q_proj.",),
    "k": (".attn.k_proj.",),
    "v": (".attn.v_proj.",),
    "out": (".attn.out_proj.",),
    "mlp": (".mlp.",),
    "embeddings": ("wte.",),
    "norms": ("norm_1.", "norm_2.", "norm_f."),
}


class GradCapture(L.Callback):
    """Runs after the monitor in the same hook: keeps the gradients it saw (pre-clip) and the ones after clipping."""

    def __init__(self) -> None:
        self.pre: dict[int, dict[str, torch.Tensor]] = {}
        self.post: dict[int, dict[str, torch.Tensor]] = {}

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        grads = {n: p.grad.detach().clone() for n, p in pl_module.named_parameters() if p.grad is not None}
        self.pre[trainer.global_step] = grads

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        grads = {n: p.grad.detach().clone() for n, p in pl_module.named_parameters() if p.grad is not None}
        self.post[trainer.global_step - 1] = grads


def norm_of(grads: dict[str, torch.Tensor], keep=lambda name: True) -> float:
    chosen = [g.double().flatten() for n, g in grads.items() if keep(n)]
    return torch.cat(chosen).norm().item()


def test_norms_equal_manual_computation_before_clipping(make_module, make_trainer, token_loader):
    monitor, capture = GradNormMonitor(every_n_steps=1), GradCapture()
    trainer, logger = make_trainer([monitor, capture], max_steps=3, gradient_clip_val=1e-3)
    trainer.fit(make_module(), token_loader())
    step = 2
    grads = capture.pre[step]
    logged = logger.at(step)
    total = norm_of(grads)
    assert logged["train/grad_norm/total"] == pytest.approx(total, rel=1e-5)
    assert total > 10 * 1e-3, "the test needs clipping to change the gradients"
    assert norm_of(capture.post[step]) == pytest.approx(1e-3, rel=1e-3), "clipping happened after the monitor"
    for group, parts in MANUAL_GROUPS.items():
        expected = norm_of(grads, lambda n, parts=parts: any(p in n for p in parts))
        assert logged[f"train/grad_norm/{group}"] == pytest.approx(expected, rel=1e-5), group
    for block in (0, 1):
        expected = norm_of(grads, lambda n, block=block: f"blocks.{block}." in n)
        assert logged[f"train/grad_norm/block_{block:02d}"] == pytest.approx(expected, rel=1e-5)
    assert "train/grad_norm/backend" not in logged, "standard has no backend-specific parameters"


def test_logging_interval(make_module, make_trainer, token_loader):
    trainer, logger = make_trainer([GradNormMonitor(every_n_steps=3)], max_steps=7)
    trainer.fit(make_module(), token_loader())
    assert sorted(logger.series("train/grad_norm/total")) == [2, 5]


@pytest.mark.parametrize(
    "attention", ["standard", "mla", "coupled", "differential", "mlp", "non_approximate", "static_emb_qk"]
)
def test_every_parameter_in_one_known_group(attention: str, tiny_config):
    torch.manual_seed(0)
    model = GPT(tiny_config(attention))
    model(torch.randint(0, 64, (2, 16))).square().mean().backward()
    groups = param_groups(model)
    assert "other" not in groups.values(), {n: g for n, g in groups.items() if g == "other"}
    norms = GradNormComputer(model).norms()
    squares = sum(v.item() ** 2 for k, v in norms.items() if k in GROUPS)
    assert math.sqrt(squares) == pytest.approx(norms["total"].item(), rel=1e-5)
    assert norms["total"].item() == pytest.approx(norm_of({n: p.grad for n, p in model.named_parameters()}), rel=1e-5)


def test_group_names(tiny_config):
    groups = {}
    for attention in ("standard", "mla", "coupled", "differential"):
        groups.update(param_groups(GPT(tiny_config(attention))))
    assert groups["blocks.0.attn.q_proj.weight"] == "q"
    assert groups["blocks.0.attn.uk_proj.weight"] == "k"
    assert groups["blocks.0.attn.dq_proj.weight"] == "q"
    assert groups["blocks.0.attn.uv_proj.weight"] == "v"
    assert groups["blocks.0.attn.qk_transform.dynamics.w1"] == "backend"
    assert groups["blocks.0.attn.lambda_q1"] == "backend"
    assert groups["blocks.0.attn.subln.weight"] == "norms"
    assert groups["blocks.0.attn.out_proj.weight"] == "out"
    assert param_group("model.blocks.0.mlp.fc.weight") == "mlp"
    assert param_group("model.wte.weight") == "embeddings"


def test_finite_under_bf16_mixed(make_module, make_trainer, token_loader):
    monitor = GradNormMonitor(every_n_steps=1)
    trainer, _ = make_trainer([monitor], max_steps=2, precision="bf16-mixed")
    trainer.fit(make_module(), token_loader())
    assert monitor.latest and all(math.isfinite(v) and v > 0 for v in monitor.latest.values())
