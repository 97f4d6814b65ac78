"""Checks that keep a sweep spec from silently changing the experiment; each refusal names the spec's line.

`spec.load_spec` reads a spec with `read` and, once its structure is known to be sound, calls `check`:

- duplicate mapping keys anywhere (level names, override keys, claims, profiles) are refused by the YAML reader
  (`lightning_cqk.files.strict_yaml`); `yaml.safe_load` would keep the last of two and drop the first without a word;
- every name that becomes part of a path (study, profile, level, control; hence group and run names) is a plain
  name (`NAME`: letters, digits, `_ . + = -`, not starting with `.`), so `--profile ../../../x` or a profile key of
  that shape cannot put a sweep directory outside `runs/`, and `owned_run_dir` lets the runner delete only
  directories directly inside its own sweep directory;
- `slurm:` lines are `#SBATCH` directives only (they are copied into the array script, where any other line would
  run as shell code on the cluster); `slurm_signal_seconds` is a whole number of seconds sbatch takes (1-65535);
- seeds are integers in numpy's range [0, 2**32 - 1] (a float 1.9 would become 1, a bool True 1, and Lightning
  replaces an out-of-range seed by 0, each silently); `jobs` is a positive integer;
- a claim compares two different groups (`group == vs`, or a group in both `plus` and `minus`, cancels itself out)
  and names only groups some profile of the spec produces (a profile's own `claims:` only groups of that profile):
  a typo would otherwise be reported as "not in this profile" and never judged. A spec-level claim of a level that
  only one profile runs stays fine: the other profile names it as not judged;
- the paper's numbers are declared in two places, per group (`published: values:`, the report's group table) and per
  claim (`published: {value, baseline}`, the verdict's E): where both give a claim's groups, they must agree (the
  claim's value is the change of the group values, to the claim's printed precision, and its baseline is the vs
  group's value), so the two tables cannot quote different papers.
"""

from __future__ import annotations

import difflib
import itertools
import re
from pathlib import Path
from typing import Any

from lightning_cqk.files.strict_yaml import YAMLInputError, load

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+=-]*$")
NAME_RULE = "letters, digits and _ . + = - only, starting with a letter or digit"
SEED_MAX = 2**32 - 1  # numpy's (and so Lightning's seed_everything's) largest seed
_SHOWN = 12  # groups listed in a message before "..."


class SpecError(ValueError):
    """A malformed ablation spec; the message says what is wrong and how to fix it (`spec.SpecError`: the same)."""


def read(path: str | Path) -> tuple[Any, dict[tuple[str, ...], int]]:
    """The spec's data and the line of every key, refusing syntax errors and duplicate keys (naming the line)."""
    try:
        return load(path)
    except YAMLInputError as err:
        raise SpecError(str(err)) from None


def is_safe_name(name: Any) -> bool:
    """A plain name that is one path component and cannot climb out of a folder (`..`, `/`, `~`, spaces...)."""
    return isinstance(name, str) and bool(NAME.match(name))


def _at(where: str, lines: dict[tuple[str, ...], int], *path: Any) -> str:
    """`where, line N` for the deepest path of `path` whose line is known."""
    keys = tuple(str(p) for p in path)
    for end in range(len(keys), 0, -1):
        if keys[:end] in lines:
            return f"{where}, line {lines[keys[:end]]}"
    return where


def check_profile_name(profile: Any, where: str) -> None:
    """Refuse a profile name (a spec key or `--profile`) that cannot be one plain path component."""
    if not is_safe_name(profile):
        raise SpecError(
            f"{where}: profile name {profile!r} is not a plain name ({NAME_RULE}): it becomes part of the sweep "
            "directory's name (runs/<study>-<profile>), so it must not hold `/`, `..` or spaces. Use one of the "
            "spec's profiles, e.g. --profile cpu."
        )


def owned_run_dir(sweep_dir: Path, name: str) -> Path:
    """`sweep_dir / name`, refusing a run name that would reach outside the sweep directory (the runner deletes
    partial run directories: only ever one directly inside its own sweep directory)."""
    path = Path(sweep_dir) / name
    if not is_safe_name(name) or path.parent != Path(sweep_dir):
        raise SpecError(
            f"run name {name!r} is not a plain name ({NAME_RULE}); the sweep in {sweep_dir} only writes and deletes "
            "run directories directly inside it. Rename the spec's levels."
        )
    return path


def check(spec: dict[str, Any], where: str, lines: dict[tuple[str, ...], int]) -> None:
    """Every check of the module docstring on a structurally valid spec (`spec.load_spec` has run its own)."""
    for path, overrides in _override_mappings(spec):
        _check_one_spelling(overrides, path, where, lines)
    for name, profile in spec["profiles"].items():
        check_profile_name(name, _at(where, lines, "profiles", name))
        _check_seeds(profile.get("seeds", [1337]), name, where, lines)
        jobs = profile.get("jobs", 1)
        if type(jobs) is not int or jobs < 1:
            raise SpecError(
                f"{_at(where, lines, 'profiles', name, 'jobs')}: profile {name!r}: jobs is the number of runs at a "
                f"time, a positive integer; got {jobs!r}."
            )
        _check_slurm(profile.get("slurm", []), name, where, lines)
        _check_signal_seconds(profile.get("slurm_signal_seconds", SLURM_SIGNAL_SECONDS), name, where, lines)
    groups = {name: profile_groups(spec, name) for name in spec["profiles"]}
    # the spec's claims are judged at the profiles without claims of their own
    users = [name for name, profile in spec["profiles"].items() if "claims" not in profile]
    every = sorted(set().union(*(groups[name] for name in users))) if users else []
    for i, claim in enumerate(spec.get("claims") or [] if users else []):
        _check_claim(claim, ("claims", i), every, "no profile of the spec produces", where, lines)
    for name, profile in spec["profiles"].items():
        for i, claim in enumerate(profile.get("claims") or []):
            own = sorted(groups[name])
            _check_claim(
                claim, ("profiles", name, "claims", i), own, f"profile {name!r} does not produce", where, lines
            )
    check_published(spec, where, lines)


def check_published(spec: dict[str, Any], where: str, lines: dict[tuple[str, ...], int]) -> None:
    """Each claim's published value and baseline agree with the spec's per-group `published: values:` (module
    docstring); raises SpecError naming the claim's line and both numbers."""
    values = (spec.get("published") or {}).get("values") or {}
    claim_lists = [(("claims",), spec.get("claims") or [])]
    claim_lists += [(("profiles", n, "claims"), p.get("claims") or []) for n, p in spec["profiles"].items()]
    for path, claims in claim_lists:
        for i, claim in enumerate(claims):
            pub = claim.get("published") or {}
            group, vs = claim.get("group"), claim.get("vs")
            if not pub or group not in values or vs not in values or "value" not in pub:
                continue
            derived = 100.0 * (float(values[group]) / float(values[vs]) - 1.0)
            text = repr(float(pub["value"]))
            decimals = len(text.split(".")[1]) if "." in text and "e" not in text else 0
            base = pub.get("baseline")
            if abs(float(pub["value"]) - derived) > 0.5 * 10.0**-decimals + 1e-9 or (
                base is not None and abs(float(base) - float(values[vs])) > 1e-9 * abs(float(values[vs]))
            ):
                raise SpecError(
                    f"{_at(where, lines, *path, i)}: claim {claim.get('name')!r} publishes {pub['value']:+g}% "
                    f"(baseline {base}), but the spec's `published: values:` give {group} {values[group]} vs {vs} "
                    f"{values[vs]}: {derived:+.2f}%. Correct one of the two so both quote the paper."
                )


def setting_paths(key: str, value: Any) -> list[tuple[str, ...]]:
    """The settings one override sets, as the command-line parser resolves them.

    jsonargparse reads `x.init_args.y` as `x.y` (an `init_args` step names no setting of its own), and a mapping value
    sets each of its leaves: `data: {init_args: {batch_size: 8}}` and `data.batch_size: 8` both set `data.batch_size`.
    """
    path = tuple(part for part in str(key).split(".") if part != "init_args")
    if not isinstance(value, dict) or not value:
        return [path]
    return [path + leaf for sub, inner in value.items() for leaf in setting_paths(str(sub), inner)]


def _overlap(first: list[tuple[str, ...]], second: list[tuple[str, ...]]) -> tuple[str, ...] | None:
    """A setting that both lists set (one path equal to, or inside, the other), or None."""
    for a in first:
        for b in second:
            shorter = min(a, b, key=len)
            if a[: len(shorter)] == b[: len(shorter)]:
                return shorter
    return None


def _override_mappings(spec: dict[str, Any]) -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    """Every mapping of override keys in the spec (levels of the spec's and each profile's axes; each profile's,
    its tuning's and every control's `overrides`), with its key path (for the line)."""
    found: list[tuple[tuple[str, ...], dict[str, Any]]] = []

    def levels(axes: Any, *prefix: str) -> None:
        for axis, options in (axes or {}).items():
            for level, overrides in (options or {}).items():
                found.append(((*prefix, "axes", str(axis), str(level)), overrides))

    def control(value: Any, *prefix: str) -> None:
        if isinstance(value, dict):
            found.append(((*prefix, "control", "overrides"), value.get("overrides")))

    levels(spec["axes"])
    control(spec.get("control"))
    for name, profile in spec["profiles"].items():
        levels(profile.get("axes"), "profiles", str(name))
        found.append((("profiles", str(name), "overrides"), profile.get("overrides")))
        control(profile.get("control"), "profiles", str(name))
        tuning = profile.get("tuning")
        if isinstance(tuning, dict):
            found.append((("profiles", str(name), "tuning", "overrides"), tuning.get("overrides")))
    return [(path, overrides) for path, overrides in found if isinstance(overrides, dict)]


def _check_one_spelling(
    overrides: dict[str, Any], path: tuple[str, ...], where: str, lines: dict[tuple[str, ...], int]
) -> None:
    """Refuse two keys of one mapping that set the same setting under different spellings (the strict YAML reader
    has already refused two equal keys): the parser would keep the value passed last and drop the other silently."""
    keys = [str(key) for key in overrides if str(key) != "config"]  # `config` adds --config files, no setting
    settings = {key: setting_paths(key, overrides[key]) for key in keys}
    for i, first in enumerate(keys):
        for second in keys[i + 1 :]:
            same = _overlap(settings[first], settings[second])
            if same is None:
                continue
            first_line = lines.get((*path, first))
            first_at = f" (line {first_line})" if first_line is not None else ""
            raise SpecError(
                f"{_at(where, lines, *path, second)}: keys {first!r}{first_at} and {second!r} (in "
                f"{'.'.join(path)}) both set {'.'.join(same)}: the command-line parser reads `x.init_args.y` as "
                "`x.y` and a mapping value as its keys, so the run would get only the value passed last and "
                "silently drop the other. Keep one of them."
            )


def _check_slurm(value: Any, profile: str, where: str, lines: dict[tuple[str, ...], int]) -> None:
    """`slurm:` lines go verbatim into the array script: only `#SBATCH` directives, one per line."""
    items = value if isinstance(value, list) else [value]
    for i, line in enumerate(items):
        if not isinstance(line, str) or not line.startswith("#SBATCH ") or "\n" in line or "\r" in line:
            raise SpecError(
                f"{_at(where, lines, 'profiles', profile, 'slurm', i)}: profile {profile!r}: slurm line {line!r} is "
                "not one `#SBATCH ...` directive. These lines are copied into the array script before its commands: "
                "anything else would run as shell code on the cluster (and end sbatch's reading of the directives "
                'after it). Give a list of directives, e.g. slurm: ["#SBATCH --gpus-per-node=1"].'
            )


#: A profile's `slurm_signal_seconds` default: SIGUSR1 90 s before a SLURM time limit (the array script's
#: `#SBATCH --signal=USR1@90`), time for a run to finish its step and save, however SLURM rounds (its docs: the signal
#: may come up to 60 s earlier than asked). Raise it where one optimizer step plus a checkpoint's save takes longer.
SLURM_SIGNAL_SECONDS = 90
SLURM_SIGNAL_MAX = 65535  # sbatch --signal's largest time


def _check_signal_seconds(value: Any, profile: str, where: str, lines: dict[tuple[str, ...], int]) -> None:
    if type(value) is not int or not 1 <= value <= SLURM_SIGNAL_MAX:
        raise SpecError(
            f"{_at(where, lines, 'profiles', profile, 'slurm_signal_seconds')}: profile {profile!r}: "
            f"slurm_signal_seconds is how long before a SLURM time limit the runs are told to save (SIGUSR1), a whole "
            f"number of seconds from 1 to {SLURM_SIGNAL_MAX}; got {value!r}. E.g. slurm_signal_seconds: "
            f"{SLURM_SIGNAL_SECONDS} (the default)."
        )


def _check_seeds(seeds: Any, profile: str, where: str, lines: dict[tuple[str, ...], int]) -> None:
    at = _at(where, lines, "profiles", profile, "seeds")
    if not isinstance(seeds, list) or not seeds:
        raise SpecError(
            f"{at}: profile {profile!r}: seeds is a non-empty list of integers, e.g. [1, 2, 3]; got {seeds!r}."
        )
    for i, seed in enumerate(seeds):
        if type(seed) is not int or not 0 <= seed <= SEED_MAX:
            why = (
                f"a seed is an integer in [0, {SEED_MAX}] (Lightning would replace {seed} by 0)"
                if type(seed) is int
                else f"a seed is an integer, and {type(seed).__name__} {seed!r} would be turned into one silently"
            )
            raise SpecError(
                f"{_at(where, lines, 'profiles', profile, 'seeds', i)}: profile {profile!r}: seed {seed!r} is refused: "
                f"{why}. Write whole numbers, e.g. seeds: [1, 2, 3]."
            )
    if len(set(seeds)) != len(seeds):
        raise SpecError(f"{at}: profile {profile!r} needs distinct seeds, got {seeds}.")


def profile_groups(spec: dict[str, Any], profile: str) -> set[str]:
    """The groups (run names without the seed) that `profile` produces: its grid less `exclude`, plus the control."""
    prof = spec["profiles"][profile]
    axes = {axis: list(levels) for axis, levels in spec["axes"].items()}
    for axis, levels in (prof.get("axes") or {}).items():
        axes[axis] = list(levels)
    raw = prof.get("exclude") if isinstance(prof.get("exclude"), list) else []  # malformed: expand() says so
    exclude = [{str(a): str(v) for a, v in p.items()} for p in raw if isinstance(p, dict)]
    groups = set()
    for combo in itertools.product(*axes.values()):
        levels = {axis: str(level) for axis, level in zip(axes, combo, strict=True)}
        if not any(all(levels.get(a) == v for a, v in partial.items()) for partial in exclude):
            groups.add("-".join(levels.values()))
    control = prof.get("control", spec.get("control"))
    if isinstance(control, dict) and control.get("name") is not None:
        first_axis = next(iter(spec["baseline"]))
        at = control.get("at") or {}
        levels = {a: str(at.get(a, spec["baseline"].get(a, next(iter(lv), "")))) for a, lv in axes.items()}
        levels[first_axis] = str(control["name"])
        groups.add("-".join(levels.values()))
    return groups


def _check_claim(
    claim: Any, path: tuple[Any, ...], groups: list[str], absent: str, where: str, lines: dict[tuple[str, ...], int]
) -> None:
    if not isinstance(claim, dict):
        return  # the claim parser names the malformed claim
    name = claim.get("name")
    if "group" in claim:
        named = [("group", claim.get("group")), ("vs", claim.get("vs"))]
        if str(claim.get("group")) == str(claim.get("vs")):
            raise SpecError(
                f"{_at(where, lines, *path, 'vs')}: claim {name!r} compares group {claim.get('group')!r} with itself "
                "(group == vs): its change is 0 by construction and says nothing. Name the group it is compared "
                "against in `vs`."
            )
    else:
        plus, minus = claim.get("plus") or [], claim.get("minus") or []
        named = [(f"plus.{i}", g) for i, g in enumerate(plus)] + [(f"minus.{i}", g) for i, g in enumerate(minus)]
        both = sorted({str(g) for g in plus} & {str(g) for g in minus})
        if both:
            raise SpecError(
                f"{_at(where, lines, *path)}: claim {name!r} has {', '.join(both)} in both plus and minus: the group "
                "cancels out of the contrast. Each group appears on one side only."
            )
    for key, group in named:
        if str(group) in groups:
            continue
        close = difflib.get_close_matches(str(group), groups, n=3)
        hint = f" Did you mean {' or '.join(close)}?" if close else ""
        shown = ", ".join(groups[:_SHOWN]) + (f", ... ({len(groups)} in all)" if len(groups) > _SHOWN else "")
        raise SpecError(
            f"{_at(where, lines, *path, *key.split('.'))}: claim {name!r} names group {group!r}, which {absent} "
            f"(groups: {shown}).{hint} A group is a run's name without its seed: the levels joined by '-' in axis "
            "order; otherwise the claim would never be judged."
        )
