"""The attention registry: names, errors, option validation, config-time failures."""

from __future__ import annotations

import pytest

from lightning_cqk import attention
from lightning_cqk.attention import ATTENTION_BACKENDS, AttentionBackend
from lightning_cqk.model import GPT
from lightning_cqk.model_config import LayerOverride, ModelConfig


def test_available_lists_registered_backends():
    assert attention.available() == sorted(ATTENTION_BACKENDS)
    assert "standard" in attention.available()
    for name, cls in ATTENTION_BACKENDS.items():
        assert issubclass(cls, AttentionBackend)
        assert cls.name == name
        assert cls.__doc__ and cls.__module__ and __import__(cls.__module__, fromlist=["x"]).__doc__


def test_unknown_backend_fails_at_config_time_listing_choices():
    with pytest.raises(ValueError) as err:
        ModelConfig(attention="standrad")
    msg = str(err.value)
    assert "standrad" in msg and "Did you mean 'standard'" in msg
    for name in attention.available():
        assert name in msg


def test_unknown_option_is_refused_with_suggestion():
    with pytest.raises(ValueError, match="Did you mean 'impl'"):
        ModelConfig(attention_options={"impll": "math"})


def test_layer_overrides_select_backend_per_layer():
    cfg = ModelConfig(
        n_layer=3,
        vocab_size=11,
        layer_overrides=[LayerOverride(layers=[1], attention="standard", attention_options={"impl": "math"})],
    )
    model = GPT(cfg)
    impls = [block.attn.options.impl for block in model.blocks]
    assert impls == ["sdpa", "math", "sdpa"]


@pytest.mark.parametrize(
    "overrides,match",
    [
        ([{"layers": [5], "attention": "standard"}], "0-based"),
        ([{"layers": [0], "attention": "standard"}, {"layers": [0], "attention": "standard"}], "appears in"),
        ([{"layers": [], "attention": "standard"}], "no layers"),
        ([{"layers": [1], "attention": "nope"}], "Available backends"),
    ],
)
def test_invalid_layer_overrides(overrides, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(n_layer=3, layer_overrides=overrides)


def test_impossible_shapes():
    with pytest.raises(ValueError, match="not divisible"):
        ModelConfig(n_embd=30, n_head=4)
    with pytest.raises(ValueError, match="Unknown preset"):
        ModelConfig(preset="huge")


def test_built_ins_are_found_in_the_catalogue_folders():
    """The registry walks attention/'s folders: backends/, transforms/ (the coupling files) and kernels/ apart."""
    from lightning_cqk.attention.registry import TRANSFORMS

    assert ATTENTION_BACKENDS["standard"].__module__ == "lightning_cqk.attention.backends.standard"
    assert ATTENTION_BACKENDS["coupled"].__module__ == "lightning_cqk.attention.transforms.coupled"
    assert TRANSFORMS.builtins["invertible"].__module__ == "lightning_cqk.attention.transforms.coupling"


@pytest.mark.parametrize(
    "path, name",
    [
        ("lightning_cqk.attention.standard:StandardAttention", "standard"),
        ("lightning_cqk.attention.mla:MultiHeadLatentAttention", "mla"),
    ],
)
def test_a_path_recorded_before_the_catalogue_folders_names_the_same_class(path, name):
    """A config or checkpoint that named a built-in by its old module path (before backends/ and transforms/) gets
    the same class, typed or read from a file (data: `recorded_by`)."""
    assert attention.get_attention(path) is ATTENTION_BACKENDS[name]
    with attention.recorded_by("the checkpoint x"):
        assert attention.get_attention(path) is ATTENTION_BACKENDS[name]
