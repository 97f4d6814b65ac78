"""The sweep runner with real subprocesses: a killed sweep restarts, skips what is done and resumes the rest from
its last checkpoint; runs that wait for another (budget.match_to) get its budget; dry runs and SLURM scripts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lightning_cqk.cli import main
from lightning_cqk.study.design.spec import SpecError, expand
from lightning_cqk.study.run.run_scalars import read_scalars
from lightning_cqk.study.run.runner import Ledger, write_slurm

REPO = Path(__file__).resolve().parents[3]
TOKENS_PER_STEP = 2 * 16  # batch 2 x seq_len 16


def _corpus(path: Path) -> Path:
    text = "Queries meet keys; values follow the weights. " * 6
    with path.open("w") as f:
        for i in range(40):
            f.write(json.dumps({"text": f"Document {i}. " + text * (1 + i % 3)}) + "\n")
    return path


def _write_spec(tmp: Path) -> Path:
    ckpt = {"class_path": "lightning_cqk.callbacks.RunCheckpoint", "init_args": {"every_n_steps": 2, "keep_last": 1}}
    killer = {"class_path": "sweep_helpers.KillSweepOnce", "init_args": {"at_step": 7, "marker": str(tmp / "killed")}}
    (tmp / "ckpt.yaml").write_text(yaml.safe_dump({"trainer": {"callbacks": [ckpt]}}))
    (tmp / "killer.yaml").write_text(yaml.safe_dump({"trainer": {"callbacks": [ckpt, killer]}}))
    corpus = _corpus(tmp / "corpus.jsonl")
    spec = {
        "study": "mini",
        "metric": "val/ppl",
        "baseline": {"arm": "ref"},
        "axes": {
            "arm": {
                "ref": {"model.config.attention": "standard"},
                # twice ref's tokens, read from ref's budget.json; killed after step 7 in its first attempt
                "matched": {
                    "config": str(tmp / "killer.yaml"),
                    "budget.tokens": None,
                    "budget.match_to": "{run:ref}",
                    "budget.ratio": 2.0,
                },
                "other": {"model.config.attention": "coupled"},
            }
        },
        "profiles": {
            "paper": {"configs": [str(REPO / "configs" / "quickstart.yaml")]},
            "cpu": {
                "configs": [str(REPO / "configs" / "quickstart.yaml"), str(tmp / "ckpt.yaml")],
                "seeds": [1],
                "overrides": {
                    "data.source": str(corpus),
                    "data.data_dir": str(tmp / "shards"),
                    "data.val_fraction": 0.2,
                    "data.seq_len": 16,
                    "data.batch_size": 2,
                    "model.config.n_layer": 1,
                    "budget.tokens": 6 * TOKENS_PER_STEP,
                    "trainer.val_check_interval": 3,
                    "trainer.limit_val_batches": 1,
                    "trainer.log_every_n_steps": 1,
                    "trainer.enable_progress_bar": False,
                    "trainer.enable_model_summary": False,
                    "model.optim.warmup_steps": 1,
                },
            },
        },
    }
    path = tmp / "mini.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _sweep(spec: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests" / "e2e" / "study")]))
    return subprocess.run(
        [sys.executable, "-m", "lightning_cqk", "sweep", str(spec), "--output", str(out), "--jobs", "2", *extra],
        cwd=spec.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=500,
        start_new_session=True,  # its own process group: the kill takes the runner and its runs, not pytest
    )


@pytest.mark.slow
def test_killed_sweep_restarts_skips_done_runs_and_resumes_from_last_checkpoint(tmp_path: Path):
    spec = _write_spec(tmp_path)
    out = tmp_path / "runs" / "mini"
    first = _sweep(spec, out, "--no-report")
    assert first.returncode == -9, first.stdout + first.stderr  # SIGKILLed with its runs, mid-sweep
    status = {p.stem: json.loads(p.read_text()) for p in (out / "status").glob("*.json")}
    assert status["ref-s1"]["status"] == "done"
    assert status["matched-s1"]["status"] == "running"  # what a killed runner leaves behind
    assert (out / "matched-s1" / "checkpoints" / "last.ckpt").is_file()
    ref_events = sorted((out / "ref-s1").glob("events.out.tfevents.*"))
    ref_mtimes = [p.stat().st_mtime_ns for p in ref_events]

    second = _sweep(spec, out)
    log = second.stdout + second.stderr
    assert second.returncode == 0, log
    assert "ref-s1: done before, skipped" in log
    assert f"matched-s1: resuming from {out / 'matched-s1' / 'checkpoints' / 'last.ckpt'}" in log
    assert [p.stat().st_mtime_ns for p in sorted((out / "ref-s1").glob("events.out.tfevents.*"))] == ref_mtimes
    manifest = json.loads((out / "manifest.json").read_text())
    runs = {r["name"]: r for r in manifest["runs"]}
    assert {r["status"] for r in runs.values()} == {"done"}
    assert runs["ref-s1"]["attempts"] == 1 and runs["matched-s1"]["attempts"] == 2
    assert runs["matched-s1"]["resumed_from"].endswith("last.ckpt")
    assert runs["matched-s1"]["depends_on"] == ["ref-s1"]
    assert manifest["git"]["revision"] and len(runs["ref-s1"]["config_hash"]) == 16
    # each run records the code of its attempts: the same checkout ran both invocations, so one revision each
    revision = manifest["git"]["revision"] + ("-dirty" if manifest["git"]["dirty"] else "")
    assert {tuple(r["revisions"]) for r in runs.values()} == {(revision,)}
    ref = json.loads((out / "ref-s1" / "budget.json").read_text())
    matched = json.loads((out / "matched-s1" / "budget.json").read_text())
    assert ref["steps"] == 6 and ref["tokens"] == 6 * TOKENS_PER_STEP
    assert matched["steps"] == 12 and matched["tokens"] == 2 * ref["tokens"]  # 2 x ref, across the kill
    assert matched["budget"]["match_to"] == str(out / "ref-s1")
    # the report (written at the end of the sweep) takes its numbers from the runs' scalars
    rows = {line.split(",")[0]: line.split(",") for line in (out / "report" / "mini.csv").read_text().splitlines()}
    header = rows["group"]
    final = read_scalars(out / "matched-s1")["val/ppl"][-1]
    assert final[0] == 11  # last validation at step 12 (logged at global step index 11)
    assert float(rows["matched"][header.index("val/ppl_mean")]) == pytest.approx(final[1], rel=1e-12)
    for png in ("val_curves", "stability", "ppl_vs_tokens"):
        assert (out / "report" / f"{png}.png").stat().st_size > 5000

    # each run's log has its progress lines (the sweep's progress line reads them; issue 35: all read 'starting')
    from lightning_cqk.study.run.runner import run_progress

    assert run_progress(out / "logs" / "ref-s1.log")[:2] == (6, 6)
    assert run_progress(out / "logs" / "matched-s1.log")[:2] == (12, 12)

    third = _sweep(spec, out, "--no-report")
    assert third.returncode == 0 and third.stdout.count("done before, skipped") == 3


def test_dry_run_prints_every_run_and_its_command(tmp_path: Path, capsys):
    spec = _write_spec(tmp_path)
    main(["sweep", str(spec), "--output", str(tmp_path / "out"), "--dry-run"])
    out = capsys.readouterr().out
    assert "mini (cpu profile): 3 runs" in out
    assert "matched-s1" in out and "after ref-s1" in out
    assert f"--budget.match_to={tmp_path / 'out' / 'ref-s1'}" in out
    assert not (tmp_path / "out").exists()  # a dry run writes nothing


def test_slurm_scripts_chain_the_waves(tmp_path: Path):
    sweep = expand(_write_spec(tmp_path), "cpu", tmp_path / "out")
    sweep.slurm = ["#SBATCH --no-requeue"]  # a profile's line comes after the defaults: sbatch takes the last
    files = write_slurm(sweep, "mini.yaml", max_parallel=4)
    assert [f.name for f in files] == ["wave0.sbatch", "wave1.sbatch", "report.sbatch", "submit.sh"]
    wave0, wave1, report, submit = (f.read_text() for f in files)
    defaults = ["#SBATCH --signal=USR1@90", "#SBATCH --requeue", "#SBATCH --open-mode=append"]
    lines = wave0.splitlines()
    assert all(line in lines for line in defaults)  # the stop signal, requeue on preemption, one log per task
    assert lines.index("#SBATCH --no-requeue") > lines.index("#SBATCH --requeue")
    assert f"python -m lightning_cqk report {tmp_path / 'out'}" in report
    assert submit.index("wave1.sbatch") < submit.index("report.sbatch")
    assert "#SBATCH --array=0-1%4" in wave0 and "RUNS=(ref-s1 other-s1)" in wave0
    assert "#SBATCH --array=0-0%4" in wave1 and "RUNS=(matched-s1)" in wave1
    assert '--run "${RUNS[$SLURM_ARRAY_TASK_ID]}"' in wave0
    assert "--dependency=afterok" in submit
    for f in files:
        assert subprocess.run(["bash", "-n", str(f)]).returncode == 0
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["runs"][0]["status"] == "pending"


def test_finished_run_with_changed_config_is_refused(tmp_path: Path):
    spec = _write_spec(tmp_path)
    sweep = expand(spec, "cpu", tmp_path / "out")
    ledger = Ledger(sweep)
    run = sweep.runs[0]
    (ledger.run_dir(run)).mkdir(parents=True)
    (ledger.run_dir(run) / "budget.json").write_text("{}")
    ledger.set_status(run, status="done", config_hash=run.config_hash(), **ledger.identity_fields(run))
    assert ledger.is_done(run)
    (tmp_path / "ckpt.yaml").write_text(
        (tmp_path / "ckpt.yaml").read_text().replace("every_n_steps: 2", "every_n_steps: 3")
    )
    changed = expand(spec, "cpu", tmp_path / "out")
    with pytest.raises(SpecError, match="settings: the resolved configuration differs"):
        Ledger(changed).is_done(changed.runs[0])


def test_missing_shared_data_fails_before_anything_runs(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("LIGHTNING_CQK_SHARED_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(SystemExit, match="needs .*nowhere"):
        main(["sweep", "configs/ablations/corpus.yaml", "--output", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_runs_made_by_other_code_are_named_before_the_sweep_goes_on(tmp_path: Path):
    spec = _write_spec(tmp_path)
    sweep = expand(spec, "cpu", tmp_path / "out")
    ledger = Ledger(sweep)
    ref, matched = sweep.runs[0], sweep.runs[1]
    ledger.set_status(ref, status="done", config_hash=ref.config_hash(), revisions=[ledger.code_revision()])
    assert ledger.mixed_revisions(sweep.runs) is None
    ledger.set_status(matched, status="running", revisions=["0123456789abcdef-old"])
    note = ledger.mixed_revisions(sweep.runs)
    assert note is not None and "0123456789ab (1 runs)" in note and "--output" in note


def test_runs_that_share_shards_share_a_data_key_and_finished_shards_are_ready(tmp_path: Path, monkeypatch):
    from lightning_cqk.study.run.shard_settings import data_key as _data_key
    from lightning_cqk.study.run.shard_settings import shards_ready as _shards_ready

    monkeypatch.chdir(REPO)
    runs = {r.name: r for r in expand(REPO / "configs" / "ablations" / "deconstruction.yaml", "cpu").runs}
    # the seed orders the windows and a level's attention config holds no data: one shard setting for all of them
    assert _data_key(runs["standard-s1"]) == _data_key(runs["standard-s3"]) == _data_key(runs["approximate-hybrid-s2"])
    assert _data_key(runs["tune-standard-lr0.002-s0"]) == _data_key(runs["standard-s1"])  # the lr grid: the same shards
    corpus = {r.name: r for r in expand(REPO / "configs" / "ablations" / "corpus.yaml", "cpu").runs}
    assert _data_key(corpus["wikitext-standard-s1"]) != _data_key(corpus["pubmed-standard-s1"])
    run = corpus["pubmed-coupled-s2"]
    shards = tmp_path / "shards"
    run.overrides["data.data_dir"] = str(shards)
    assert not _shards_ready(run)
    shards.mkdir()
    (shards / "train").mkdir()
    assert not _shards_ready(run)  # an unfinished prepare: no manifest.json yet
    (shards / "manifest.json").write_text("{}")
    assert _shards_ready(run)
    run.overrides["data.data_dir"] = "s3://bucket/shards"
    assert not _shards_ready(run)


@pytest.mark.parametrize("shards_exist, second_starts_with", [(False, 1), (True, 2)])
def test_seeds_of_one_data_setting_run_two_at_a_time(tmp_path: Path, monkeypatch, shards_exist, second_starts_with):
    """The scheduler itself, with stand-in runs: one run prepares the shards alone, then the other seeds go in
    parallel; with finished shards already there, nobody waits. (The seed once made every run wait alone.)"""
    from lightning_cqk.study.run import runner

    spec = _write_spec(tmp_path)
    sweep = expand(spec, "cpu", tmp_path / "out")
    base = sweep.runs[0]
    shards = tmp_path / "shards"
    if shards_exist:
        shards.mkdir()
        (shards / "manifest.json").write_text("{}")
    todo = [
        runner.Run(f"ref-s{seed}", "ref", seed, base.levels, base.configs, {**base.overrides, "data.seed": seed}, [])
        for seed in (1, 2, 3)
    ]
    concurrency: list[int] = []

    class StandIn:
        def __init__(self, ledger, run, threads, restart_changed=False):
            self.run, self.polls = run, 0
            self.proc = self
            concurrency.append(len(running) + 1)

        def poll(self):
            self.polls += 1
            return 0 if self.polls > 1 else None

        def finish(self):
            return True

    monkeypatch.setattr(runner, "_Launch", StandIn)
    monkeypatch.setattr(runner.time, "sleep", lambda s: None)
    running: list = []
    result = {"skipped": [], "done": [], "failed": []}
    runner._schedule(Ledger(sweep), todo, running, set(), set(), result, jobs=2, threads=1)
    assert sorted(result["done"]) == ["ref-s1", "ref-s2", "ref-s3"]
    # runs in flight as each started: the second waits for the first only while the shards are being prepared
    assert concurrency[0] == 1 and concurrency[1] == second_starts_with
    assert max(concurrency) == 2  # the seeds share the shards: never one at a time throughout


def test_a_stop_signal_while_an_array_task_starts_starts_no_run(tmp_path: Path, monkeypatch, capsys):
    """SIGUSR1 / SIGTERM that reach `sweep --run` before its runner handles them are kept (`_note_early_stop`): no
    run starts, the run stays pending (outside SLURM nothing is requeued) and the sweep says how to resume."""
    from lightning_cqk.study.run import runner

    for name in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(name)
    monkeypatch.setattr(runner, "_early_stops", ["SIGUSR1"])
    sweep = expand(_write_spec(tmp_path), "cpu", tmp_path / "out")
    result = runner.run_local(sweep, only=["ref-s1"])
    assert result["stopped_by"] == ["SIGUSR1"] and result["stopped"] == [] and result["done"] == []
    assert Ledger(sweep).status(sweep.run("ref-s1"))["status"] == "pending"
    assert "[sweep] stopped by SIGUSR1: run the same command again to resume" in capsys.readouterr().out
    assert runner._exit_code("SIGUSR1") == 138 and runner._exit_code("SIGTERM") == 143


def test_a_stop_signal_after_the_runs_finished_is_no_stop(tmp_path: Path, monkeypatch, capsys):
    """A time limit's SIGUSR1 that comes after the array task's run finished: the task ends as done (exit 0), not
    stopped, so SLURM marks it completed and the next wave starts (seen on a real cluster: the task failed)."""
    from lightning_cqk.study.run import runner

    monkeypatch.setattr(runner, "_early_stops", ["SIGUSR1"])
    sweep = expand(_write_spec(tmp_path), "cpu", tmp_path / "out")
    ledger, run = Ledger(sweep), sweep.run("ref-s1")
    ledger.run_dir(run).mkdir(parents=True)
    (ledger.run_dir(run) / "budget.json").write_text("{}")
    ledger.set_status(run, status="done", config_hash=run.config_hash(), **ledger.identity_fields(run))
    result = runner.run_local(sweep, only=["ref-s1"])
    assert result["skipped"] == ["ref-s1"] and "stopped_by" not in result
    assert "SIGUSR1 came when every run was finished: nothing to stop or requeue" in capsys.readouterr().out


def test_an_array_task_ignores_a_late_stop_warning_once_its_run_is_recorded(tmp_path: Path, monkeypatch):
    """After `sweep --run` returns in a SLURM job, SIGUSR1 is ignored: a time limit's warning while the task's
    process exits would otherwise end it "User defined signal 1", failed, with its run done (seen on a real cluster).
    Outside SLURM the handler the process had comes back."""
    import signal

    sweep = expand(_write_spec(tmp_path), "cpu", tmp_path / "out")
    ledger, run = Ledger(sweep), sweep.run("ref-s1")
    ledger.run_dir(run).mkdir(parents=True)
    (ledger.run_dir(run) / "budget.json").write_text("{}")
    ledger.set_status(run, status="done", config_hash=run.config_hash(), **ledger.identity_fields(run))
    before = signal.getsignal(signal.SIGUSR1)
    try:
        for job, expected in ((None, before), ("77", signal.SIG_IGN)):
            if job is None:
                monkeypatch.delenv("SLURM_JOB_ID", raising=False)
            else:
                monkeypatch.setenv("SLURM_JOB_ID", job)
            monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
            main(["sweep", str(tmp_path / "mini.yaml"), "--output", str(tmp_path / "out"), "--run", "ref-s1"])
            assert signal.getsignal(signal.SIGUSR1) == expected
    finally:
        signal.signal(signal.SIGUSR1, before)
