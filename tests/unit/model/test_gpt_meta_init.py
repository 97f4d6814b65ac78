"""Meta-device construction + `GPT.materialize` gives exactly the weights of today's CPU construction (every shipped
attention config, the shared banks, tied embeddings), and activation checkpointing changes no number."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from lightning_cqk.model import GPT
from lightning_cqk.model_config import ModelConfig

ATTENTION_CONFIGS = sorted((Path(__file__).resolve().parents[3] / "configs" / "attention").glob("*.yaml"))
EXTRA = {  # compositions the shipped files do not cover: shared invertible banks, per-head dt, MLA + transform
    "invertible_shared": {
        "attention": "standard",
        "attention_options": {"qk_transform": {"kind": "invertible", "share_layers": True}},
    },
    "coupled_head_dt": {"attention": "coupled", "attention_options": {"dt_scope": "head", "share_dynamics": "layer"}},
}


def _config(overrides: dict) -> ModelConfig:
    return ModelConfig(preset="tiny", n_layer=3, n_head=2, n_embd=32, block_size=16, vocab_size=97, **overrides)


def _cases():
    for path in ATTENTION_CONFIGS:
        model = (yaml.safe_load(path.read_text()).get("model") or {}).get("config") or {}
        yield pytest.param(model, id=path.stem)
    for name, model in EXTRA.items():
        yield pytest.param(model, id=name)


@pytest.mark.parametrize("overrides", list(_cases()))
def test_meta_then_materialize_equals_cpu_build(overrides):
    torch.manual_seed(1234)
    cpu = GPT(_config(overrides))
    torch.manual_seed(1234)
    with torch.device("meta"):
        meta = GPT(_config(overrides))
    assert all(p.is_meta for p in meta.parameters())
    torch.manual_seed(999)  # the seed kept at construction decides, not the generator's state at materialisation
    meta.materialize("cpu")
    want = dict(cpu.named_parameters(remove_duplicate=False)) | dict(cpu.named_buffers(remove_duplicate=False))
    got = dict(meta.named_parameters(remove_duplicate=False)) | dict(meta.named_buffers(remove_duplicate=False))
    assert want.keys() == got.keys()
    for name, tensor in want.items():
        assert torch.equal(tensor, got[name]), name
    # parameters tied by identity stay tied (embedding/head, banks shared across layers)
    assert len({id(p) for p in meta.parameters()}) == len({id(p) for p in cpu.parameters()})
    x = torch.randint(0, 97, (2, 8))
    torch.testing.assert_close(meta(x), cpu(x), rtol=0, atol=0)


@pytest.mark.parametrize("attention", ["standard", "coupled", "differential"])
def test_activation_checkpointing_changes_no_number(attention):
    torch.manual_seed(0)
    model = GPT(_config({"attention": attention, "dropout": 0.1})).double()
    x = torch.randint(0, 97, (2, 12))
    grads = []
    for checkpointing in (False, True):
        model.activation_checkpointing = checkpointing
        model.zero_grad()
        torch.manual_seed(5)  # the same dropout masks: checkpoint replays the RNG state in its recomputation
        loss = model(x).logsumexp(-1).mean()
        loss.backward()
        grads.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (l0, g0), (l1, g1) = grads
    assert torch.equal(l0, l1)
    for a, b in zip(g0, g1, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
