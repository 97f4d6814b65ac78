"""The planted control of a study (spec `control:`, lightning_cqk/study/design/spec.py): its check, its group's levels
and
seeds, its runs, and the claim that tests it (outside the family: study/judge/verdict.py)."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from lightning_cqk.study.design import spec_checks
from lightning_cqk.study.design.claim import Claim, parse_claim
from lightning_cqk.study.design.plan import Run, as_list, fill_placeholders
from lightning_cqk.study.design.spec_checks import SpecError


def check_control(control: Any, spec: dict[str, Any], where: str) -> None:
    if not isinstance(control, dict) or not control.get("name") or not isinstance(control.get("overrides"), dict):
        raise SpecError(
            f"{where}: control needs a name and overrides (a mapping), e.g. "
            "{name: half_depth, overrides: {model.config.n_layer: 2}, expect: higher}."
        )
    if not spec_checks.NAME.match(str(control["name"])):
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


def parsed_control(control: dict[str, Any] | None, where: str) -> Claim | None:
    """The planted control as a claim (outside the family: `is_control`), or None."""
    if control is None:
        return None
    return dataclasses.replace(parse_claim(control, f"{where} (control)"), is_control=True)


def _control_levels(control: dict[str, Any], spec: dict[str, Any], axes: dict[str, dict]) -> dict[str, str]:
    """The control group's levels: the baseline axis at the control's name, the others at `at` / baseline / first."""
    axis = next(iter(spec["baseline"]))
    at = control.get("at") or {}
    levels = {}
    for name, options in axes.items():
        levels[name] = str(at.get(name, spec["baseline"].get(name, next(iter(options)))))
    levels[axis] = str(control["name"])
    return levels


def control_claim(control: dict[str, Any], spec: dict[str, Any], axes: dict[str, dict]) -> dict[str, Any]:
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


def control_seeds(control: dict[str, Any], seeds: list[int], where: str) -> list[int]:
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


def control_runs(
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
                    run_configs += as_list(value)
                    continue
                if isinstance(value, str) and "{run:" in value:
                    raise SpecError(f"{where}: the control's base level {axis}.{base[axis]} waits for another run.")
                overrides.pop(key, None)
                overrides[key] = fill_placeholders(value, placeholders)
        for key, value in control["overrides"].items():
            overrides.pop(key, None)
            overrides[key] = fill_placeholders(copy.deepcopy(value), placeholders)
        scale = control.get("lr_scale")
        if (
            scale is not None
        ):  # a literal base rate is scaled here; a tuned one when the grid has chosen (tuned_rate.py)
            base_lr = overrides.pop("model.optim.lr", None)
            if scale != "auto" and isinstance(base_lr, (int, float)) and not isinstance(base_lr, bool):
                overrides["model.optim.lr"] = float(base_lr) * float(scale)
        runs.append(
            Run(
                f"{group}-s{seed}",
                group,
                seed,
                dict(levels),
                [fill_placeholders(c, placeholders) for c in run_configs],
                overrides,
                [],
            )
        )
    return runs
