"""What an expanded spec is (lightning_cqk/study/design/spec.py expands it): a `Run` (a point of the grid at one seed:
its
configs, overrides, CLI arguments and config hash) and a `Sweep` (the runs of one profile, with the claims parsed
once), and the placeholders their strings may hold ({shared_data}, {sweep_dir})."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path
from typing import Any

from lightning_cqk.environment import env_path
from lightning_cqk.study.design.claim import Claim
from lightning_cqk.study.design.spec_checks import SpecError

RUN_REF = re.compile(r"\{run:([^}]+)\}")


@dataclasses.dataclass
class Run:
    """One run of a sweep: a point of the grid at one seed."""

    name: str  # e.g. coupled-leapfrog-s2
    group: str  # the name without the seed
    seed: int
    levels: dict[str, str]  # axis -> level
    configs: list[str]  # --config files, in order
    overrides: dict[str, Any]  # flag -> value (resolved placeholders), in the order they are passed
    depends_on: list[str]  # names of runs this one waits for ({run:<level>} references)
    role: str = ""  # "" (a run of the grid or the control) | "tuning" (a learning-rate grid run, spec `tuning:`)
    tuned_by: dict[str, Any] = dataclasses.field(default_factory=dict)  # level -> its grid (config hashes, windows)

    def cli_args(self, sweep_dir: Path) -> list[str]:
        """Arguments of `lightning_cqk fit` for this run (without the resume checkpoint)."""
        args: list[str] = []
        for config in self.configs:
            args += ["--config", config]
        for key, value in self.overrides.items():
            if key != "trainer.enable_progress_bar":
                args.append(f"--{key}={format_value(value)}")
        args += [
            "--trainer.enable_progress_bar=true",  # progress lines in the run's log: the sweep's progress reads them
            f"--seed_everything={self.seed}",
            f"--trainer.logger.init_args.save_dir={sweep_dir.parent}",
            f"--trainer.logger.init_args.name={sweep_dir.name}",
            f"--trainer.logger.init_args.version={self.name}",
        ]
        return args

    def config_hash(self) -> str:
        """sha256 (16 hex digits) of everything that determines the run's resolved config.

        The contents of the --config files (not just their paths), the overrides and the seed: a finished run whose
        hash changed (the spec or a config file was edited) is refused rather than silently mixed into a sweep. A run
        that starts at a grid's choice ("{tuned_lr:<level>}") also hashes that grid (its runs' hashes and the held-out
        windows), so a run whose rate came from an edited grid is refused too.
        """
        files = []
        for config in self.configs:
            path = Path(config)
            files.append([config, path.read_text() if path.is_file() else None])
        what = {"configs": files, "overrides": self.overrides, "seed": self.seed}
        if self.tuned_by:  # only tuned runs: the hash of every other run is what it always was
            what["tuned_by"] = self.tuned_by
        blob = json.dumps(what, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclasses.dataclass
class Sweep:
    """An expanded spec at one profile."""

    spec_path: str
    study: str
    profile: str
    spec: dict[str, Any]  # the whole spec as read (title, claim, metric, baseline, published, ...)
    runs: list[Run]
    sweep_dir: Path
    jobs: int
    needs: list[str]
    slurm: list[str]
    claims: list[Claim] = dataclasses.field(default_factory=list)  # the profile's claims, parsed once (claim.py)
    control_claim: Claim | None = None  # the planted control, parsed likewise (outside the family)
    # the array script's `#SBATCH --signal=USR1@<this>`: seconds before the time limit that a run is told to save
    slurm_signal_seconds: int = 90

    def run(self, name: str) -> Run:
        for run in self.runs:
            if run.name == name:
                return run
        raise SpecError(f"{self.spec_path}: no run named {name!r}; runs: {', '.join(r.name for r in self.runs)}")

    def missing_needs(self) -> list[str]:
        """Required paths (profile `needs`) that do not exist."""
        return [path for path in self.needs if not Path(path).exists()]


def format_value(value: Any) -> str:
    """A CLI value: strings as they are, everything else as JSON (which jsonargparse reads as YAML)."""
    if isinstance(value, str):
        return value
    return json.dumps(value)


SHARED_DATA_ENV = "LIGHTNING_CQK_SHARED_DATA"


def shared_data_dir() -> str | None:
    """$LIGHTNING_CQK_SHARED_DATA (the folder of the local corpora a spec's `{shared_data}` names), or None."""
    path = env_path(SHARED_DATA_ENV)
    return None if path is None else str(path)


def as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]


def fill_placeholders(value: Any, placeholders: dict[str, str | None]) -> Any:
    """Replace {shared_data} / {sweep_dir} in strings, recursively; {run:...} is left for _resolve_run_refs.

    A placeholder without a value ({shared_data} while $LIGHTNING_CQK_SHARED_DATA is unset) is refused.
    """
    if isinstance(value, str):
        for key, sub in placeholders.items():
            if "{" + key + "}" not in value:
                continue
            if sub is None:
                raise SpecError(
                    f"This profile reads local corpora ({value}): set {SHARED_DATA_ENV} to the folder that holds them "
                    f"(e.g. `export {SHARED_DATA_ENV}=/path/to/data`, with wikitext/, pubmed/, webtext/ inside). On a "
                    "machine with network access, `make study-data DIR=/path/to/data` fetches them from their "
                    "public sources, checked byte for byte (docs/studies-and-reports.md#the-studies-data); or run a "
                    "profile that needs none (`--profile paper`, or the coupling study's cpu profile)."
                )
            value = value.replace("{" + key + "}", sub)
        return value
    if isinstance(value, dict):
        return {k: fill_placeholders(v, placeholders) for k, v in value.items()}
    if isinstance(value, list):
        return [fill_placeholders(v, placeholders) for v in value]
    return value


def config_path(config: str, where: str) -> str:
    """A spec's --config file as given when it exists (a checkout), else the shipped copy's path (`resources.py`)."""
    from lightning_cqk.files.resources import ConfigNotFound, find_config

    if "{" in config or Path(config).exists():  # a placeholder is filled later; the working directory wins
        return config
    try:
        return str(find_config(config))
    except ConfigNotFound as err:
        raise SpecError(f"{where}: {err}") from None
