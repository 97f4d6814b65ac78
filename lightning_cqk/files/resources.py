"""Where the shipped configs live: the working directory first, then the copy installed with the package.

The repository keeps its YAML at the top level (`configs/**/*.yaml`: training configs, `configs/attention`,
`configs/papers`, `configs/glue`, the sweep specs of `configs/ablations`; `callbacks/*.yaml`: instrument stacks).
The wheel ships both as package data (`setup.py` maps them to `lightning_cqk.shipped.configs` and
`lightning_cqk.shipped.callbacks`), so an installed package runs `lightning_cqk fit --config configs/quickstart.yaml`
from any directory:

1. a path that exists (relative to the working directory, or absolute) is used as it is: a checkout, or your own
   copy of a config, always wins;
2. otherwise a path starting with `configs/` or `callbacks/` is looked up in the installed package data;
3. otherwise `ConfigNotFound` says what was looked for, where, and the closest shipped names.

A source checkout run with `PYTHONPATH` (no install) has no package data: run it from the checkout's root.
Tests: `tests/unit/files/test_resources.py`, `tests/e2e/test_wheel.py`.
"""

from __future__ import annotations

import difflib
import importlib.util
from pathlib import Path

#: The top-level folders that ship as package data, and the module each is installed as.
SHIPPED = {"configs": "lightning_cqk.shipped.configs", "callbacks": "lightning_cqk.shipped.callbacks"}


class ConfigNotFound(FileNotFoundError):
    """A config path that is neither in the working directory nor shipped with the package."""


def shipped_root(folder: str) -> Path | None:
    """The installed copy of a top-level folder (`configs` or `callbacks`), or None when the package has none.

    A wheel install has it as package data. An editable install (`pip install -e .`, what `make install` does) maps
    it to the source tree, but setuptools' editable finder cannot import a folder without `__init__.py` below a
    regular package, so there the folder is taken from the install's record of its source tree (`_editable_root`).
    """
    try:
        spec = importlib.util.find_spec(SHIPPED[folder])
    except ModuleNotFoundError:  # no lightning_cqk.shipped: a source checkout on PYTHONPATH, or an editable install
        spec = None
    if spec is not None and spec.submodule_search_locations:
        root = Path(next(iter(spec.submodule_search_locations)))
        if root.is_dir():
            return root
    editable = _editable_root()
    if editable is not None and (editable / folder).is_dir():
        return editable / folder
    return None


def _editable_root() -> Path | None:
    """The source tree of an editable install of lightning-cqk (PEP 610 `direct_url.json`), if the imported package
    is that tree's (not, say, another checkout put first on PYTHONPATH)."""
    import json
    import urllib.parse
    from importlib import metadata

    import lightning_cqk

    try:
        info = json.loads(metadata.distribution("lightning-cqk").read_text("direct_url.json") or "null")
    except (metadata.PackageNotFoundError, ValueError):
        return None
    if not isinstance(info, dict) or not (info.get("dir_info") or {}).get("editable"):
        return None
    url = urllib.parse.urlparse(str(info.get("url", "")))
    if url.scheme != "file":
        return None
    root = Path(urllib.parse.unquote(url.path)).resolve()
    return root if Path(lightning_cqk.__file__).resolve().is_relative_to(root) else None


def shipped_names(folder: str) -> list[str]:
    """Every shipped YAML of a folder, as the path one passes (e.g. `configs/attention/mla.yaml`)."""
    root = shipped_root(folder)
    if root is None:
        return []
    return sorted(f"{folder}/{p.relative_to(root).as_posix()}" for p in root.rglob("*.yaml"))


def find_config(path: str | Path) -> Path:
    """The file (or folder) a config path names: as given if it exists, else the shipped copy; else ConfigNotFound."""
    given = Path(path)
    if given.exists():
        return given
    parts = given.parts
    if not given.is_absolute() and len(parts) > 1 and parts[0] in SHIPPED:
        root = shipped_root(parts[0])
        if root is not None and root.joinpath(*parts[1:]).exists():
            return root.joinpath(*parts[1:])
    raise ConfigNotFound(_not_found_message(str(path)))


def _not_found_message(path: str) -> str:
    where = f"No file {path} (looked in the working directory {Path.cwd()}"
    folder = Path(path).parts[0] if Path(path).parts else ""
    if folder in SHIPPED:
        if shipped_root(folder) is None and not Path(folder).is_dir():
            where += (
                "; this lightning_cqk has no shipped configs: it runs from a source checkout without being installed, "
                "so run it from the checkout's root or `pip install` it)."
            )
        elif shipped_root(folder) is None:
            where += ")."
        else:
            where += " and in the configs shipped with the package)."
            close = difflib.get_close_matches(path, shipped_names(folder), n=3, cutoff=0.5)
            if close:
                where += f" Did you mean {' or '.join(close)}?"
    else:
        where += "). Give a path to an existing file, or a shipped one such as configs/quickstart.yaml."
    return where


def resolve_config_args(argv: list[str]) -> list[str]:
    """`argv` with every `--config PATH` that is not in the working directory pointed at the shipped copy.

    A path found nowhere raises ConfigNotFound (the CLI prints its message alone).
    """
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--config" and i + 1 < len(out):
            out[i + 1] = _resolved(out[i + 1])
        elif arg.startswith("--config="):
            out[i] = "--config=" + _resolved(arg[len("--config=") :])
    return out


def _resolved(value: str) -> str:
    if value.lstrip().startswith(("{", "[")) or Path(value).exists():  # inline YAML, or a file that is there
        return value
    return str(find_config(value))
