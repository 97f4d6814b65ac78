"""Ablation specs: a YAML grid over configs, expanded into runs with deterministic names.

A spec (`configs/ablations/<study>.yaml`) names one study of the papers:

    study: coupling                       # the study's name (also the default sweep directory runs/<study>-<profile>)
    title: ...                            # one line for the report
    paper: arXiv 2604.01683 v1            # where the claim comes from
    claim: ...                            # what the study answers
    metric: val/ppl                       # the headline metric of the tables (val/bpb is always reported beside it)
    baseline: {attention: standard}       # per axis, the level that changes are measured against
    axes:                                 # the grid: the cartesian product of every axis's levels, times the seeds
      attention:                          # an axis: ordered levels, each a flat dict of CLI overrides
        standard: {model.config.attention: standard}
        coupled-leapfrog: {model.config.attention: coupled, model.config.attention_options: {integrator: leapfrog}}
    profiles:                             # how big: `paper` (published scale, GPUs) and `cpu` (2 CPU cores, < 20 min)
      cpu:
        configs: [configs/quickstart.yaml, configs/ablations/cpu_callbacks.yaml]   # --config files, in order
        seeds: [1, 2, 3]
        jobs: 1                           # runs at a time (the runner's default; --jobs overrides)
        needs: ["{shared_data}/wikitext"] # paths that must exist (checked before anything runs)
        overrides: {trainer.max_steps: 120}          # CLI overrides of every run of this profile
        axes: {attention: {...}}          # optional: replaces an axis's levels for this profile only
        exclude: [{size: d64, attention: differential}]   # optional: combinations left out of this profile's grid
                                          # ({corpus: web, seeds: [6, 7]}: left out at those seeds only)
        slurm: ["#SBATCH --gpus-per-node=1"]          # optional: lines added to the SLURM array script
        tuning:                           # optional: each level of an axis its own learning rate (sweep/tuning.py)
          axis: attention                 # levels: [...] (default all), same_as: {level: tuned}, at: {axis: level}
          lrs: [1.0e-3, 2.0e-3, 4.0e-3]   # 3 or more; one run each at `seed` (not a verdict seed), or at each
          seed: 0                         # of `seeds: [0, 1000, 1001]` (the choice: the lowest mean loss)
          held_out: [256, 384]            # the validation windows the choice reads: after the verdicts' own
          overrides: {trainer.limit_val_batches: 24}   # the grid runs' own overrides (enough windows)
        # or tuning: {fixed: "<why one rate is the design>"}; without either, verdicts are configuration-limited
        planning: {sd_pct: {default: 0.8, <claim>: 0.5}}   # optional: paired sd (%) for the dry-run's power plan
                                          # (as the committed report measured it; `sd_basis: {<claim>: why}` for a
                                          # claim planned more conservatively, e.g. at a pooled sd's upper bound)
    published:                            # optional: the paper's numbers, per group (only their changes are shown)
      source: arXiv 2604.01683 v1 abstract
      metric: val/ppl
      values: {standard: 24.22, coupled-leapfrog: 22.62}
    claims:                               # what the report gives a verdict on (format: lightning_cqk/sweep/verdict.py)
      - {name: coupled-vs-standard, group: coupled-leapfrog, vs: standard, expect: lower,
         published: {value: -6.6, unit: token_ppl, tokenizer: gpt2, corpus: wikitext, baseline: 24.22}}
    control:                              # the planted control: one extra group with an effect of known small size
      name: half_lr                       # its level on the baseline axis (the first axis of `baseline`)
      overrides: {}                       # e.g. {budget.tokens: 307200}: the baseline on 60% of the tokens
      lr_scale: 0.5                       # optional: the baseline at this multiple of its learning rate (the tuned
                                          # one, or the profile's `model.optim.lr`); the report predicts its size
                                          # from the baseline's own grid. `auto`: the grid chooses the scale whose
                                          # predicted size is expected_pct (sweep/tuning.py; needs a `tuning:` grid)
      expect: higher                      # one-sided t at 0.05; undetected: null-type verdicts "sensitivity not shown"
      expected_pct: 3.9                   # its size, predicted before the run (printed by --dry-run)
      at: {}                              # levels of the other axes (default: their baseline, else first, level)
      seeds: [1, 2, 3]                    # optional: its own seeds, among the profile's (default: every seed); its
                                          # size and sd are known, so it needs fewer seeds than the claims

A claim whose groups are not all in a profile's grid (a level that profile leaves out) is not judged there; the
report names it. A profile may give its own `control:` and `claims:` (they replace the spec's) and `data_order:
seed` (default: each seed shuffles the training windows with its own order, `data.seed = seed`; the levels of one
seed share it) or `fixed` (every run uses the data config's seed).

Overrides are `--key=value` flags of `lightning_cqk fit` (dicts and lists are passed as YAML/JSON); the key
`config` adds `--config` files (a path or a list) for one level. String values may use placeholders:
`{shared_data}` ($LIGHTNING_CQK_SHARED_DATA, required by a spec that uses it), `{sweep_dir}` (the sweep's output
directory) and `{run:<level>}`: the directory of the run that is the same as this one except that this axis is at
<level>, which makes this run wait for that one (the compute-matched study's `budget.match_to`).

A run's name is its levels joined by `-` in axis order, then `-s<seed>` (e.g. `coupled-leapfrog-s2`); its group
(the seeds of one setting) is the name without the seed. Order: axes vary slowest-first in spec order, seeds
fastest; runs that wait for another come after it; the control's runs come last.

Paired design: the runs of one seed differ only in their levels. They see the same training batches in the same
order (the data seed depends on the run's seed only) and start from the same values for every parameter they have
in common (the model initialises each parameter from a generator seeded by the seed and the parameter's name:
`lightning_cqk.model.gpt.paired_init`), so the report compares them seed by seed.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import itertools
import json
import os
import re
from pathlib import Path
from typing import Any

from lightning_cqk.sweep import spec_checks
from lightning_cqk.sweep.claim import Claim, ClaimError, parse_claim
from lightning_cqk.sweep.spec_checks import SpecError

PROFILES_REQUIRED = ("paper", "cpu")
_NAME = spec_checks.NAME
_RUN_REF = re.compile(r"\{run:([^}]+)\}")


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
    return os.environ.get(SHARED_DATA_ENV) or None


def load_spec(path: str | Path) -> dict[str, Any]:
    """Read and validate a spec file (structure only; expansion checks the rest).

    `path` is found in the working directory, else among the specs shipped with the package (`resources.py`).
    """
    from lightning_cqk.resources import ConfigNotFound, find_config, shipped_names

    try:
        path = find_config(path)
    except ConfigNotFound as err:
        local = sorted(p.stem for p in Path("configs/ablations").glob("*.yaml"))
        if local:  # a checkout's configs/ in the working directory
            names = ", ".join(local)
            raise SpecError(f"No ablation spec at {path}. Available in configs/ablations/: {names}.") from None
        shipped = [n for n in shipped_names("configs") if n.startswith("configs/ablations/")]
        hint = f" Shipped: {', '.join(shipped)}." if shipped else ""
        raise SpecError(f"No ablation spec at {path}: {err}{hint}") from None
    spec, lines = spec_checks.read(path)  # refuses duplicate keys, naming the line
    where = str(path)
    if not isinstance(spec, dict):
        raise SpecError(f"{where}: a spec is a YAML mapping with study, axes and profiles; got {type(spec).__name__}.")
    for key in ("study", "axes", "profiles", "baseline"):
        if key not in spec:
            raise SpecError(f"{where}: missing top-level key {key!r} (see lightning_cqk/sweep/spec.py for the format).")
    if not _NAME.match(str(spec["study"])):
        raise SpecError(f"{where}: study {spec['study']!r} must be a plain name (letters, digits, _ . + = -).")
    _check_axes(spec["axes"], where)
    missing = [p for p in PROFILES_REQUIRED if p not in spec["profiles"]]
    if missing:
        raise SpecError(f"{where}: every spec needs the profiles {PROFILES_REQUIRED}; missing {missing}.")
    for name, profile in spec["profiles"].items():
        if not isinstance(profile, dict) or not profile.get("configs"):
            raise SpecError(
                f"{where}: profile {name!r} needs `configs:` (the base config "
                "files of `lightning_cqk fit --config`, in order)."
            )
        if "axes" in profile:
            unknown = sorted(set(profile["axes"]) - set(spec["axes"]))
            if unknown:
                raise SpecError(
                    f"{where}: profile {name!r} replaces unknown axes {unknown}; axes: {list(spec['axes'])}."
                )
            _check_axes(profile["axes"], f"{where} (profile {name})")
    baseline = spec["baseline"]
    if not isinstance(baseline, dict) or not baseline:
        raise SpecError(f"{where}: baseline is a mapping axis -> level, e.g. {{attention: standard}}.")
    unknown = sorted(set(baseline) - set(spec["axes"]))
    if unknown:
        raise SpecError(f"{where}: baseline names unknown axes {unknown}; axes: {list(spec['axes'])}.")
    metric = spec.get("metric", "val/ppl")
    if metric not in ("val/ppl", "val/bpb", "val/loss"):
        raise SpecError(f"{where}: metric {metric!r} must be val/ppl, val/bpb or val/loss.")
    claims = spec.get("claims") or []
    if not isinstance(claims, list):
        raise SpecError(f"{where}: claims is a list of mappings (see lightning_cqk/sweep/verdict.py).")
    try:
        for claim in claims:
            parse_claim(claim, where)
    except ClaimError as err:
        raise SpecError(str(err)) from None
    names = [c["name"] for c in claims]
    if len(set(names)) != len(names):
        raise SpecError(f"{where}: claim names must be distinct, got {names}.")
    for name, profile in spec["profiles"].items():
        try:
            for claim in profile.get("claims") or []:
                parse_claim(claim, f"{where} (profile {name})")
        except ClaimError as err:
            raise SpecError(str(err)) from None
        control = profile.get("control", spec.get("control"))
        if control is not None:
            _check_control(control, spec, f"{where} (profile {name})")
        if profile.get("tuning") is not None:
            _check_tuning(profile["tuning"], spec, profile, f"{where} (profile {name})")
        if profile.get("data_order", "seed") not in ("seed", "fixed"):
            raise SpecError(
                f"{where}: profile {name!r}: data_order is `seed` or `fixed`, got {profile['data_order']!r}."
            )
    spec_checks.check(spec, where, lines)  # names, seeds, claims' groups (lightning_cqk/sweep/spec_checks.py)
    return spec


def _check_control(control: Any, spec: dict[str, Any], where: str) -> None:
    if not isinstance(control, dict) or not control.get("name") or not isinstance(control.get("overrides"), dict):
        raise SpecError(
            f"{where}: control needs a name and overrides (a mapping), e.g. "
            "{name: half_depth, overrides: {model.config.n_layer: 2}, expect: higher}."
        )
    if not _NAME.match(str(control["name"])):
        raise SpecError(f"{where}: control name {control['name']!r} is not a plain name (letters, digits, _ . + = -).")
    if control.get("expect") not in ("lower", "higher"):
        raise SpecError(f"{where}: control expect must be lower or higher (the direction of its known large effect).")
    axis = next(iter(spec["baseline"]))
    if control["name"] in (spec["axes"].get(axis) or {}):
        raise SpecError(f"{where}: control name {control['name']!r} is already a level of axis {axis!r}.")
    unknown = sorted(set(control.get("at") or {}) - set(spec["axes"]))
    if unknown:
        raise SpecError(f"{where}: control `at` names unknown axes {unknown}; axes: {list(spec['axes'])}.")
    expected = control.get("expected_pct")
    if expected is not None and not isinstance(expected, (int, float)):
        raise SpecError(f"{where}: control expected_pct is a number (the planted change in %), got {expected!r}.")
    scale = control.get("lr_scale")
    if scale == "auto":
        if not (isinstance(expected, (int, float)) and 0 < expected <= 50) or control.get("expect") != "higher":
            raise SpecError(
                f"{where}: control `lr_scale: auto` takes its scale from the baseline's grid so that the grid predicts "
                "`expected_pct`: give `expect: higher` and `expected_pct` between 0 and 50, e.g. `expected_pct: 4.0`; "
                f"got expect {control.get('expect')!r}, expected_pct {expected!r}."
            )
    if scale is not None:
        if scale != "auto" and (
            isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale < 1e3 or scale == 1
        ):
            raise SpecError(
                f"{where}: control lr_scale multiplies the baseline's learning rate: a positive number other than 1, "
                f"e.g. `lr_scale: 0.5` (half the rate), or `auto` (chosen from the grid); got {scale!r}."
            )
        if "model.optim.lr" in control["overrides"]:
            raise SpecError(
                f"{where}: control sets both lr_scale and model.optim.lr in its overrides: keep one "
                "(lr_scale follows the baseline's tuned rate; a literal rate does not)."
            )


def _check_tuning(tuning: Any, spec: dict[str, Any], profile: dict[str, Any], where: str) -> None:
    """A profile's `tuning:` (lightning_cqk/sweep/tuning.py): a grid of >= 3 rates per level, unused seed(s),
    held-out windows after the verdicts' validation set; or `{fixed: <why>}` where one rate is the design."""
    example = "tuning: {axis: attention, lrs: [1.0e-3, 2.0e-3, 4.0e-3], seed: 0, held_out: [256, 512]}"
    if not isinstance(tuning, dict):
        raise SpecError(f"{where}: tuning is a mapping, e.g. `{example}`, or `{{fixed: <why one rate is by design>}}`.")
    if "fixed" in tuning:
        if set(tuning) != {"fixed"} or not str(tuning["fixed"]).strip():
            raise SpecError(f"{where}: `tuning: {{fixed: <why>}}` takes only a non-empty reason.")
        return
    axes = dict(spec["axes"], **(profile.get("axes") or {}))
    axis = tuning.get("axis")
    if axis not in axes:
        raise SpecError(f"{where}: tuning axis {axis!r} is not an axis ({list(axes)}); e.g. `{example}`.")
    unknown = [lv for lv in tuning.get("levels") or [] if lv not in axes[axis]]
    if unknown:
        raise SpecError(f"{where}: tuning levels {unknown} are not levels of axis {axis!r} ({list(axes[axis])}).")
    tuned = tuning.get("levels") or list(axes[axis])
    same_as = tuning.get("same_as") or {}
    bad = {k: v for k, v in same_as.items() if k not in axes[axis] or v not in tuned or k in tuned}
    if bad:
        raise SpecError(
            f"{where}: tuning same_as maps an untuned level of {axis!r} to a tuned one whose rate it takes; "
            f"{bad} is not that (tuned: {tuned})."
        )
    for a, level in (tuning.get("at") or {}).items():
        if a not in axes or a == axis or level not in axes[a]:
            raise SpecError(f"{where}: tuning at {{{a}: {level}}} is not a level of another axis.")
    lrs = tuning.get("lrs")
    if not isinstance(lrs, list) or len(lrs) < 3 or not all(isinstance(x, (int, float)) and x > 0 for x in lrs):
        raise SpecError(f"{where}: tuning lrs is a list of 3 or more positive rates, got {lrs!r}.")
    if len(set(lrs)) != len(lrs):
        raise SpecError(f"{where}: tuning lrs must be distinct, got {lrs}.")
    if ("seed" in tuning) == ("seeds" in tuning):
        raise SpecError(
            f"{where}: tuning takes one of `seed: 0` (the grid at one seed) and `seeds: [0, 1000, 1001]` (each "
            f"rate's mean over several); got {'both' if 'seed' in tuning else 'neither'}."
        )
    grid_seeds = tuning["seeds"] if "seeds" in tuning else [tuning["seed"]]
    used = [int(x) for x in profile.get("seeds", [1337])]
    for seed in grid_seeds if isinstance(grid_seeds, list) and grid_seeds else [None]:
        if not isinstance(seed, int) or isinstance(seed, bool) or seed in used:
            raise SpecError(
                f"{where}: tuning seeds are integers no verdict run uses (not in seeds {used}), got {grid_seeds!r}."
            )
    if len(set(grid_seeds)) != len(grid_seeds):
        raise SpecError(f"{where}: tuning seeds must be distinct, got {grid_seeds}.")
    held = tuning.get("held_out")
    ints = isinstance(held, list) and len(held) == 2 and all(isinstance(x, int) for x in held)
    if not (ints and 0 <= held[0] < held[1]):
        raise SpecError(f"{where}: tuning held_out is [first, end) of the validation windows, e.g. [256, 512].")
    over = profile.get("overrides") or {}
    verdict_windows = int(over.get("trainer.limit_val_batches", 0)) * int(
        over.get("data.val_batch_size", over.get("data.batch_size", 0))
    )
    verdict_windows = int(over.get("data.final_val_windows") or 0) or verdict_windows  # the final set (val_sets.py)
    if not verdict_windows:
        raise SpecError(
            f"{where}: tuning needs the verdicts' validation set fixed in the profile's overrides "
            "(trainer.limit_val_batches and data.val_batch_size) to keep the held-out windows apart from it."
        )
    if held[0] < verdict_windows:
        raise SpecError(
            f"{where}: tuning held_out {held} overlaps the verdicts' validation windows [0, {verdict_windows}): the "
            f"choice must never read them; start it at {verdict_windows} or later."
        )
    t_over = dict(over, **(tuning.get("overrides") or {}))
    per_batch = int(t_over.get("data.val_batch_size", t_over.get("data.batch_size", 0)))
    tune_windows = int(t_over.get("trainer.limit_val_batches", 0)) * per_batch
    tune_windows = int(t_over.get("data.final_val_windows") or 0) or tune_windows  # val_windows.json: the final set
    if tune_windows < held[1]:
        need = -(-held[1] // max(per_batch, 1))
        fix = f"data.final_val_windows: {held[1]}" if t_over.get("data.final_val_windows") else None
        raise SpecError(
            f"{where}: the grid runs validate on {tune_windows} windows, fewer than held_out's end {held[1]}; give "
            f"the tuning `overrides: {{{fix or f'trainer.limit_val_batches: {need}'}}}`."
        )


def _check_axes(axes: Any, where: str) -> None:
    if not isinstance(axes, dict) or not axes:
        raise SpecError(f"{where}: axes is a mapping axis -> {{level: {{override: value}}}} with at least one axis.")
    for axis, levels in axes.items():
        if not isinstance(levels, dict) or not levels:
            raise SpecError(f"{where}: axis {axis!r} needs at least one level (a mapping level -> overrides).")
        for level, overrides in levels.items():
            if not _NAME.match(str(level)):
                raise SpecError(
                    f"{where}: level {level!r} of axis {axis!r} is not a plain name (letters, digits, _ . + = -): "
                    "it becomes part of the run directory's name."
                )
            if overrides is not None and not isinstance(overrides, dict):
                raise SpecError(f"{where}: level {axis}.{level} must map override keys to values, got {overrides!r}.")


def expand(
    spec_path: str | Path, profile: str = "cpu", output: str | Path | None = None, runs_root: str | Path = "runs"
) -> Sweep:
    """Expand a spec at `profile` into its runs.

    Args:
        spec_path: the spec YAML.
        profile: a profile of the spec (`paper`, `cpu`, ...).
        output: the sweep directory; default `<runs_root>/<study>-<profile>`.
        runs_root: where sweep directories go when `output` is not given.
    """
    spec = load_spec(spec_path)
    where = str(spec_path)
    spec_checks.check_profile_name(profile, f"{where}: --profile")
    if profile not in spec["profiles"]:
        raise SpecError(f"{where}: no profile {profile!r}; profiles: {', '.join(spec['profiles'])}.")
    prof = spec["profiles"][profile]
    study = str(spec["study"])
    sweep_dir = Path(output) if output is not None else Path(runs_root) / f"{study}-{profile}"
    axes = {axis: dict(levels) for axis, levels in spec["axes"].items()}
    for axis, levels in (prof.get("axes") or {}).items():
        axes[axis] = dict(levels)
    for axis, level in spec["baseline"].items():
        if level not in axes[axis]:
            raise SpecError(
                f"{where}: baseline level {axis}={level!r} is not a level of the axis ({list(axes[axis])})."
            )
    seeds = [int(s) for s in prof.get("seeds", [1337])]
    if not seeds or len(set(seeds)) != len(seeds):
        raise SpecError(f"{where}: profile {profile!r} needs distinct seeds, got {seeds}.")
    configs = [_config_path(c, where) for c in _as_list(prof["configs"])]
    placeholders = {"shared_data": shared_data_dir(), "sweep_dir": str(sweep_dir)}

    exclude = _exclusions(prof.get("exclude"), axes, f"{where} (profile {profile})")

    runs: list[Run] = []
    names = list(axes)
    for combo in itertools.product(*(list(axes[a]) for a in names)):
        levels = dict(zip(names, combo, strict=True))
        if any(all(levels[a] == level for a, level in partial.items()) for partial, only in exclude if not only):
            continue
        group = "-".join(combo)
        for seed in seeds:
            if any(seed in only and all(levels[a] == lv for a, lv in partial.items()) for partial, only in exclude):
                continue  # a combination left out at some seeds only (fewer seeds where no headline claim is)
            run_configs = list(configs)
            overrides: dict[str, Any] = {}
            for key, value in (prof.get("overrides") or {}).items():
                overrides[key] = copy.deepcopy(value)
            depends: list[str] = []
            for axis in names:
                for key, value in (axes[axis][levels[axis]] or {}).items():
                    if key == "config":
                        run_configs += [_config_path(c, where) for c in _as_list(value)]
                        continue
                    value = _fill(value, placeholders)
                    value, refs = _resolve_run_refs(value, axis, levels, axes, seed, sweep_dir, where)
                    depends += refs
                    overrides.pop(key, None)  # a level's value comes after (and wins over) the profile's
                    overrides[key] = value
            name = f"{group}-s{seed}"
            runs.append(
                Run(name, group, seed, levels, [_fill(c, placeholders) for c in run_configs], overrides, depends)
            )
    control = prof.get("control", spec.get("control"))
    if "claims" in prof:  # a profile whose groups are named differently (e.g. other sizes) brings its own claims
        spec = copy.deepcopy(spec)
        spec["claims"] = prof["claims"]
    if control is not None:
        control_seeds = _control_seeds(control, seeds, where)
        runs += _control_runs(control, spec, axes, configs, prof, control_seeds, placeholders, where)
        spec = copy.deepcopy(spec)
        spec["control"] = _control_claim(control, spec, axes)
    tuning = prof.get("tuning")
    if tuning is not None:
        spec = copy.deepcopy(spec)
        if "fixed" in tuning:
            spec["tuning"] = {"fixed": str(tuning["fixed"])}
        else:
            control_group = spec["control"]["group"] if control is not None else None
            runs = _tuning_runs(tuning, spec, axes, runs, configs, prof, placeholders, control_group, where)
    if control is not None and control.get("lr_scale") == "auto":
        untuned = [
            r.name
            for r in runs
            if r.group == spec["control"]["group"] and "*auto(" not in str(r.overrides.get("model.optim.lr", ""))
        ]
        if untuned:
            raise SpecError(
                f"{where}: control `lr_scale: auto` chooses its scale from the baseline's learning-rate grid, but the "
                f"baseline has no grid here ({untuned[0]}): add a `tuning:` block that tunes its level, or give a "
                "number, e.g. `lr_scale: 0.5`."
            )
    if control is not None and control.get("lr_scale") is not None:
        unset = [r.name for r in runs if r.group == spec["control"]["group"] and "model.optim.lr" not in r.overrides]
        if unset:
            raise SpecError(
                f"{where}: control lr_scale {control['lr_scale']} scales the baseline's rate, but the baseline "
                f"has none here ({unset[0]}): tune its axis (`tuning:`) or set `model.optim.lr: <rate>` in the "
                "profile's overrides."
            )
    groups = {r.group for r in runs if r.role != "tuning"}
    kept, left_out = [], []
    for claim in spec.get("claims") or []:
        named = [claim["group"], claim["vs"]] if "group" in claim else [*claim["plus"], *claim["minus"]]
        (kept if all(str(g) in groups for g in named) else left_out).append(claim)
    if left_out:  # e.g. a level the cpu profile leaves out for its budget: said in the report, never judged
        spec = copy.deepcopy(spec)
        spec["claims"] = kept
        spec["claims_not_in_profile"] = [str(c["name"]) for c in left_out]
    if prof.get("data_order", "seed") == "seed":
        for run in runs:
            run.overrides.setdefault("data.seed", run.seed)
    runs = _order(runs, where)
    return Sweep(
        spec_path=str(spec_path),
        study=study,
        profile=profile,
        spec=spec,
        runs=runs,
        sweep_dir=sweep_dir,
        jobs=int(prof.get("jobs", 1)),
        needs=[_fill(p, placeholders) for p in _as_list(prof.get("needs", []))],
        slurm=[str(line) for line in prof.get("slurm", [])],
        claims=[parse_claim(c, where) for c in spec.get("claims") or []],
        control_claim=_parsed_control(spec.get("control"), where),
    )


def _parsed_control(control: dict[str, Any] | None, where: str) -> Claim | None:
    """The planted control as a claim (outside the family: `is_control`), or None."""
    if control is None:
        return None
    return dataclasses.replace(parse_claim(control, f"{where} (control)"), is_control=True)


def _tuning_runs(
    tuning: dict[str, Any],
    spec: dict[str, Any],
    axes: dict[str, dict],
    runs: list[Run],
    configs: list[str],
    prof: dict[str, Any],
    placeholders: dict[str, str | None],
    control_group: str | None,
    where: str,
) -> list[Run]:
    """The learning-rate grid runs of every tuned level (lightning_cqk/sweep/tuning.py), and the runs of those
    levels set to wait for their grid and start at its choice ("{tuned_lr:<level>}"). Records the grid in
    spec["tuning"]."""
    from lightning_cqk.sweep.tuning import grid_names, tuned_rate

    axis = tuning["axis"]
    levels = [str(lv) for lv in (tuning.get("levels") or list(axes[axis]))]
    seeds = [int(s) for s in tuning["seeds"]] if "seeds" in tuning else [int(tuning["seed"])]
    grid: dict[str, dict[str, str | list[str]]] = {}
    tune: list[Run] = []
    for level in levels:
        at = {a: spec["baseline"].get(a, next(iter(options))) for a, options in axes.items()}
        at.update({a: str(v) for a, v in (tuning.get("at") or {}).items()})
        at[axis] = level
        for lr in tuning["lrs"]:
            overrides: dict[str, Any] = {k: copy.deepcopy(v) for k, v in (prof.get("overrides") or {}).items()}
            run_configs = list(configs)
            for a in axes:
                for key, value in (axes[a][at[a]] or {}).items():
                    if key == "config":
                        run_configs += [_config_path(c, where) for c in _as_list(value)]
                        continue
                    if isinstance(value, str) and "{run:" in value:
                        raise SpecError(f"{where}: tuning: level {a}.{at[a]} waits for another run; tune another.")
                    overrides.pop(key, None)
                    overrides[key] = _fill(copy.deepcopy(value), placeholders)
            for key, value in (tuning.get("overrides") or {}).items():
                overrides.pop(key, None)
                overrides[key] = _fill(copy.deepcopy(value), placeholders)
            overrides.pop("model.optim.lr", None)
            overrides["model.optim.lr"] = float(lr)
            group = f"tune-{level}-lr{float(lr):g}"
            names = [f"{group}-s{seed}" for seed in seeds]
            # one name per rate for a grid at one seed (as committed studies record it), a list for several
            grid.setdefault(level, {})[repr(float(lr))] = names if "seeds" in tuning else names[0]
            run_configs = [_fill(c, placeholders) for c in run_configs]
            for name, seed in zip(names, seeds, strict=True):
                tune.append(Run(name, group, seed, dict(at), run_configs, copy.deepcopy(overrides), [], "tuning"))
    by_name = {r.name: r for r in tune}
    grid_hashes = {
        lv: {lr: _point_hash([by_name[n].config_hash() for n in grid_names(point)]) for lr, point in g.items()}
        for lv, g in grid.items()
    }
    base_level = spec["baseline"].get(axis)
    same_as = {str(k): str(v) for k, v in (tuning.get("same_as") or {}).items()}
    for run in runs:
        level = run.levels.get(axis)
        level = same_as.get(level, level)  # a level that takes another's rate (e.g. the baseline at more tokens)
        scale = None
        if run.group == control_group:
            if "model.optim.lr" in spec["control"]["overrides"]:
                continue  # a control that sets its own rate keeps it
            if axis == next(iter(spec["baseline"])):
                level = base_level  # the control stands in this axis for its baseline level: that level's rate
            scale = spec["control"].get("lr_scale")
        if level not in grid or "model.optim.lr" in _level_overrides(run, axes, axis):
            continue
        run.overrides.pop("model.optim.lr", None)
        if scale == "auto":  # the grid chooses the scale at launch (tuning.auto_scale)
            rate = tuned_rate(level, auto_target_pct=float(spec["control"]["expected_pct"]))
        else:
            rate = tuned_rate(level, None if scale is None else float(scale))
        run.overrides["model.optim.lr"] = rate
        run.depends_on = [*run.depends_on, *(n for point in grid[level].values() for n in grid_names(point))]
        run.tuned_by = {level: {"held_out": [int(x) for x in tuning["held_out"]], "grid": grid_hashes[level]}}
    spec["tuning"] = {
        "axis": axis,
        "levels": levels,
        "lrs": [float(x) for x in tuning["lrs"]],
        **({"seeds": seeds} if "seeds" in tuning else {"seed": seeds[0]}),
        "held_out": [int(x) for x in tuning["held_out"]],
        "overrides": dict(tuning.get("overrides") or {}),
        "same_as": same_as,
        "at": dict(tuning.get("at") or {}),
        "grid": grid,
    }
    return tune + runs


def _point_hash(hashes: list[str]) -> str | list[str]:
    """The config hash a tuned run records for one grid point: its run's (a grid at one seed), else its runs' list."""
    return hashes[0] if len(hashes) == 1 else hashes


def _level_overrides(run: Run, axes: dict[str, dict], tuned_axis: str) -> dict[str, Any]:
    """The overrides the run's levels on the other axes set (a level that sets the rate itself is never tuned)."""
    out: dict[str, Any] = {}
    for a, level in run.levels.items():
        if a != tuned_axis and level in axes.get(a, {}):
            out.update(axes[a][level] or {})
    return out


def _control_levels(control: dict[str, Any], spec: dict[str, Any], axes: dict[str, dict]) -> dict[str, str]:
    """The control group's levels: the baseline axis at the control's name, the others at `at` / baseline / first."""
    axis = next(iter(spec["baseline"]))
    at = control.get("at") or {}
    levels = {}
    for name, options in axes.items():
        levels[name] = str(at.get(name, spec["baseline"].get(name, next(iter(options)))))
    levels[axis] = str(control["name"])
    return levels


def _control_claim(control: dict[str, Any], spec: dict[str, Any], axes: dict[str, dict]) -> dict[str, Any]:
    """The control as a claim for the report: its group vs the same levels with the baseline level."""
    levels = _control_levels(control, spec, axes)
    base = dict(levels, **spec["baseline"])
    return {
        "name": f"control-{control['name']}",
        "text": str(control.get("text", "positive control (known large effect)")),
        "group": "-".join(levels[a] for a in axes),
        "vs": "-".join(base[a] for a in axes),
        "expect": control["expect"],
        "overrides": control["overrides"],
        "expected_pct": control.get("expected_pct"),
        "lr_scale": control.get("lr_scale"),
    }


def _control_seeds(control: dict[str, Any], seeds: list[int], where: str) -> list[int]:
    """The control's own `seeds` (paired with the baseline's, so each must be a seed of the profile), else all."""
    own = control.get("seeds")
    if own is None:
        return seeds
    if not isinstance(own, list) or not own or not all(type(s) is int for s in own):
        raise SpecError(
            f"{where}: control seeds is a non-empty list of integers, e.g. `seeds: [1, 2, 3, 4]`; got {own!r}."
        )
    outside = [s for s in own if s not in seeds]
    if outside or len(set(own)) != len(own):
        raise SpecError(
            f"{where}: control seeds {own} must be distinct seeds of the profile ({seeds}): the control pairs with "
            f"the baseline's run of each seed{f'; not in the profile: {outside}' if outside else ''}."
        )
    return own


def _control_runs(
    control: dict[str, Any],
    spec: dict[str, Any],
    axes: dict[str, dict],
    configs: list[str],
    prof: dict[str, Any],
    seeds: list[int],
    placeholders: dict[str, str],
    where: str,
) -> list[Run]:
    """One run per seed of the control group: the baseline levels' overrides, then the control's."""
    levels = _control_levels(control, spec, axes)
    base = dict(levels, **spec["baseline"])
    for axis, level in base.items():
        if level not in axes[axis]:
            raise SpecError(
                f"{where}: control: level {axis}={level!r} is not a level of the axis ({list(axes[axis])})."
            )
    group = "-".join(levels[a] for a in axes)
    runs = []
    for seed in seeds:
        run_configs = list(configs)
        overrides: dict[str, Any] = {k: copy.deepcopy(v) for k, v in (prof.get("overrides") or {}).items()}
        for axis in axes:
            for key, value in (axes[axis][base[axis]] or {}).items():
                if key == "config":
                    run_configs += _as_list(value)
                    continue
                if isinstance(value, str) and "{run:" in value:
                    raise SpecError(f"{where}: the control's base level {axis}.{base[axis]} waits for another run.")
                overrides.pop(key, None)
                overrides[key] = _fill(value, placeholders)
        for key, value in control["overrides"].items():
            overrides.pop(key, None)
            overrides[key] = _fill(copy.deepcopy(value), placeholders)
        scale = control.get("lr_scale")
        if scale is not None:  # a literal base rate is scaled here; a tuned one when the grid has chosen (tuning.py)
            base_lr = overrides.pop("model.optim.lr", None)
            if scale != "auto" and isinstance(base_lr, (int, float)) and not isinstance(base_lr, bool):
                overrides["model.optim.lr"] = float(base_lr) * float(scale)
        runs.append(
            Run(
                f"{group}-s{seed}",
                group,
                seed,
                dict(levels),
                [_fill(c, placeholders) for c in run_configs],
                overrides,
                [],
            )
        )
    return runs


def _exclusions(value: Any, axes: dict[str, dict], where: str) -> list[tuple[dict[str, str], set[int]]]:
    """A profile's `exclude`: combinations of levels left out of its grid, each a partial {axis: level} mapping; with
    `seeds: [...]` only at those seeds (a group run at fewer seeds). Returns (partial, seeds) pairs (seeds empty:
    every seed)."""
    if value is None:
        return []
    example = "exclude: [{size: d64, attention: differential}, {corpus: web, seeds: [6, 7, 8]}]"
    if not isinstance(value, list) or not all(isinstance(p, dict) and p for p in value):
        raise SpecError(f"{where}: exclude is a list of {{axis: level}} mappings, e.g. `{example}`; got {value!r}.")
    out = []
    for partial in value:
        only = partial.get("seeds") or []
        if not isinstance(only, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in only):
            raise SpecError(f"{where}: exclude seeds is a list of integer seeds, e.g. `{example}`; got {only!r}.")
        levels = {a: v for a, v in partial.items() if a != "seeds"}
        if not levels:
            raise SpecError(f"{where}: an exclude entry names at least one axis level, e.g. `{example}`.")
        for axis, level in levels.items():
            if axis not in axes:
                raise SpecError(f"{where}: exclude names unknown axis {axis!r}; axes: {list(axes)}.")
            if level not in axes[axis]:
                raise SpecError(
                    f"{where}: exclude names {axis}={level!r}, not a level of the axis ({list(axes[axis])})."
                )
        out.append(({str(a): str(v) for a, v in levels.items()}, {int(s) for s in only}))
    return out


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]


def _fill(value: Any, placeholders: dict[str, str | None]) -> Any:
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
        return {k: _fill(v, placeholders) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, placeholders) for v in value]
    return value


def _resolve_run_refs(
    value: Any, axis: str, levels: dict[str, str], axes: dict[str, dict], seed: int, sweep_dir: Path, where: str
) -> tuple[Any, list[str]]:
    if not isinstance(value, str) or "{run:" not in value:
        return value, []
    refs: list[str] = []

    def sub(match: re.Match) -> str:
        level = match.group(1)
        if level not in axes[axis]:
            raise SpecError(f"{where}: {{run:{level}}} in axis {axis!r} names no level of it ({list(axes[axis])}).")
        other = dict(levels, **{axis: level})
        if other == levels:
            raise SpecError(f"{where}: {{run:{level}}} in level {axis}.{level} refers to the run itself.")
        name = "-".join(other[a] for a in axes) + f"-s{seed}"
        refs.append(name)
        return str(sweep_dir / name)

    return _RUN_REF.sub(sub, value), refs


def _order(runs: list[Run], where: str) -> list[Run]:
    """Stable topological order: a run comes after the runs it waits for."""
    by_name = {r.name: r for r in runs}
    if len(by_name) != len(runs):
        raise SpecError(f"{where}: two grid points give the same run name; make the level names distinct.")
    for run in runs:
        absent = [d for d in run.depends_on if d not in by_name]
        if absent:
            raise SpecError(f"{where}: run {run.name} waits for {absent}, which the grid leaves out (exclude).")
    done: set[str] = set()
    ordered: list[Run] = []
    pending = list(runs)
    while pending:
        ready = [r for r in pending if all(d in done for d in r.depends_on)]
        if not ready:
            raise SpecError(f"{where}: {{run:...}} references form a cycle among {[r.name for r in pending]}.")
        for r in ready:
            ordered.append(r)
            done.add(r.name)
        pending = [r for r in pending if r.name not in done]
    return ordered


def _config_path(config: str, where: str) -> str:
    """A spec's --config file as given when it exists (a checkout), else the shipped copy's path (`resources.py`)."""
    from lightning_cqk.resources import ConfigNotFound, find_config

    if "{" in config or Path(config).exists():  # a placeholder is filled later; the working directory wins
        return config
    try:
        return str(find_config(config))
    except ConfigNotFound as err:
        raise SpecError(f"{where}: {err}") from None
