"""Hybrid layer patterns (arXiv 2510.11602 Table 11): resolution, errors, and hybrid models built from them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import yaml

from lightning_cqk.attention import get_attention
from lightning_cqk.attention.hybrid import NAMED_PATTERNS, pattern_names, resolve_layer_pattern
from lightning_cqk.model import GPT
from lightning_cqk.model_config import LayerOverride, ModelConfig

# Table 11 of the paper, verbatim: the 1-based layers that keep standard attention in its 24-layer model.
TABLE_11 = {
    "even": list(range(2, 25, 2)),
    "odd": list(range(1, 24, 2)),
    "top": list(range(1, 13)),
    "middle": list(range(1, 7)) + list(range(19, 25)),
    "bottom": list(range(13, 25)),
    "25%": [4, 8, 12, 16, 20, 24],
    "first": [1],
    "last": [24],
    "bilateral": [1, 24],
}

CONFIG_DIR = Path(__file__).resolve().parents[3] / "configs" / "attention"


@pytest.mark.parametrize("name", sorted(TABLE_11))
def test_named_patterns_at_24_layers_equal_table_11(name):
    assert resolve_layer_pattern(name, 24) == [layer - 1 for layer in TABLE_11[name]]


def test_every_named_pattern_is_in_table_11():
    assert set(pattern_names()) == set(TABLE_11) == set(NAMED_PATTERNS)


def test_named_patterns_generalise_to_other_depths():
    assert resolve_layer_pattern("even", 10) == [1, 3, 5, 7, 9]
    assert resolve_layer_pattern("odd", 5) == [0, 2, 4]
    assert resolve_layer_pattern("top", 10) == [0, 1, 2, 3, 4]
    assert resolve_layer_pattern("top", 5) == [0, 1]  # halves keep n_layer // 2 standard layers
    assert resolve_layer_pattern("bottom", 5) == [3, 4]
    assert resolve_layer_pattern("middle", 10) == [0, 1, 8, 9]
    assert resolve_layer_pattern("25%", 10) == [3, 7]
    assert resolve_layer_pattern("last", 10) == [9]
    assert resolve_layer_pattern("bilateral", 1) == [0]
    assert resolve_layer_pattern("EVEN", 4) == [1, 3]  # names are case-insensitive


def test_explicit_sets_and_ranges_are_one_based():
    assert resolve_layer_pattern("1,3,5", 6) == [0, 2, 4]
    assert resolve_layer_pattern("1-6,19-24", 24) == [0, 1, 2, 3, 4, 5, 18, 19, 20, 21, 22, 23]
    assert resolve_layer_pattern(" 4 , 1 - 2 ", 4) == [0, 1, 3]
    assert resolve_layer_pattern("3", 3) == [2]


@pytest.mark.parametrize(
    "pattern,n_layer,match",
    [
        ("evens", 24, r"Unknown layer pattern 'evens'\. Named patterns: even, odd, top, middle, bottom, 25%, first"),
        ("0,1", 4, r"Layer 0 .* out of range: layers are 1-based, 1\.\.4"),
        ("1-25", 24, r"Layer 25 .* out of range: layers are 1-based, 1\.\.24"),
        ("6-3", 8, "runs backwards"),
        ("1,2,2", 4, "appears more than once"),
        ("1-3,3", 4, "appears more than once"),
        ("1,,2", 4, "Cannot read ''"),
        ("1-2-3", 4, "Cannot read '1-2-3'"),
        ("", 4, "Empty layer pattern"),
        ("25%", 3, "selects no layer in a 3-layer model"),
        ("top", 1, "selects no layer"),
    ],
)
def test_pattern_errors_are_readable(pattern, n_layer, match):
    with pytest.raises(ValueError, match=match):
        resolve_layer_pattern(pattern, n_layer)


def test_layer_override_by_pattern_builds_the_right_backend_per_layer():
    cfg = ModelConfig(
        vocab_size=31,
        n_layer=6,
        n_embd=32,
        n_head=4,
        block_size=16,
        attention="non_approximate",
        layer_overrides=[LayerOverride(pattern="even", attention="standard")],
    )
    model = GPT(cfg)
    names = [type(block.attn).name for block in model.blocks]
    assert names == ["non_approximate", "standard"] * 3
    assert model(torch.randint(0, 31, (2, 16))).shape == (2, 16, 31)


def test_pattern_overrides_from_plain_dicts_and_several_backends():
    cfg = ModelConfig(
        vocab_size=31,
        n_layer=4,
        n_embd=32,
        n_head=4,
        block_size=16,
        attention="standard",
        layer_overrides=[
            {"pattern": "1", "attention": "approximate", "attention_options": {"normalization": "joint"}},
            {"pattern": "3-4", "attention": "mlp"},
        ],
    )
    model = GPT(cfg)
    assert [type(b.attn).name for b in model.blocks] == ["approximate", "standard", "mlp", "mlp"]
    assert model.blocks[0].attn.options.normalization == "joint"


def test_pattern_is_re_resolved_when_the_depth_changes():
    cfg = ModelConfig(n_layer=4, vocab_size=11, layer_overrides=[LayerOverride(pattern="last", attention="mlp")])
    assert [cfg.attention_for_layer(i)[0] for i in range(4)] == ["standard", "standard", "standard", "mlp"]
    deeper = cfg.replace(n_layer=6)
    assert [deeper.attention_for_layer(i)[0] for i in range(6)] == ["standard"] * 5 + ["mlp"]
    assert deeper.to_dict()["layer_overrides"][0]["pattern"] == "last"


@pytest.mark.parametrize(
    "override,match",
    [
        ({"pattern": "even", "layers": [1], "attention": "standard"}, "sets both layers"),
        ({"pattern": "odds", "attention": "standard"}, r"layer_overrides\[0\]\.pattern: Unknown layer pattern"),
        ({"pattern": "2,5", "attention": "standard"}, r"1\.\.4"),
        ({"attention": "standard"}, "lists no layers"),
        ({"pattern": "even", "attention": "standrad"}, "Did you mean 'standard'"),
    ],
)
def test_invalid_pattern_overrides_fail_at_config_time(override, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(n_layer=4, vocab_size=11, layer_overrides=[override])


def test_patterns_and_layers_may_not_overlap():
    with pytest.raises(ValueError, match="appears in layer_overrides"):
        ModelConfig(
            n_layer=4,
            vocab_size=11,
            layer_overrides=[{"pattern": "even", "attention": "mlp"}, {"layers": [1], "attention": "mlp"}],
        )


@pytest.mark.parametrize("path", sorted(CONFIG_DIR.glob("hybrid_*.yaml")), ids=lambda p: p.name)
def test_shipped_hybrid_configs_build_and_run(path):
    fragment = yaml.safe_load(path.read_text())["model"]["config"]
    cfg = ModelConfig(preset="tiny", vocab_size=257, n_layer=4, block_size=32, **fragment)
    model = GPT(cfg)
    names = [type(b.attn).name for b in model.blocks]
    assert names == [fragment["attention"], "standard"] * 2
    cls = get_attention(fragment["attention"])
    assert fragment["attention_options"] == dataclasses.asdict(cls.Options())  # every option, at its default
    logits = model(torch.randint(0, 257, (1, 32)))
    assert torch.isfinite(logits).all()
