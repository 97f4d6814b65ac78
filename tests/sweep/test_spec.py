"""Ablation specs: every shipped spec expands to the expected runs (counts, names, budgets, waits), every run's
arguments parse with the CLI, one run of each spec trains, and malformed specs fail with a clear message."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from lightning_cqk.cli import CQKCLI, main
from lightning_cqk.sweep.spec import SpecError, expand, load_spec

REPO = Path(__file__).resolve().parents[2]
SPECS = sorted((REPO / "configs" / "ablations").glob("*.yaml"))
# study -> (cpu runs, paper runs)
COUNTS = {
    "coupling": (4 * 3, 4 * 3),
    "steps": (5 * 2, 5 * 3),
    "compute_matched": (4 * 2, 4 * 3),
    "corpus": (3 * 2 * 2, 3 * 2 * 3),
    "scale": (3 * 3 * 1, 3 * 3 * 3),
    "sharing": (8, 8),
    "deconstruction": (19, 19),
    "logit_control": (2 * 2 * 4, 2 * 3 * 4),
    "composition": (4 * 3 * 2, 4 * 3 * 3),
}


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)  # spec paths (configs/..., callbacks/...) are relative to the repository root
    monkeypatch.setattr(sys, "argv", ["lightning_cqk"])


def test_every_study_of_the_issue_has_a_spec():
    assert sorted(p.stem for p in SPECS) == sorted(COUNTS)


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_spec_expands_to_named_runs(spec: Path):
    for profile, count in zip(("cpu", "paper"), COUNTS[spec.stem], strict=True):
        sweep = expand(spec, profile)
        assert len(sweep.runs) == count
        assert sweep.sweep_dir == Path("runs") / f"{spec.stem}-{profile}"
        names = [r.name for r in sweep.runs]
        assert len(set(names)) == len(names)
        assert names == [r.name for r in expand(spec, profile).runs]  # deterministic
        for run in sweep.runs:
            assert (
                run.name == "-".join(run.levels.values()) + f"-s{run.seed}" and run.group == run.name.rsplit("-s", 1)[0]
            )
            for config in run.configs:
                assert Path(config).is_file(), config
        groups = {r.group for r in sweep.runs}
        baseline = load_spec(spec)["baseline"]
        for run in sweep.runs:  # every group has its baseline group in the grid
            assert "-".join(dict(run.levels, **baseline).values()) in groups
        published = sweep.spec.get("published") or {}
        assert set(published.get("values") or {}) <= groups | {r.group for r in expand(spec, "paper").runs}


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_cpu_profile_is_small_and_shares_one_validation_set(spec: Path):
    sweep = expand(spec, "cpu")
    steps = 0
    for run in sweep.runs:
        o = run.overrides
        assert o["data.seq_len"] * o["data.batch_size"] == 2048
        assert o["trainer.limit_val_batches"] == 8 and o["data.val_batch_size"] == 16  # one fixed validation set
        assert run.configs[:2] == ["configs/quickstart.yaml", "callbacks/sweep.yaml"]  # tiny preset, bytes
        if o.get("budget.match_to"):  # compute_matched: ratio x the coupled run's tokens (or its wall-clock)
            tokens = o["budget.ratio"] * sweep.run(run.depends_on[0]).overrides["budget.tokens"]
        else:
            tokens = o["budget.tokens"]
        steps += tokens / 2048
    assert steps <= 1200, "a cpu profile must finish in < 20 min on 2 cores"


def test_coupling_grid():
    sweep = expand(REPO / "configs" / "ablations" / "coupling.yaml", "cpu")
    assert [r.name for r in sweep.runs][:4] == ["standard-s1", "standard-s2", "standard-s3", "coupled-leapfrog-s1"]
    leapfrog = sweep.run("coupled-euler-s2")
    assert leapfrog.overrides["model.config.attention"] == "coupled"
    assert leapfrog.overrides["model.config.attention_options"] == {"integrator": "euler"}
    assert leapfrog.cli_args(sweep.sweep_dir)[-4:] == [
        "--seed_everything=2",
        "--trainer.logger.init_args.save_dir=runs",
        "--trainer.logger.init_args.name=coupling-cpu",
        "--trainer.logger.init_args.version=coupled-euler-s2",
    ]


def test_compute_matched_runs_wait_for_the_coupled_run():
    sweep = expand(REPO / "configs" / "ablations" / "compute_matched.yaml", "cpu", output="runs/cm")
    order = [r.name for r in sweep.runs]
    for seed in (1, 2):
        for arm, on, ratio in (("standard-2.4B", "tokens", 2.4), ("standard-wallclock", "wallclock", 1.0)):
            run = sweep.run(f"{arm}-s{seed}")
            assert run.depends_on == [f"coupled-B-s{seed}"]
            assert order.index(run.name) > order.index(f"coupled-B-s{seed}")
            assert run.overrides["budget.match_to"] == str(Path("runs/cm") / f"coupled-B-s{seed}")
            assert run.overrides["budget.match_on"] == on and run.overrides["budget.ratio"] == ratio
            assert run.overrides["budget.tokens"] is None
            assert "--budget.tokens=null" in run.cli_args(sweep.sweep_dir)
        assert sweep.run(f"coupled-B-s{seed}").overrides["budget.tokens"] == 163840  # B
        assert sweep.run(f"standard-B-s{seed}").overrides["budget.tokens"] == 163840


def test_corpus_cpu_profile_reads_shared_data(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("LIGHTNING_CQK_SHARED_DATA", str(tmp_path))
    sweep = expand(REPO / "configs" / "ablations" / "corpus.yaml", "cpu")
    assert sweep.run("pubmed-coupled-s1").overrides["data.source"] == str(tmp_path / "pubmed" / "combined")
    assert len(sweep.missing_needs()) == 3
    assert expand(REPO / "configs" / "ablations" / "corpus.yaml", "paper").missing_needs() == []


@pytest.fixture(scope="module")
def parser():
    """One CLI parser for every run's arguments (building it once keeps this test fast)."""
    args = expand(SPECS[0], "cpu").runs[0].cli_args(Path("runs/x"))
    import os

    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        return CQKCLI(args=args, run=False).parser
    finally:
        os.chdir(cwd)


def _covering(runs: list) -> list:
    """The first run of every level of every axis: each override value of the grid appears in one of them."""
    chosen: dict[str, object] = {}
    for axis in runs[0].levels:
        for run in runs:
            if all(r.levels[axis] != run.levels[axis] for r in chosen.values()):
                chosen.setdefault(run.name, run)
    return [r for r in runs if r.name in chosen]


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_every_level_parses_with_the_cli(spec: Path, parser, tmp_path: Path):
    """cpu: one run per level of each axis; paper: its first run and every level of the axes it replaces (the
    other levels are the cpu profile's; parsing all ~230 runs takes minutes on 2 shared cores)."""
    for profile in ("cpu", "paper"):
        sweep = expand(spec, profile, output=tmp_path / spec.stem)
        runs = _covering(sweep.runs)
        assert {lv for r in runs for lv in r.levels.values()} == {lv for r in sweep.runs for lv in r.levels.values()}
        if profile == "paper":
            replaced = set(load_spec(spec)["profiles"]["paper"].get("axes") or {})
            runs = [r for r in runs if r is sweep.runs[0] or any(r.levels[a] for a in replaced)]
        for run in runs:
            cfg = parser.parse_args(run.cli_args(sweep.sweep_dir))
            assert cfg.seed_everything == run.seed
            assert cfg.trainer.logger.init_args.version == run.name
            if "model.config.attention" in run.overrides:
                assert cfg.model.config.attention == run.overrides["model.config.attention"]
            if "model.config.attention_options" in run.overrides:
                for key, value in run.overrides["model.config.attention_options"].items():
                    assert cfg.model.config.attention_options[key] == value


def _tiny(run_args: list[str], tmp_path: Path) -> list[str]:
    return [
        *run_args,
        "--data.seq_len=32",
        "--data.batch_size=2",
        "--data.val_batch_size=2",
        "--trainer.limit_val_batches=1",
        "--trainer.val_check_interval=2",
        "--budget.tokens=128",  # 2 steps
        f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
    ]


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_one_run_of_each_spec_trains(spec: Path, tmp_path: Path, request):
    """The last run without waits of each cpu profile, shrunk to 2 steps of 2 x 32 tokens."""
    sweep = expand(spec, "cpu", output=tmp_path / "sweep")
    run = [r for r in sweep.runs if not r.depends_on][-1]
    args = run.cli_args(sweep.sweep_dir)
    if "data.source" in run.overrides:  # a corpus of ../shared/data
        if sweep.missing_needs():
            pytest.skip(f"shared data absent: {sweep.missing_needs()}")
        args.append(f"--data.data_dir={tmp_path / 'shards'}")
    else:
        corpus = tmp_path / "corpus.jsonl"
        corpus.write_text("".join(json.dumps({"text": f"Doc {i}. " + "attention " * 40}) + "\n" for i in range(30)))
        args += [f"--data.source={corpus}", f"--data.data_dir={tmp_path / 'shards'}", "--data.val_fraction=0.2"]
    main(["fit", *_tiny(args, tmp_path)])
    budget = json.loads(next((tmp_path / "runs").rglob("budget.json")).read_text())
    assert budget["steps"] == 2


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda s: s.pop("profiles"), "missing top-level key 'profiles'"),
        (lambda s: s["profiles"].pop("paper"), "missing \\['paper'\\]"),
        (lambda s: s["axes"]["arm"].update({"bad name": {}}), "not a plain name"),
        (lambda s: s.update(baseline={"nope": "a"}), "baseline names unknown axes"),
        (lambda s: s.update(baseline={"arm": "zzz"}), "baseline level arm='zzz'"),
        (lambda s: s["axes"]["arm"]["b"].update({"budget.match_to": "{run:b}"}), "refers to the run itself"),
        (lambda s: s["axes"]["arm"]["b"].update({"budget.match_to": "{run:q}"}), "names no level"),
        (lambda s: s.update(metric="val/acc"), "metric 'val/acc'"),
    ],
)
def test_malformed_specs_fail_clearly(tmp_path: Path, edit, message: str):
    spec = {
        "study": "t",
        "baseline": {"arm": "a"},
        "axes": {"arm": {"a": {}, "b": {"model.config.attention": "coupled"}}},
        "profiles": {
            "cpu": {"configs": ["configs/quickstart.yaml"]},
            "paper": {"configs": ["configs/quickstart.yaml"]},
        },
    }
    edit(spec)
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(SpecError, match=message):
        expand(path, "cpu")


def test_cycles_and_unknown_specs_and_profiles(tmp_path: Path):
    spec = {
        "study": "t",
        "baseline": {"arm": "a"},
        "axes": {"arm": {"a": {"x": "{run:b}"}, "b": {"x": "{run:a}"}}},
        "profiles": {"cpu": {"configs": ["c.yaml"]}, "paper": {"configs": ["c.yaml"]}},
    }
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(SpecError, match="cycle"):
        expand(path, "cpu")
    with pytest.raises(SpecError, match="no profile 'gpu'; profiles: cpu, paper"):
        expand(path, "gpu")
    with pytest.raises(SpecError, match="Available in configs/ablations/: .*coupling"):
        expand("configs/ablations/nope.yaml", "cpu")
    with pytest.raises(SystemExit, match="no profile 'gpu'"):
        main(["sweep", str(path), "--profile", "gpu", "--dry-run"])
