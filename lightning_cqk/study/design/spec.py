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
        slurm_signal_seconds: 90          # optional: SIGUSR1 this long before a SLURM time limit: save and requeue
        tuning:                           # optional: each level of an axis its own learning rate (design/tuned_rate.py)
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
    claims:                               # what the report gives a verdict on (format: study/judge/verdict.py)
      - {name: coupled-vs-standard, group: coupled-leapfrog, vs: standard, expect: lower,
         published: {value: -6.6, unit: token_ppl, tokenizer: gpt2, corpus: wikitext, baseline: 24.22}}
    control:                              # the planted control: one extra group with an effect of known small size
      name: half_lr                       # its level on the baseline axis (the first axis of `baseline`)
      overrides: {}                       # e.g. {budget.tokens: 307200}: the baseline on 60% of the tokens
      lr_scale: 0.5                       # optional: the baseline at this multiple of its learning rate (the tuned
                                          # one, or the profile's `model.optim.lr`); the report predicts its size
                                          # from the baseline's own grid. `auto`: the grid chooses the scale whose
                                          # predicted size is expected_pct (design/tuned_rate.py; needs a `tuning:`
                                          # grid)
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
import itertools
import re
from pathlib import Path
from typing import Any

from lightning_cqk.run.outputs import refuse_shared_outputs
from lightning_cqk.study.design import spec_checks
from lightning_cqk.study.design.claim import ClaimError, parse_claim
from lightning_cqk.study.design.control import check_control, control_claim, control_runs, control_seeds, parsed_control
from lightning_cqk.study.design.plan import (
    RUN_REF,
    SHARED_DATA_ENV,
    Run,
    Sweep,
    as_list,
    config_path,
    fill_placeholders,
    format_value,
    shared_data_dir,
)
from lightning_cqk.study.design.rate_grid import check_tuning, tuning_runs
from lightning_cqk.study.design.spec_checks import SLURM_SIGNAL_SECONDS, SpecError

__all__ = ["SHARED_DATA_ENV", "Run", "SpecError", "Sweep", "expand", "format_value", "load_spec", "shared_data_dir"]


_NAME = spec_checks.NAME


def load_spec(path: str | Path) -> dict[str, Any]:
    """Read and validate a spec file (structure only; expansion checks the rest).

    `path` is found in the working directory, else among the specs shipped with the package (`resources.py`).
    """
    from lightning_cqk.files.resources import ConfigNotFound, find_config, shipped_names

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
            raise SpecError(
                f"{where}: missing top-level key {key!r} (see lightning_cqk/study/design/spec.py for the format)."
            )
    if not _NAME.match(str(spec["study"])):
        raise SpecError(f"{where}: study {spec['study']!r} must be a plain name (letters, digits, _ . + = -).")
    _check_axes(spec["axes"], where)
    if not isinstance(spec["profiles"], dict) or not spec["profiles"]:
        raise SpecError(
            f"{where}: `profiles:` must name at least one profile (any names: the shipped studies use `paper` and "
            "`cpu`), each with its `configs:`; `--profile NAME` picks one."
        )
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
        raise SpecError(f"{where}: claims is a list of mappings (see lightning_cqk/study/judge/verdict.py).")
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
            check_control(control, spec, f"{where} (profile {name})")
        if profile.get("tuning") is not None:
            check_tuning(profile["tuning"], spec, profile, f"{where} (profile {name})")
        if profile.get("data_order", "seed") not in ("seed", "fixed"):
            raise SpecError(
                f"{where}: profile {name!r}: data_order is `seed` or `fixed`, got {profile['data_order']!r}."
            )
    spec_checks.check(spec, where, lines)  # names, seeds, claims' groups (lightning_cqk/study/design/spec_checks.py)
    return spec


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
    configs = [config_path(c, where) for c in as_list(prof["configs"])]
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
                        run_configs += [config_path(c, where) for c in as_list(value)]
                        continue
                    value = fill_placeholders(value, placeholders)
                    value, refs = _resolve_run_refs(value, axis, levels, axes, seed, sweep_dir, where)
                    depends += refs
                    overrides.pop(key, None)  # a level's value comes after (and wins over) the profile's
                    overrides[key] = value
            name = f"{group}-s{seed}"
            runs.append(
                Run(
                    name,
                    group,
                    seed,
                    levels,
                    [fill_placeholders(c, placeholders) for c in run_configs],
                    overrides,
                    depends,
                )
            )
    control = prof.get("control", spec.get("control"))
    if "claims" in prof:  # a profile whose groups are named differently (e.g. other sizes) brings its own claims
        spec = copy.deepcopy(spec)
        spec["claims"] = prof["claims"]
    if control is not None:
        seeds_of_control = control_seeds(control, seeds, where)
        runs += control_runs(control, spec, axes, configs, prof, seeds_of_control, placeholders, where)
        spec = copy.deepcopy(spec)
        spec["control"] = control_claim(control, spec, axes)
    tuning = prof.get("tuning")
    if tuning is not None:
        spec = copy.deepcopy(spec)
        if "fixed" in tuning:
            spec["tuning"] = {"fixed": str(tuning["fixed"])}
        else:
            control_group = spec["control"]["group"] if control is not None else None
            runs = tuning_runs(tuning, spec, axes, runs, configs, prof, placeholders, control_group, where)
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
    refuse_shared_outputs(runs, sweep_dir, where)  # each run's callbacks write inside its own directory only
    return Sweep(
        spec_path=str(spec_path),
        study=study,
        profile=profile,
        spec=spec,
        runs=runs,
        sweep_dir=sweep_dir,
        jobs=int(prof.get("jobs", 1)),
        needs=[fill_placeholders(p, placeholders) for p in as_list(prof.get("needs", []))],
        slurm=[str(line) for line in prof.get("slurm", [])],
        slurm_signal_seconds=int(prof.get("slurm_signal_seconds", SLURM_SIGNAL_SECONDS)),
        claims=[parse_claim(c, where) for c in spec.get("claims") or []],
        control_claim=parsed_control(spec.get("control"), where),
    )


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

    return RUN_REF.sub(sub, value), refs


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
