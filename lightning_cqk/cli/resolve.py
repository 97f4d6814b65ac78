"""The one resolver: a run's configuration as `lightning_cqk fit` itself resolves it, without running anything.

`resolved_config(configs, overrides, seed)` parses `fit --config <file> ... --<key>=<value> ...
--seed_everything=<seed>` with the parser of `CQKCLI` (cli/trainer.py: the same parser, links, presets and defaults
a run gets), and returns the configuration that run would save as its `config.yaml` (`parser.dump`), as a nested
dict. Nothing is instantiated: no model, data module, trainer or run directory is made, no lock is taken. The
parser is built once per process (a few seconds), and each parse takes a fraction of a second.

    python -m lightning_cqk.cli.resolve     # serves requests, one JSON line each, on stdin (study/design/settings.py)

The sweep, below the command line, asks this module through that process (lightning_cqk/study/design/settings.py): its
identities (study/run/identity.py) and dry-run estimates (study/design/cost_estimate.py) read settings here, so a
setting spelled two ways, given in two files, or left to a code default resolves one way for all of them (issue 43).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

import yaml

from lightning_cqk.study.design.settings import ConfigUnresolvable, section  # noqa: F401 (section: one definition)


@functools.lru_cache(maxsize=1)
def _cli():
    from lightning_cqk.cli import class_paths
    from lightning_cqk.cli.trainer import CQKCLI

    class_paths.install()

    class ParserOnly(CQKCLI):
        """CQKCLI's parser, built as `lightning_cqk fit` builds it; every later stage of the CLI left out."""

        def parse_arguments(self, parser: Any, args: Any) -> None:
            self.config = {"subcommand": None}

        def _parse_ckpt_path(self) -> None: ...
        def _set_seed(self) -> None: ...
        def _add_instantiators(self) -> None: ...
        def before_instantiate_classes(self) -> None: ...
        def instantiate_classes(self) -> None: ...
        def after_instantiate_classes(self) -> None: ...

    return ParserOnly(args=[])


def cli_value(value: Any) -> str:
    """A `--key=value` value: strings as they are, everything else as JSON (which jsonargparse reads as YAML)."""
    return value if isinstance(value, str) else json.dumps(value)


def fit_arguments(configs: list[str], overrides: Mapping[str, Any], seed: int | None) -> list[str]:
    """`fit --config ... --key=value ... [--seed_everything=N]` as a list of arguments."""
    args = ["fit"]
    for config in configs:
        args += ["--config", str(config)]
    args += [f"--{key}={cli_value(value)}" for key, value in overrides.items()]
    if seed is not None:
        args.append(f"--seed_everything={int(seed)}")
    return args


@functools.lru_cache(maxsize=4096)
def _resolve_text(argv: tuple[str, ...], contents: tuple[str, ...]) -> str:
    """The dumped configuration of `argv` (`contents`: the config files' hashes, so an edited file parses again)."""
    cli = _cli()
    try:
        namespace = cli.parser.parse_args(list(argv), defaults=True)
    except SystemExit:  # jsonargparse prints its error and exits: the message is re-raised by `resolved_config`
        raise ConfigUnresolvable(" ".join(argv)) from None
    return cli._parser("fit").dump(namespace.fit, skip_none=False)


def resolved_config(configs: list[str], overrides: Mapping[str, Any], seed: int | None = None) -> dict[str, Any]:
    """The configuration `lightning_cqk fit` resolves from these files, overrides and seed (a nested dict, as the
    run's config.yaml holds it). Raises ConfigUnresolvable when the parser refuses it or a file is missing."""
    import contextlib
    import hashlib
    import io
    from pathlib import Path

    from lightning_cqk.files.resources import ConfigNotFound, resolve_config_args

    try:
        argv = tuple(resolve_config_args(fit_arguments(configs, overrides, seed)))
    except ConfigNotFound as err:
        raise ConfigUnresolvable(str(err)) from None
    files = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--config"]
    contents = tuple(
        hashlib.sha256(Path(f).read_bytes()).hexdigest() if Path(f).is_file() else f"<missing {f}>" for f in files
    )
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            text = _resolve_text(argv, contents)
    except ConfigUnresolvable as err:
        said = errors.getvalue().strip().splitlines()
        raise ConfigUnresolvable(
            f"lightning_cqk fit cannot resolve this run's settings ({' '.join(argv[1:])}): {said[-1] if said else err}"
        ) from None
    return yaml.safe_load(text) or {}


def serve() -> None:
    """Answer resolve requests (study/design/settings.py), one JSON line in, one out, until stdin closes."""
    import sys

    from lightning_cqk.cli.class_paths import TRUSTED_MODULES, trusted_modules

    trusted = [m for m in trusted_modules() if m not in TRUSTED_MODULES]
    out, sys.stdout = sys.stdout, sys.stderr  # only answers on stdout: whatever the parser prints goes to stderr
    for line in sys.stdin:
        request = json.loads(line)
        try:
            tree = resolved_config(request["configs"], request["overrides"], request.get("seed"))
            answer = {"text": yaml.safe_dump(tree, sort_keys=False), "trusted": trusted}
        except ConfigUnresolvable as err:
            answer = {"error": str(err)}
        except Exception as err:  # the parser's own failure: said, never a hang of the asking sweep
            answer = {"error": f"{type(err).__name__}: {err}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()


if __name__ == "__main__":
    serve()
