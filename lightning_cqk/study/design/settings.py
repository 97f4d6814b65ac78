"""A run's configuration as `lightning_cqk fit` itself resolves it, asked of the CLI (the one resolver, issue 43).

The sweep sits below the command line (tests/test_import_graph.py), so it never imports the CLI's parser: it asks one
resolver process per sweep invocation (`python -m lightning_cqk.cli.resolve`, started on first use), as it asks
`lightning_cqk fit` to train a run. Each request is one JSON line, `{"configs", "overrides", "seed"}`, answered
`{"text": <the config.yaml that run would save>, "trusted": [...]}` (the modules a config may name beyond the
package's libraries, `$LIGHTNING_CQK_TRUSTED_MODULES`) or `{"error": <the parser's message>}`. Answers are cached per
arguments and config files' contents; `reset()` ends the process and forgets them (after code edits in one process).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml


class ConfigUnresolvable(ValueError):
    """The parser refused a run's configuration (its message is the parser's), or a config file is missing."""


_process: subprocess.Popen | None = None
_cache: dict[tuple, dict[str, Any]] = {}
_trusted: list[str] = []  # $LIGHTNING_CQK_TRUSTED_MODULES as the resolver read it (its last answer)


def reset() -> None:
    """End the resolver process and forget its answers (the code it imported may have changed)."""
    global _process
    if _process is not None:
        _process.stdin.close()
        _process.wait(timeout=30)
        _process = None
    _cache.clear()


_started_with: tuple = ()


def _environment() -> tuple:
    """What the resolver's answers depend on beyond a request: where it runs and what it may import."""
    import os

    keys = ("PYTHONPATH", "LIGHTNING_CQK_TRUSTED_MODULES", "LIGHTNING_CQK_SHARED_DATA")
    return (os.getcwd(), *(os.environ.get(k) for k in keys))


def _ask(request: dict[str, Any]) -> dict[str, Any]:
    global _process, _started_with
    if _process is not None and _started_with != _environment():
        reset()  # started in another directory or environment: a fresh one reads this one
    if _process is None or _process.poll() is not None:
        _started_with = _environment()
        _process = subprocess.Popen(
            [sys.executable, "-m", "lightning_cqk.cli.resolve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        atexit.register(reset)
    _process.stdin.write(json.dumps(request) + "\n")
    _process.stdin.flush()
    line = _process.stdout.readline()
    if not line:
        raise ConfigUnresolvable("the resolver process (python -m lightning_cqk.cli.resolve) ended without answering")
    return json.loads(line)


def _contents(configs: list[str]) -> tuple[str, ...]:
    return tuple(
        hashlib.sha256(Path(c).read_bytes()).hexdigest() if Path(c).is_file() else f"<not here: {c}>" for c in configs
    )


def resolve(configs: list[str], overrides: Mapping[str, Any], seed: int | None = None) -> dict[str, Any]:
    """{"tree": the resolved configuration (a nested dict, as the run's config.yaml holds it), "trusted": [...]}.
    Raises ConfigUnresolvable when the parser refuses it."""
    request = {"configs": [str(c) for c in configs], "overrides": dict(overrides), "seed": seed}
    key = (json.dumps(request, sort_keys=True, default=str), _contents(request["configs"]), _environment())
    if key not in _cache:
        answer = _ask(json.loads(json.dumps(request, default=str)))
        if "error" in answer:
            raise ConfigUnresolvable(answer["error"])
        _cache[key] = {"tree": yaml.safe_load(answer["text"]) or {}, "trusted": list(answer.get("trusted") or [])}
        _trusted[:] = _cache[key]["trusted"]
    return _cache[key]


def trusted_modules() -> list[str]:
    """The researcher's modules a config may name (`$LIGHTNING_CQK_TRUSTED_MODULES`, as the CLI reads it), from the
    resolver's last answer ([] before any)."""
    return list(_trusted)


def resolved_config(configs: list[str], overrides: Mapping[str, Any], seed: int | None = None) -> dict[str, Any]:
    """The configuration `lightning_cqk fit` resolves from these files, overrides and seed (a nested dict)."""
    return resolve(configs, overrides, seed)["tree"]


def section(tree: Mapping[str, Any], key: str) -> dict[str, Any]:
    """A resolved config's section as a flat mapping of its arguments (`init_args` unwrapped when present)."""
    node: Any = tree
    for part in key.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    if not isinstance(node, Mapping):
        return {}
    return dict(node.get("init_args") or {}) if "class_path" in node else dict(node)
