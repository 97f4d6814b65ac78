"""Model configuration: names and numbers only, so configs and checkpoints stay plain YAML.

`ModelConfig` describes a GPT-style decoder. Classes are never stored here: the attention backend is a *name* looked
up in `lightning_cqk.attention` (with its options as a plain dict), and the norm / MLP / position encoding are
names resolved by the model code. Size presets fill the shape fields that were left unset::

    ModelConfig(preset="60m")                      # 10 layers, d=512, 8 heads, d_ff=2048
    ModelConfig(preset="60m", n_layer=6)           # any field you set wins over the preset
    ModelConfig(preset="tiny", n_embd=256)         # mlp_hidden follows n_embd: 1024 (4x), unless set
    ModelConfig.from_preset("tiny", attention="coupled", attention_options={"steps": 2})

Parameter counts of the presets (GPT-2 vocabulary, 50,257 tokens, tied embeddings, RoPE, LayerNorm, GELU MLP,
no biases; checked by `tests/unit/model/test_gpt.py`):

=======  =======  ======  ======  ==========  ===========  =============  ==========
preset   n_layer  n_embd  n_head  mlp_hidden  total        non-embedding  embedding
=======  =======  ======  ======  ==========  ===========  =============  ==========
tiny     4        128     4       512         7,220,480    787,584        6,432,896
60m      10       512     8       2048        57,199,616   31,468,032     25,731,584
150m     16       768     12      3072        151,868,928  113,271,552    38,597,376
350m     24       1024    16      4096        353,503,232  302,040,064    51,463,168
=======  =======  ======  ======  ==========  ===========  =============  ==========

The `tiny` preset is meant for the byte tokenizer (vocab 257), where it has 820,480 parameters in total. The paper
configurations of arXiv 2604.01683 are not published; these shapes are the GPT-2-style placeholders that
`docs/papers.md` section 1.4 proposes for the 60M / 150M / 350M sizes.
"""

from __future__ import annotations

import difflib
import warnings
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal

from lightning_cqk.errors import ConfigError

NormName = Literal["layernorm", "rmsnorm"]
FFNName = Literal["gelu", "swiglu"]
PositionName = Literal["rope", "learned", "none"]
ResidualInit = Literal["scaled", "plain"]

#: Shape presets. `block_size` is the longest context the model supports; the CLI links it to `data.seq_len`.
PRESETS: dict[str, dict[str, int]] = {
    "tiny": dict(n_layer=4, n_head=4, n_embd=128, mlp_hidden=512, block_size=256),
    "60m": dict(n_layer=10, n_head=8, n_embd=512, mlp_hidden=2048, block_size=1024),
    "150m": dict(n_layer=16, n_head=12, n_embd=768, mlp_hidden=3072, block_size=1024),
    "350m": dict(n_layer=24, n_head=16, n_embd=1024, mlp_hidden=4096, block_size=1024),
}

GPT2_VOCAB_SIZE = 50257

#: The fields a preset fills when they are unset (None). `block_size` is linked to `data.seq_len` by the CLI.
SHAPE_FIELDS = ("n_layer", "n_head", "n_embd", "mlp_hidden", "block_size")

#: Short names of the shape fields in run labels (`size_label`): 60m with n_layer=6 is `60m-L6`.
_LABELS = {"n_layer": "L", "n_head": "H", "n_embd": "d", "mlp_hidden": "ff"}


def preset_shape(preset: str, **given: int | None) -> dict[str, int]:
    """The shape a preset gives, with every field in `given` that is not None winning over the preset's value.

    `mlp_hidden` follows `n_embd` unless set: it keeps the preset's ratio (4 x n_embd in every preset), so
    `tiny` with `n_embd=256` has a 1024-wide MLP, not the preset's absolute 512.

    The single rule used by `ModelConfig` and by the CLI (the resolved config it prints and saves, the run name), so
    what is shown is what is built.
    """
    if preset not in PRESETS:
        raise ConfigError(_unknown("preset", preset, PRESETS))
    shape = {key: value if given.get(key) is None else int(given[key]) for key, value in PRESETS[preset].items()}
    if given.get("mlp_hidden") is None:
        shape["mlp_hidden"] = mlp_hidden_for(preset, shape["n_embd"])
    return shape


def mlp_hidden_for(preset: str, n_embd: int) -> int:
    """The MLP width a preset gives a model of width `n_embd`: the preset's mlp_hidden / n_embd ratio times it."""
    ratio = PRESETS[preset]["mlp_hidden"] / PRESETS[preset]["n_embd"]
    return max(1, round(ratio * n_embd))


def size_label(preset: str, **given: int | None) -> str:
    """A run-name label of the model's size: the preset, plus every shape field that differs from it.

    `size_label("60m")` is `60m`; `size_label("60m", n_layer=6)` is `60m-L6`; `size_label("tiny", n_layer=2,
    n_embd=64)` is `tiny-L2-d64`. `block_size` is left out (it follows data.seq_len); `mlp_hidden` is named only
    when it is not the width that follows `n_embd` (`tiny-d64-ff512`).
    """
    shape = preset_shape(preset, **given)
    follows = dict(PRESETS[preset], mlp_hidden=mlp_hidden_for(preset, shape["n_embd"]))
    changed = [f"{tag}{shape[key]}" for key, tag in _LABELS.items() if shape[key] != follows[key]]
    return "-".join([preset, *changed])


@dataclass
class LayerOverride:
    """Use another attention backend in some layers (hybrid models).

    Exactly one of `layers` and `pattern` selects the layers. A pattern is kept as written (it is resolved whenever
    the layers are needed), so `ModelConfig.replace(n_layer=...)` re-resolves it for the new depth.

    Attributes:
        layers: 0-based indices of the layers this override applies to.
        attention: registry name of the backend for those layers (keyword-only).
        pattern: instead of `layers`, a hybrid pattern resolved against `n_layer` by
            `lightning_cqk.attention.hybrid.resolve_layer_pattern`: a named pattern of arXiv 2510.11602 Table 11
            (even, odd, top, middle, bottom, 25%, first, last, bilateral) or 1-based layers such as "1-6,19-24".
        attention_options: that backend's options (replaces, does not merge with, the model-wide options).
    """

    layers: list[int] = field(default_factory=list)
    attention: str = field(kw_only=True)
    pattern: str | None = None
    attention_options: dict[str, Any] = field(default_factory=dict)

    def resolve(self, n_layer: int) -> list[int]:
        """The 0-based layers this override applies to in an `n_layer`-layer model."""
        if self.pattern is None:
            return list(self.layers)
        from lightning_cqk.attention.hybrid import resolve_layer_pattern

        return resolve_layer_pattern(self.pattern, n_layer)


@dataclass
class ModelConfig:
    """A GPT-style decoder: shape, components by name, and the attention backend by name.

    Attributes:
        preset: size preset that fills `n_layer`, `n_head`, `n_embd`, `mlp_hidden` and `block_size` when unset
            (an unset `mlp_hidden` follows `n_embd`: the preset's ratio, 4x, times n_embd; `preset_shape`).
        n_layer: number of transformer blocks.
        n_head: number of attention heads (backends may reinterpret, e.g. differential uses n_head/2 pairs).
        n_embd: model width C.
        mlp_hidden: hidden width of the MLP.
        block_size: longest sequence the model accepts (RoPE cache / learned position table size).
        vocab_size: tokenizer vocabulary size (the CLI links it to the data's tokenizer).
        vocab_multiple: the embedding table and output head have `padded_vocab_size` rows, vocab_size rounded up to
            a multiple of this (1: no padding). 64 gives the 50,304 rows of nanoGPT and of arXiv 2606.04032's models
            for the GPT-2 tokenizer (50,257). The extra rows are never a target; they count as parameters.
        norm: `layernorm` or `rmsnorm`; pre-norm blocks and a final norm.
        norm_eps: epsilon of the norms.
        ffn: the block's feed-forward network: `gelu` (GPT-2, two matrices) or `swiglu` (three matrices;
            `mlp_hidden` is used as given). Called `mlp` before; `mlp` is now only the attention backend's name.
        position: `rope` (rotary, half-split, applied inside attention), `learned` absolute, or `none`.
        rope_base: RoPE base frequency.
        dropout: the shorthand for the three dropouts below: each of them that is None (the default) uses it.
        embd_dropout: dropout on the block input (token embeddings plus learned positions); None: `dropout`.
        attn_dropout: dropout on the attention weights (the softmax maps); None: `dropout`.
        resid_dropout: dropout on every residual branch's output (attention and MLP output projections, i.e. what
            each block adds to the residual stream); None: `dropout`. GPT-2 / HF names: embd_pdrop, attn_pdrop,
            resid_pdrop (arXiv 2606.04032's models: 0, 0, 0.1).
        bias: biases in linear layers and LayerNorm.
        tie_embeddings: share the token embedding with the output head.
        init_std: std of the normal init of every linear and embedding weight.
        residual_init: "scaled" (GPT-2, the default): the projections that write into the residual stream (every
            `out_proj`) use init_std / sqrt(2 * n_layer); "plain": every linear layer N(0, init_std), as the official
            code of arXiv 2606.04032 (HF GPT-2 `_init_weights` without the scaled residual rule).
        attention: registry name of the attention backend (see `lightning_cqk.attention.available()`).
        attention_options: options of that backend (validated by the backend's `Options` dataclass).
        layer_overrides: per-layer backends for hybrid models; layers not listed use `attention`.
        mlp: deprecated spelling of `ffn` (configs and checkpoints of older versions): read as `ffn` with a
            FutureWarning, then reset to null. Write `ffn`.
    """

    preset: str = "tiny"
    n_layer: int | None = None
    n_head: int | None = None
    n_embd: int | None = None
    mlp_hidden: int | None = None
    block_size: int | None = None
    vocab_size: int = GPT2_VOCAB_SIZE
    vocab_multiple: int = 1
    norm: NormName = "layernorm"
    norm_eps: float = 1e-5
    ffn: FFNName = "gelu"
    position: PositionName = "rope"
    rope_base: float = 10000.0
    dropout: float = 0.0
    embd_dropout: float | None = None
    attn_dropout: float | None = None
    resid_dropout: float | None = None
    bias: bool = False
    tie_embeddings: bool = True
    init_std: float = 0.02
    residual_init: ResidualInit = "scaled"
    attention: str = "standard"
    attention_options: dict[str, Any] = field(default_factory=dict)
    layer_overrides: list[LayerOverride] = field(default_factory=list)
    mlp: FFNName | None = None  # deprecated: `ffn` (see RENAMED_FIELDS)

    def __post_init__(self) -> None:
        self._take_renamed_fields()
        shape = preset_shape(self.preset, **{key: getattr(self, key) for key in SHAPE_FIELDS})
        for key, value in shape.items():
            setattr(self, key, value)
        self.layer_overrides = [o if isinstance(o, LayerOverride) else LayerOverride(**o) for o in self.layer_overrides]
        self._validate()

    @classmethod
    def from_preset(cls, preset: str, **overrides: Any) -> ModelConfig:
        """Build a config from a size preset, with any field overridden."""
        return cls(preset=preset, **overrides)

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the embedding table and the output head: vocab_size rounded up to a multiple of vocab_multiple."""
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

    @property
    def embd_dropout_p(self) -> float:
        """Dropout on the block input: `embd_dropout`, or `dropout` when that is None."""
        return self.dropout if self.embd_dropout is None else self.embd_dropout

    @property
    def attn_dropout_p(self) -> float:
        """Dropout on the attention weights: `attn_dropout`, or `dropout` when that is None."""
        return self.dropout if self.attn_dropout is None else self.attn_dropout

    @property
    def resid_dropout_p(self) -> float:
        """Dropout on the residual branches' outputs: `resid_dropout`, or `dropout` when that is None."""
        return self.dropout if self.resid_dropout is None else self.resid_dropout

    @property
    def head_size(self) -> int:
        """Width of one attention head, n_embd // n_head."""
        return self.n_embd // self.n_head

    def attention_for_layer(self, layer_idx: int) -> tuple[str, dict[str, Any]]:
        """The (backend name, options) used by block `layer_idx`."""
        for override in self.layer_overrides:
            if layer_idx in override.resolve(self.n_layer):
                return override.attention, dict(override.attention_options)
        return self.attention, dict(self.attention_options)

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (YAML/JSON serialisable), without the deprecated field names (RENAMED_FIELDS)."""
        return upgrade_config_dict(asdict(self))

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed."""
        return replace(self, **changes)

    def _take_renamed_fields(self) -> None:
        """Move a value given under an old field name (RENAMED_FIELDS) to the new one, with a FutureWarning."""
        for old, new in RENAMED_FIELDS.items():
            value = getattr(self, old)
            if value is None:
                continue
            default = next(f.default for f in fields(self) if f.name == new)
            if getattr(self, new) not in (default, value):
                raise ConfigError(
                    f"ModelConfig.{old} is the old name of {new}, and both are set ({old}={value!r}, "
                    f"{new}={getattr(self, new)!r}); keep only {new}."
                )
            warnings.warn(
                f"ModelConfig.{old} is renamed {new} (`{old}` also names an attention backend): {old}={value!r} is "
                f"read as {new}={value!r}. Write `{new}: {value}` in the config (--model.config.{new} {value}).",
                FutureWarning,
                stacklevel=4,
            )
            setattr(self, new, value)
            setattr(self, old, None)

    def _validate(self) -> None:
        for name in ("n_layer", "n_head", "n_embd", "mlp_hidden", "block_size", "vocab_size"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"ModelConfig.{name} must be positive, got {getattr(self, name)}.")
        if self.n_embd % self.n_head:
            heads = [h for h in range(1, min(self.n_embd, 64) + 1) if self.n_embd % h == 0]
            nearest = min(heads, key=lambda h: (abs(h - self.n_head), -h))
            width = self.n_head * max(1, round(self.n_embd / self.n_head))
            raise ConfigError(
                f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}: every head needs the same width. "
                f"Use --model.config.n_head {nearest} (n_head may be any of {heads}), or "
                f"--model.config.n_embd {width} to keep {self.n_head} heads."
            )
        if self.position == "rope" and self.head_size % 2:
            raise ConfigError(f"RoPE needs an even head size, got n_embd/n_head = {self.head_size}.")
        for name in ("dropout", "embd_dropout", "attn_dropout", "resid_dropout"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value < 1.0:
                null = "" if name == "dropout" else " or null (use dropout)"
                raise ConfigError(f"{name} must be in [0, 1){null}, got {value}.")
        if self.residual_init not in ("scaled", "plain"):
            raise ConfigError(
                f"residual_init={self.residual_init!r} is not 'scaled' (GPT-2) or 'plain' (N(0, init_std))."
            )
        if isinstance(self.vocab_multiple, bool) or not isinstance(self.vocab_multiple, int) or self.vocab_multiple < 1:
            raise ConfigError(
                f"vocab_multiple must be a positive integer (1: no padding), got {self.vocab_multiple!r}."
            )
        seen: dict[int, int] = {}
        for i, override in enumerate(self.layer_overrides):
            if override.pattern is not None:
                if override.layers:
                    raise ConfigError(
                        f"layer_overrides[{i}] sets both layers={override.layers} and pattern={override.pattern!r}; "
                        "set only one of them."
                    )
                try:
                    override.resolve(self.n_layer)
                except ValueError as err:
                    raise ConfigError(f"layer_overrides[{i}].pattern: {err}") from None
            elif not override.layers:
                raise ConfigError(f"layer_overrides[{i}] lists no layers: set `layers` (0-based) or `pattern`.")
            for layer in override.resolve(self.n_layer):
                if not 0 <= layer < self.n_layer:
                    raise ConfigError(
                        f"layer_overrides[{i}] names layer {layer}, but the model has layers 0..{self.n_layer - 1} "
                        "(indices are 0-based)."
                    )
                if layer in seen:
                    raise ConfigError(f"layer {layer} appears in layer_overrides[{seen[layer]}] and [{i}].")
                seen[layer] = i
        # Backends are validated here, at config time, so a typo fails before any data is prepared.
        from lightning_cqk.attention import validate_attention

        for layer_idx in range(self.n_layer):
            name, options = self.attention_for_layer(layer_idx)
            validate_attention(name, options, self, layer_idx)


RENAMED_FIELDS = {"mlp": "ffn"}
"""Old ModelConfig field names and their new ones: still accepted (with a FutureWarning) when given."""


def upgrade_config_dict(config: dict[str, Any]) -> dict[str, Any]:
    """A ModelConfig dict of an older version (a checkpoint's hyper-parameters, a run's config.yaml) in today's
    field names, silently: a non-null old name's value replaces the new name's (as `ModelConfig` reads it); a null
    old name is dropped."""
    config = dict(config)
    for old, new in RENAMED_FIELDS.items():
        if old in config:
            value = config.pop(old)
            if value is not None:
                config[new] = value
    return config


def upgrade_run_config(run_config: dict[str, Any]) -> dict[str, Any]:
    """A whole run configuration (`model: config: ...`) with its ModelConfig upgraded (`upgrade_config_dict`)."""
    model = run_config.get("model") if isinstance(run_config, dict) else None
    if isinstance(model, dict) and isinstance(model.get("config"), dict):
        return {**run_config, "model": {**model, "config": upgrade_config_dict(model["config"])}}
    return run_config


def _unknown(kind: str, value: str, choices: Any) -> str:
    choices = sorted(choices)
    close = difflib.get_close_matches(str(value), choices, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return f"Unknown {kind} {value!r}.{hint} Choices: {', '.join(choices)}."
