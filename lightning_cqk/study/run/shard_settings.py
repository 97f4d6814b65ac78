"""Which runs may prepare token shards at the same time (lightning_cqk/study/run/runner.py schedules by it): a run
prepares missing shards itself, so the first run of each distinct data setting runs alone unless its data_dir already
holds finished shards."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from lightning_cqk.study.design.spec import Run

NOT_SHARDS = frozenset({"data.seed", "data.batch_size", "data.val_batch_size", "data.num_workers"})


def config_data_section(config: str) -> dict[str, Any] | None:
    """The `data:` section of a --config file ({} when it has none; None when unreadable)."""
    try:
        loaded = yaml.safe_load(Path(config).read_text())
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(loaded, dict):
        return None
    data = loaded.get("data")
    return data if isinstance(data, dict) else {}


def data_key(run: Run) -> str:
    """What decides the shards a run prepares: the config files with a `data:` section (or unreadable ones) and the
    data overrides, except the seed and batch sizes. Runs of one key never prepare shards at the same time."""
    configs = [c for c in run.configs if config_data_section(c) != {}]
    data = {k: v for k, v in run.overrides.items() if k.startswith("data.") and k not in NOT_SHARDS}
    return json.dumps({"configs": configs, "data": data}, sort_keys=True)


def shards_ready(run: Run) -> bool:
    """The run's local data_dir holds finished shards (prepare writes manifest.json last), so it prepares nothing."""
    data_dir = None
    for config in run.configs:
        section = config_data_section(config) or {}
        data_dir = (section.get("init_args") or {}).get("data_dir", section.get("data_dir", data_dir))
    for key in ("data.data_dir", "data.init_args.data_dir"):
        data_dir = run.overrides.get(key, data_dir)
    if not isinstance(data_dir, str) or "://" in data_dir:
        return False  # remote shards: their run checks them (no object-store calls in the scheduling loop)
    from lightning_cqk.data.manifest import Manifest

    return Manifest.exists(data_dir)  # the same test as TokenDataModule.prepare_data
