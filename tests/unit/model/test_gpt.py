"""GPT model: shapes, causality, init loss, parameter counts of the presets, init scaling."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lightning_cqk.model import GPT
from lightning_cqk.model_config import PRESETS, ModelConfig

# Counted by hand from the shapes: embedding V*C; per layer 4*C^2 (attention) + 2*C*H (MLP) + 2*C (LayerNorm
# weights); final LayerNorm C. GPT-2 vocabulary, tied embeddings, no biases.
EXPECTED_PARAMS = {
    "tiny": 7_220_480,
    "60m": 57_199_616,
    "150m": 151_868_928,
    "350m": 353_503_232,
}


def hand_count(preset: str, vocab: int = 50257) -> int:
    p = PRESETS[preset]
    C, H, L = p["n_embd"], p["mlp_hidden"], p["n_layer"]
    return vocab * C + L * (4 * C * C + 2 * C * H + 2 * C) + C


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_parameter_counts(preset):
    assert hand_count(preset) == EXPECTED_PARAMS[preset]
    with torch.device("meta"):
        model = GPT(ModelConfig(preset=preset))
    counts = model.num_parameters()
    assert counts["total"] == EXPECTED_PARAMS[preset]
    assert counts["non_embedding"] == EXPECTED_PARAMS[preset] - 50257 * PRESETS[preset]["n_embd"]


def test_untied_and_learned_positions_count_as_embedding():
    cfg = ModelConfig(vocab_size=100, tie_embeddings=False, position="learned", block_size=32)
    model = GPT(cfg)
    counts = model.num_parameters()
    assert counts["embedding"] == 2 * 100 * cfg.n_embd + 32 * cfg.n_embd
    assert counts["total"] == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("position", ["rope", "learned", "none"])
@pytest.mark.parametrize("norm,mlp", [("layernorm", "gelu"), ("rmsnorm", "swiglu")])
def test_forward_shape_and_causality(position, norm, mlp):
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=61, n_layer=2, n_embd=32, n_head=4, block_size=16, position=position, norm=norm, ffn=mlp
    )
    model = GPT(cfg).double().eval()
    idx = torch.randint(0, 61, (2, 16))
    logits = model(idx)
    assert logits.shape == (2, 16, 61)
    t = 7
    perturbed = idx.clone()
    perturbed[:, t + 1 :] = torch.randint(0, 61, (2, 16 - t - 1))
    assert not torch.equal(perturbed, idx)
    out = model(perturbed)
    torch.testing.assert_close(out[:, : t + 1], logits[:, : t + 1], rtol=0, atol=0)
    assert not torch.allclose(out[:, t + 1 :], logits[:, t + 1 :])


def test_loss_at_init_is_log_vocab():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=257)
    model = GPT(cfg)
    idx = torch.randint(0, 257, (4, 64))
    logits = model(idx)
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, 257), idx[:, 1:].reshape(-1))
    assert abs(loss.item() - math.log(257)) < 0.1


def test_residual_projections_get_scaled_init():
    torch.manual_seed(0)
    cfg = ModelConfig(preset="60m", vocab_size=1000, n_layer=8)
    model = GPT(cfg)
    expected = 0.02 / math.sqrt(2 * 8)
    for block in model.blocks:
        assert abs(block.attn.out_proj.weight.std().item() - expected) < 0.1 * expected
        assert abs(block.mlp.out_proj.weight.std().item() - expected) < 0.1 * expected
        assert abs(block.attn.q_proj.weight.std().item() - 0.02) < 0.002


def test_sequence_longer_than_block_size_is_refused():
    model = GPT(ModelConfig(vocab_size=10, block_size=8))
    with pytest.raises(ValueError, match="block_size"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_checkpoint_keys_are_plain():
    model = GPT(ModelConfig(vocab_size=10))
    keys = list(model.state_dict())
    assert all("_orig_mod" not in k for k in keys)
    assert not any("rope" in k for k in keys), "RoPE tables are derived from the config, not saved"
