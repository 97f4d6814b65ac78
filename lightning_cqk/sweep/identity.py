"""What a study run *is*, whatever its levels are called: the identity that lets no run be computed twice.

A run of a sweep is `lightning_cqk fit` with some `--config` files, some `--key=value` overrides and a seed. Two runs
whose resolved training configurations are equal train the same model on the same batches: on one machine, with the
same code and packages, they give the same numbers to the last digit (training is deterministic). The identity is
the sha256 of that resolved configuration, computed without Lightning or jsonargparse:

- the `--config` files' YAML merged in order (mappings merged key by key, anything else replaced), then the
  overrides applied as dotted keys;
- keys compared as the parser resolves them: `init_args` levels are dropped (`data.batch_size` and
  `data.init_args.batch_size` are one setting), so two spellings of one setting are one key;
- what only says where a run writes (`trainer.logger`: save_dir, name, version) and how its console looks
  (`INERT_KEYS`) left out; the seed kept;
- a value that names another run of the same sweep (`budget.match_to: <sweep>/<run>`, from `{run:<level>}`)
  replaced by that run's identity, so a study's name in a path never makes two identical runs different.

What a run's numbers depend on beyond its configuration is recorded beside the identity, never hashed into it: the
code revision, the package versions and the device (`device_info.describe_device`). A finished run is reused as it
is only where all three agree; otherwise its numbers are adopted only after one run per arm reproduces them to the
last digit on the machine at hand (runner.py).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

# Keys that change where a run writes or what its console shows, never what it computes.
INERT_KEYS = ("trainer.logger", "trainer.enable_progress_bar", "trainer.enable_model_summary")


def canonical_key(key: str) -> str:
    """A dotted key as the parser resolves it, `init_args` levels dropped (`data.init_args.seq_len`: `data.seq_len`)."""
    return ".".join(part for part in key.split(".") if part != "init_args")


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{canonical dotted key: leaf value} of a YAML tree; lists and `class_path` stay values of their key."""
    if not isinstance(tree, Mapping) or not tree:
        return {canonical_key(prefix): tree} if prefix else {}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        out.update(_flatten(value, path))
    return out


def _drop_under(settings: dict[str, Any], key: str) -> None:
    """Remove `key` and everything below it (an override replaces the whole subtree it names)."""
    for existing in [k for k in settings if k == key or k.startswith(key + ".")]:
        del settings[existing]


def resolved_settings(
    configs: list[str], overrides: Mapping[str, Any], read: Callable[[str], str | None] | None = None
) -> dict[str, Any]:
    """{canonical dotted key: value}: the config files merged in order, then the overrides, inert keys left out.

    `read(path)` gives a config file's text (default: the file on disk; None for a missing file, which is kept as
    its path so that a run of a missing config never matches one of an existing config).
    """
    read = read or _read_file
    settings: dict[str, Any] = {}
    for config in configs:
        text = read(config)
        if text is None:
            settings[f"<missing config {config}>"] = True
            continue
        for key, value in _flatten(yaml.safe_load(text) or {}).items():
            settings[key] = value
    for key, value in overrides.items():
        key = canonical_key(key)
        _drop_under(settings, key)
        settings.update(_flatten(value, key) if isinstance(value, Mapping) and value else {key: value})
    for key in INERT_KEYS:
        _drop_under(settings, key)
    return settings


def _read_file(path: str) -> str | None:
    file = Path(path)
    return file.read_text() if file.is_file() else None


def run_identity(
    configs: list[str],
    overrides: Mapping[str, Any],
    seed: int,
    read: Callable[[str], str | None] | None = None,
) -> str:
    """sha256 (16 hex digits) of the resolved training configuration and the seed (module docstring)."""
    what = {"settings": resolved_settings(configs, overrides, read), "seed": int(seed)}
    blob = json.dumps(what, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def replace_run_paths(overrides: Mapping[str, Any], sweep_dir: Path, identities: Mapping[str, str]) -> dict[str, Any]:
    """Overrides with every value that names a run directory of this sweep replaced by `run:<that run's identity>`."""
    prefix = str(sweep_dir).rstrip("/") + "/"
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        if isinstance(value, str) and value.startswith(prefix):
            name = value[len(prefix) :].split("/", 1)[0]
            if name in identities:
                value = f"run:{identities[name]}"
        out[key] = value
    return out


def result_dir(sweep_dir: str | Path, name: str) -> Path:
    """Where the numbers of run `name` of a sweep are: its own directory, or, for a run the runner did not compute
    again, the run it shares (its status file's `same_as`: a run of this sweep; `reused_from`: a sibling sweep's)."""
    sweep_dir = Path(sweep_dir)
    status_file = sweep_dir / "status" / f"{name}.json"
    try:
        status = json.loads(status_file.read_text()) if status_file.is_file() else {}
    except ValueError:
        status = {}
    if status.get("same_as"):
        return sweep_dir / str(status["same_as"])
    if status.get("reused_from"):
        return Path(status["reused_from"])
    return sweep_dir / name
