"""Specs that would silently change the experiment are refused by `lightning_cqk sweep`, naming the line: duplicate
keys, claims of groups no profile produces (or of a group against itself), seeds that are not integers, and names
that would put a sweep outside runs/ (issue 25, class 5). Triggers are my own, not the issue's examples."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_cqk.cli import main
from lightning_cqk.study.design.spec import Run, SpecError, expand
from lightning_cqk.study.design.spec_checks import owned_run_dir
from lightning_cqk.study.run.runner import Ledger

REPO = Path(__file__).resolve().parents[3]

# line numbers below refer to this text
BASE = """\
study: t
baseline: {arm: plain}
axes:
  arm:
    plain: {}
    leapfrog:
      model.config.attention: coupled
      model.config.attention_options: {integrator: leapfrog}
    euler: {model.config.attention: coupled}
profiles:
  cpu:
    configs: [configs/quickstart.yaml]
    seeds: [1, 2]
    exclude: [{arm: euler}]
  paper:
    configs: [configs/quickstart.yaml]
    seeds: [1]
claims:
  - {name: helps, group: leapfrog, vs: plain, expect: lower}
  - {name: integrators, plus: [leapfrog], minus: [euler], expect: same, margin_pct: 1}
"""


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "argv", ["lightning_cqk"])


def _spec(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "t.yaml"
    path.write_text(text)
    return path


def _refused(tmp_path: Path, text: str, profile: str = "cpu") -> str:
    """The one-paragraph message of `lightning_cqk sweep SPEC --profile P --dry-run` (exit status 1)."""
    path = _spec(tmp_path, text)
    with pytest.raises(SystemExit) as err:
        main(["sweep", str(path), "--profile", profile, "--dry-run"])
    message = str(err.value.code)
    assert message.startswith(f"lightning_cqk sweep: {path}"), message
    assert "Traceback" not in message and "\n" not in message.strip()
    return message


def test_the_base_spec_is_accepted_and_a_profile_may_leave_a_claim_out(tmp_path: Path):
    sweep = expand(_spec(tmp_path, BASE), "cpu")  # euler is left out on cpu: its claim is named, not judged
    assert [r.name for r in sweep.runs] == ["plain-s1", "plain-s2", "leapfrog-s1", "leapfrog-s2"]
    assert sweep.spec["claims_not_in_profile"] == ["integrators"]


@pytest.mark.parametrize(
    "edit, line, words",
    [
        # a level pasted twice: YAML keeps the second `leapfrog` (an Euler run under the leapfrog name)
        (
            lambda t: t.replace("    euler: {", "    leapfrog: {"),
            9,
            "key 'leapfrog' (in axes.arm) appears twice (first on line 6)",
        ),
        # an override key given twice inside one level (block style)
        (
            lambda t: t.replace(
                "{integrator: leapfrog}\n", "{integrator: leapfrog}\n      model.config.attention: standard\n"
            ),
            9,
            "key 'model.config.attention' (in axes.arm.leapfrog) appears twice (first on line 7)",
        ),
        # two profiles of one name: the first's seeds and configs vanish
        (lambda t: t.replace("  paper:", "  cpu:"), 15, "key 'cpu' (in profiles) appears twice (first on line 11)"),
        # a second claims: list replaces the first
        (lambda t: t + "claims:\n  - {name: x, group: euler, vs: plain, expect: lower}\n", 21, "key 'claims' appears"),
        # a key repeated inside one claim's flow mapping
        (lambda t: t.replace("vs: plain, expect", "vs: plain, group: euler, expect"), 19, "key 'group' (in claims.0)"),
    ],
)
def test_duplicate_keys_are_refused_naming_both_lines(tmp_path: Path, edit, line: int, words: str):
    message = _refused(tmp_path, edit(BASE))
    assert f"line {line}: {words}" in message
    assert "Keep one of them" in message


@pytest.mark.parametrize(
    "edit, profile, words",
    [
        (
            lambda t: t.replace("group: leapfrog, vs", "group: leapfrg, vs"),
            "cpu",
            "line 19: claim 'helps' names group 'leapfrg', which no profile of the spec produces (groups: euler, "
            "leapfrog, plain). Did you mean leapfrog?",
        ),
        (
            lambda t: t.replace("minus: [euler]", "minus: [eulr]"),
            "paper",
            "line 20: claim 'integrators' names group 'eulr', which no profile of the spec produces",
        ),
        (  # a profile's own claims may name only that profile's groups (euler is left out of cpu)
            lambda t: t.replace(
                "    exclude: [{arm: euler}]\n",
                "    exclude: [{arm: euler}]\n    claims:\n"
                "      - {name: own, group: euler, vs: plain, expect: lower}\n",
            ),
            "paper",
            "line 16: claim 'own' names group 'euler', which profile 'cpu' does not produce (groups: leapfrog, plain)",
        ),
        (
            lambda t: t.replace("group: leapfrog, vs: plain", "group: plain, vs: plain"),
            "cpu",
            "line 19: claim 'helps' compares group 'plain' with itself (group == vs)",
        ),
        (
            lambda t: t.replace("minus: [euler]", "minus: [euler, leapfrog]"),
            "cpu",
            "line 20: claim 'integrators' has leapfrog in both plus and minus",
        ),
    ],
)
def test_claims_must_name_two_groups_a_profile_produces(tmp_path: Path, edit, profile: str, words: str):
    assert words in _refused(tmp_path, edit(BASE), profile)


@pytest.mark.parametrize(
    "seeds, words",
    [
        ("[1.9, 2.2]", "seed 1.9 is refused: a seed is an integer, and float 1.9 would be turned into one silently"),
        ("[1, 2.0]", "seed 2.0 is refused"),
        ("[true, 2]", "seed True is refused: a seed is an integer, and bool True"),
        ("['1', '2']", "seed '1' is refused"),
        ("[3, -1]", "seed -1 is refused: a seed is an integer in [0, 4294967295] (Lightning would replace -1 by 0)"),
        ("[4294967296]", "seed 4294967296 is refused"),
        ("7", "seeds is a non-empty list of integers"),
        ("[1, 1]", "needs distinct seeds"),
    ],
)
def test_seeds_are_distinct_integers_in_range(tmp_path: Path, seeds: str, words: str):
    message = _refused(tmp_path, BASE.replace("seeds: [1, 2]", f"seeds: {seeds}"))
    assert "line 13: profile 'cpu'" in message and words in message


def test_jobs_must_be_a_positive_integer(tmp_path: Path):
    message = _refused(tmp_path, BASE.replace("seeds: [1]\n", "seeds: [1]\n    jobs: 1.5\n"), "paper")
    assert "line 18: profile 'paper': jobs is the number of runs at a time, a positive integer; got 1.5" in message


@pytest.mark.parametrize("slurm", ['["#SBATCH --time=1:00:00", "rm -rf ~/runs"]', '"#SBATCH --gpus=1\\nrm -rf x"'])
def test_slurm_lines_are_sbatch_directives_only(tmp_path: Path, slurm: str):
    message = _refused(tmp_path, BASE.replace("seeds: [1]\n", f"seeds: [1]\n    slurm: {slurm}\n"), "paper")
    assert "line 18: profile 'paper': slurm line" in message and "is not one `#SBATCH ...` directive" in message


@pytest.mark.parametrize("seconds", ["0", "1.5", "'90'", "70000"])
def test_slurm_signal_seconds_is_a_whole_number_sbatch_takes(tmp_path: Path, seconds: str):
    message = _refused(
        tmp_path, BASE.replace("seeds: [1]\n", f"seeds: [1]\n    slurm_signal_seconds: {seconds}\n"), "paper"
    )
    assert "line 18: profile 'paper': slurm_signal_seconds is how long before a SLURM time limit" in message
    assert "slurm_signal_seconds: 90 (the default)" in message


def test_slurm_signal_seconds_sets_the_array_scripts_stop_signal(tmp_path: Path):
    from lightning_cqk.study.run.slurm_submit import write_slurm

    sweep = expand(
        _spec(tmp_path, BASE.replace("seeds: [1]\n", "seeds: [1]\n    slurm_signal_seconds: 300\n")), "paper"
    )
    assert sweep.slurm_signal_seconds == 300 and expand(_spec(tmp_path, BASE), "paper").slurm_signal_seconds == 90
    sweep.sweep_dir = tmp_path / "out"
    wave0 = write_slurm(sweep, "t.yaml")[0].read_text()
    assert "#SBATCH --signal=USR1@300" in wave0.splitlines()


def test_unsafe_profile_names_never_leave_runs(tmp_path: Path):
    """A spec profile named like a path, and --profile like a path, are refused by a real `sweep` before it writes
    anything: runs/t-../../../esc would be <work>/esc, outside runs/ (neither appears)."""
    work = tmp_path / "work"
    (work / "configs").mkdir(parents=True)
    (work / "configs" / "quickstart.yaml").write_text((REPO / "configs" / "quickstart.yaml").read_text())
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def sweep(spec_text: str, profile: str) -> subprocess.CompletedProcess:
        (work / "t.yaml").write_text(spec_text)
        cmd = [sys.executable, "-m", "lightning_cqk", "sweep", "t.yaml", "--profile", profile, "--no-report"]
        return subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=120)

    escape = "../../../esc"
    done = sweep(BASE.replace("  paper:", f"  {escape}:\n    configs: [configs/quickstart.yaml]\n  paper:"), escape)
    assert done.returncode == 1, done.stderr
    assert f"line 15: profile name '{escape}' is not a plain name" in done.stderr, done.stderr
    done = sweep(BASE, escape)
    assert done.returncode == 1, done.stderr
    assert f"--profile: profile name '{escape}' is not a plain name" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert sorted(p.name for p in work.iterdir()) == ["configs", "t.yaml"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]


def test_the_runner_deletes_only_inside_its_sweep_directory(tmp_path: Path):
    victim = tmp_path / "victim"
    victim.mkdir()
    sweep = expand(_spec(tmp_path, BASE), "cpu", output=tmp_path / "sweep")
    ledger = Ledger(sweep)
    assert ledger.run_dir(sweep.runs[0]) == tmp_path / "sweep" / "plain-s1"
    for name in ("../victim", "..", "a/b", "/abs", ".hidden", "~x", "a b"):
        rogue = Run(name, name, 1, {}, [], {}, [])
        with pytest.raises(SpecError, match="is not a plain name"):
            ledger.run_dir(rogue)
        with pytest.raises(SpecError, match="only writes and deletes run directories directly inside it"):
            owned_run_dir(tmp_path / "sweep", name)
    assert victim.is_dir()


def test_every_shipped_spec_passes_the_checks():
    for spec in sorted((REPO / "configs" / "ablations").glob("*.yaml")):
        for profile in ("cpu", "paper"):
            assert expand(spec, profile).runs


@pytest.mark.parametrize(
    "edit, line, words",
    [
        # issue 34 defect 4: one level gives the batch size twice; the parser reads both as data.batch_size
        (
            lambda t: t.replace("    plain: {}", "    plain: {data.batch_size: 4, data.init_args.batch_size: 8}"),
            5,
            "keys 'data.batch_size' (line 5) and 'data.init_args.batch_size' (in axes.arm.plain) both set "
            "data.batch_size",
        ),
        # the profile's overrides: a dotted key and a mapping that holds the same setting
        (
            lambda t: t.replace(
                "    seeds: [1, 2]\n",
                "    seeds: [1, 2]\n    overrides:\n      model.init_args.config.n_layer: 2\n"
                "      model: {config: {n_layer: 4}}\n",
            ),
            16,
            "keys 'model.init_args.config.n_layer' (line 15) and 'model' (in profiles.cpu.overrides) both set "
            "model.config.n_layer",
        ),
    ],
)
def test_one_setting_under_two_spellings_is_refused(tmp_path: Path, edit, line: int, words: str):
    message = _refused(tmp_path, edit(BASE))
    assert f"line {line}: {words}" in message
    assert "the run would get only the value passed last" in message and "Keep one of them" in message


def test_different_settings_in_one_mapping_are_kept(tmp_path: Path):
    """`data.batch_size` and `data.val_batch_size` share a prefix, not a setting."""
    text = BASE.replace("    plain: {}", "    plain: {data.batch_size: 4, data.init_args.val_batch_size: 8}")
    sweep = expand(_spec(tmp_path, text), "cpu")
    assert sweep.runs[0].overrides["data.batch_size"] == 4


@pytest.mark.parametrize(
    "old, new, words",
    [
        ("value: -6.6, unit: token_ppl", "value: -6.0, unit: token_ppl", "'leapfrog-vs-standard' publishes -6%"),
        (
            "corpus: wikitext, baseline: 24.22}",
            "corpus: wikitext, baseline: 24.5}",
            r"'euler-vs-standard' publishes -6.9% \(baseline 24.5\)",
        ),
    ],
)
def test_a_claims_published_number_must_agree_with_the_group_table(tmp_path: Path, old: str, new: str, words: str):
    """Issue 33: the paper's -6.6% is declared twice (per group in `published: values:`, per claim in `published:`),
    and nothing checked that they agree. Now a claim whose value or baseline disagrees with the group values is
    refused, naming its line; the shipped spec (22.62 / 24.22 - 1 = -6.61%) passes."""
    text = (REPO / "configs" / "ablations" / "coupling.yaml").read_text()
    assert old in text
    path = tmp_path / "coupling.yaml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(SpecError, match=rf"coupling.yaml, line \d+: claim {words}"):
        expand(path, "cpu", tmp_path / "out")
