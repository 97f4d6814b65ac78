"""Size presets through the CLI: a preset gives its documented shape, and a shape field you set still wins.

`LitLM`'s `config: ModelConfig = ModelConfig()` default would give the parser every shape field of the `tiny` preset
as a default (the dataclass instance is already resolved), so `--model.config.preset 60m` met `n_layer: 4` and built
the small model. `unset_shape_defaults` makes the parser's defaults of the shape fields None ("from the preset"),
so `ModelConfig.__post_init__` fills exactly the fields nobody set, after every config file and flag is merged
(`preset_shape`, last writer wins for the preset and for each field alike).

`PresetArgumentParser.dump` shows the resolved shape in what the CLI prints and saves (`--print_config`, the run's
`config.yaml`): a field left to the preset appears with the preset's value, so the printed config is the model that
is built, and re-running from a saved `config.yaml` builds the same model. (`block_size` is not filled here: the CLI
links it to `data.seq_len`.)

Tests: `tests/e2e/test_cli_presets.py`.
"""

from __future__ import annotations

from typing import Any

from jsonargparse import Namespace

from lightning_cqk.cli.hints import HintingArgumentParser
from lightning_cqk.model_config import PRESETS, SHAPE_FIELDS, preset_shape

#: Where the CLI keeps the model config (LitLM's `config` argument).
MODEL_CONFIG_KEY = "model.config"

#: The shape fields a parser default would otherwise fix (block_size is a link target, set from data.seq_len).
_FILLED = tuple(name for name in SHAPE_FIELDS if name != "block_size")


def unset_shape_defaults(prefix: str = MODEL_CONFIG_KEY) -> dict[str, None]:
    """Parser defaults that leave every preset-filled shape field unset (None), for `parser.set_defaults`."""
    return {f"{prefix}.{name}": None for name in _FILLED}


def resolve_shape_in(cfg: Namespace, prefix: str = MODEL_CONFIG_KEY) -> Namespace:
    """A copy of a parsed config whose unset shape fields hold the preset's values (cfg itself when nothing to do)."""
    section = cfg.get(prefix) if isinstance(cfg, Namespace) else None
    if not isinstance(section, Namespace) or section.get("preset") not in PRESETS:
        return cfg
    missing = [name for name in _FILLED if section.get(name) is None]
    if not missing:
        return cfg
    shape = preset_shape(section.preset, **{name: section.get(name) for name in _FILLED})
    cfg = cfg.clone()
    for name in missing:
        cfg[f"{prefix}.{name}"] = shape[name]
    return cfg


class PresetArgumentParser(HintingArgumentParser):
    """The CLI's parser: did-you-mean errors (`HintingArgumentParser`) and the resolved model shape when dumping."""

    def dump(self, cfg: Namespace, *args: Any, **kwargs: Any) -> str:  # type: ignore[override]
        return super().dump(resolve_shape_in(cfg), *args, **kwargs)
