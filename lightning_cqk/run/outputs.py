"""Where a config's callbacks, loggers and profilers may write: inside their own run directory, nowhere else.

A callback, logger or profiler that a config, a flag or a sweep spec instantiates writes files: Lightning's
`ModelCheckpoint(dirpath=..., filename=...)`, a profiler's `dirpath`/`filename`, a second logger's `save_dir`, the
package's own `filename` settings (spikes.json, nonfinite.json). Given another run's folder, `--trainer.callbacks+=
'{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"dirpath": "<another run>/checkpoints",
"filename": "last"}}'` overwrote that run's `last.ckpt` (issue 45 item 4); in a sweep spec's shared overrides every
run would write into one folder. `output_problems` finds, in the plain settings (before anything is built), every
such setting that leaves the run directory, naming its key; the command line (`cli/trainer.py`) and the sweep
(`study/design/spec.py`, for every run of a spec) refuse them before any run starts (`OutsideRunDirectory`).

The rules, for each entry of `trainer.callbacks`, `trainer.profiler` and every logger but the run's own (the one
TensorBoard logger whose `save_dir`/`name`/`version` *are* the run directory):

- a directory setting (`dirpath`, `save_dir`, `log_dir`, `dir`, `root_dir`, `output_dir`, `path`, ...) is read as
  the library does, relative to the working directory, and must lie inside the run directory (unset: the default,
  which is inside it); a URL (`s3://...`) is outside it;
- a file name setting (`filename`, `sub_dir`, a second logger's `name` and `version`) is relative to its folder: it
  may not be absolute nor hold a `..` component;
- Lightning's own checkpoint callbacks (`ModelCheckpoint`, `OnExceptionCheckpoint`) are refused whatever their
  settings, naming the package's equivalent: `RunCheckpoint` (periodic files and `last.ckpt`, atomic, RNG state,
  SIGTERM saves) or `BestCheckpoint` (the best finite monitored score, saved after its validation).

Standard library only: the sweep checks its runs' settings with it before anything is imported.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

from lightning_cqk.errors import ConfigError

#: Settings that name a folder or file path, read relative to the working directory.
DIRECTORY_KEYS = frozenset(
    {"dirpath", "save_dir", "log_dir", "logdir", "dir", "root_dir", "output_dir", "path", "filepath",
     "exclude_batches_path", "artifact_location", "tracking_uri"}
)  # fmt: skip
#: Settings that name a file or sub-folder relative to its component's folder.
NAME_KEYS = frozenset({"filename", "sub_dir"})
#: A logger's run name parts, relative to its `save_dir`.
LOGGER_NAME_KEYS = frozenset({"name", "version"})
#: Lightning's checkpoint callbacks, with the package's equivalent.
LIGHTNING_CHECKPOINTS = {
    "ModelCheckpoint": "lightning_cqk.callbacks.RunCheckpoint (periodic files and last.ckpt) or "
    "lightning_cqk.callbacks.BestCheckpoint (the best monitored score)",
    "OnExceptionCheckpoint": "lightning_cqk.callbacks.RunCheckpoint (save_on_sigterm saves on SIGTERM and Ctrl-C)",
}
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_RUN_LOGGER = "TensorBoardLogger"


class OutsideRunDirectory(ConfigError):
    """A callback, logger or profiler setting that would write outside the run's own directory (module docstring)."""


@dataclass(frozen=True)
class Component:
    """One class a config instantiates: the key it sits at (`trainer.callbacks[2]`), its class path and settings."""

    key: str
    class_path: str
    init_args: dict[str, Any]
    kind: str  # callback | logger | profiler


def plain(value: Any) -> Any:
    """A jsonargparse Namespace tree (or a YAML/JSON string of one) as plain dicts and lists."""
    if hasattr(value, "as_dict") and type(value).__name__ == "Namespace":
        return value.as_dict()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def components(trainer: dict[str, Any], prefix: str = "trainer") -> Iterator[Component]:
    """Every callback, logger and profiler of a plain `trainer` section that names a class."""
    for field, kind in (("callbacks", "callback"), ("logger", "logger"), ("profiler", "profiler")):
        value = plain(trainer.get(field))
        entries = value if isinstance(value, list) else [value]
        for i, entry in enumerate(entries):
            if isinstance(entry, dict) and isinstance(entry.get("class_path"), str):
                key = f"{prefix}.{field}[{i}]" if isinstance(value, list) else f"{prefix}.{field}"
                yield Component(key, entry["class_path"], dict(entry.get("init_args") or {}), kind)


def is_run_logger(component: Component) -> bool:
    """The run's own logger: the one TensorBoard logger at `trainer.logger` (its folder is the run directory)."""
    return component.key.endswith(".logger") and component.class_path.rsplit(".", 1)[-1] == _RUN_LOGGER


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def output_problems(
    trainer: dict[str, Any], run_dir: str | Path | None, cwd: str | Path | None = None, prefix: str = "trainer"
) -> list[str]:
    """One sentence per setting of `trainer` (plain settings) that writes outside `run_dir` (None: the run has no
    directory, so no explicit output path is accepted), or names a Lightning checkpoint callback."""
    root = None if run_dir is None else Path(os.path.realpath(Path(cwd or os.getcwd()) / run_dir))
    problems = []
    for c in components(trainer, prefix):
        short = c.class_path.rsplit(".", 1)[-1]
        if c.class_path.startswith(("lightning.", "pytorch_lightning.")) and short in LIGHTNING_CHECKPOINTS:
            problems.append(
                f"{c.key} is Lightning's {short} ({c.class_path}), which writes where its settings say, outside the "
                f"package's atomic checkpoints, retention and resume: use {LIGHTNING_CHECKPOINTS[short]} instead "
                "(docs/instruments.md; configs/quickstart.yaml has both)"
            )
            continue
        if c.kind == "logger" and is_run_logger(c):
            continue
        for arg, value in c.init_args.items():
            if value is None or value == "" or not isinstance(value, (str, os.PathLike)):
                continue
            key, text = f"{c.key}.init_args.{arg}", str(value)
            name_like = arg in NAME_KEYS or (c.kind == "logger" and arg in LOGGER_NAME_KEYS)
            if name_like:
                parts = PurePath(text).parts
                if PurePath(text).is_absolute() or ".." in parts or _URL.match(text):
                    problems.append(f"{key} {text!r} leaves its folder (an absolute path or a '..')")
            elif arg in DIRECTORY_KEYS:
                if _URL.match(text) and not text.startswith("file://"):
                    problems.append(f"{key} {text!r} is a remote location, outside the run directory")
                    continue
                local = text.removeprefix("file://") if text.startswith("file://") else text
                where = Path(os.path.realpath(Path(cwd or os.getcwd()) / os.path.expanduser(local)))
                if root is None:
                    problems.append(f"{key} {text!r} names a folder, and this run has no run directory to hold it")
                elif not _inside(where, root):
                    problems.append(f"{key} {text!r} is outside this run's directory {root}")
    return problems


def refuse_outside_outputs(
    trainer: dict[str, Any], run_dir: str | Path | None, where: str = "", cwd: str | Path | None = None
) -> None:
    """Raise `OutsideRunDirectory` listing every problem of `output_problems` (nothing when there is none)."""
    problems = output_problems(plain(trainer), run_dir, cwd)
    if problems:
        at = f"{where}: " if where else ""
        raise OutsideRunDirectory(
            f"{at}a callback, logger or profiler writes only inside its own run directory, and "
            + "; ".join(problems)
            + ". Remove the setting (each writes into the run directory by default: checkpoints into "
            "<run directory>/checkpoints, profiles and JSON records beside the run's logs), or give a path inside "
            "the run directory. Nothing was started."
        )


def run_trainer_settings(configs: list[str], overrides: dict[str, Any]) -> dict[str, Any]:
    """The callbacks, logger and profiler of a run given as `--config` files and `--key=value` overrides (a sweep's
    run), as `lightning_cqk fit` would read them: the files in order (a later file's list replaces an earlier one's),
    then the overrides (`trainer.callbacks+` appends, `trainer.profiler.init_args.dirpath` sets one setting)."""
    import yaml

    trainer: dict[str, Any] = {}
    for config in configs:
        try:
            data = yaml.safe_load(Path(config).read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue  # a missing or broken file is the sweep's own error to report
        section = data.get("trainer") if isinstance(data, dict) else None
        for field in ("callbacks", "logger", "profiler"):
            if isinstance(section, dict) and field in section:
                trainer[field] = section[field]
    for key, value in overrides.items():
        parts = str(key).split(".")
        if len(parts) < 2 or parts[0] != "trainer":
            continue
        field, append = parts[1].rstrip("+"), parts[1].endswith("+")
        if field not in ("callbacks", "logger", "profiler"):
            continue
        value = load_value(value)
        if len(parts) > 2 and isinstance(trainer.get(field), dict):
            node = trainer[field] = dict(trainer[field])
            rest = parts[2:] if parts[2] in ("init_args", "class_path") else ["init_args", *parts[2:]]
            for part in rest[:-1]:
                node[part] = dict(node.get(part) or {})
                node = node[part]
            node[rest[-1]] = value
        elif append:
            before = trainer.get(field)
            before = before if isinstance(before, list) else ([] if before in (None, False) else [before])
            trainer[field] = [*before, *(value if isinstance(value, list) else [value])]
        elif len(parts) == 2:
            trainer[field] = value
    return trainer


def refuse_shared_outputs(runs: list[Any], sweep_dir: str | Path, where: str) -> None:
    """Every run of a sweep writes only inside its own directory (`sweep_dir / run.name`): a spec whose configs or
    overrides point a callback, logger or profiler elsewhere (into one folder for all its runs) is refused."""
    for run in runs:
        refuse_outside_outputs(
            run_trainer_settings(run.configs, run.overrides), Path(sweep_dir) / run.name, f"{where}: run {run.name}"
        )


def load_value(text: Any) -> Any:
    """A flag's or an override's value: YAML/JSON text parsed (a dict or list), anything else as it is."""
    if isinstance(text, str) and text.strip()[:1] in ("{", "["):
        try:
            return json.loads(text)
        except ValueError:
            import yaml

            try:
                return yaml.safe_load(text)
            except yaml.YAMLError:
                return text
    return text
