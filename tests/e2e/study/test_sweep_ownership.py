"""One owner per sweep output (issue 13, class 5), with real `lightning_cqk sweep` subprocesses: a second sweep into
the same directory is refused; after the runner alone is SIGKILLed, a rerun refuses (naming the orphan's pid) rather
than deleting the directory the orphan still writes; an interrupted run whose spec level was edited is refused, and
restarted from scratch only with --restart-changed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from lightning_cqk.cli import main
from lightning_cqk.run.lock import acquire
from lightning_cqk.study.design.spec import expand
from lightning_cqk.study.run.runner import Ledger

REPO = Path(__file__).resolve().parents[3]


def _spec(tmp: Path, max_steps: int, lr: float = 2e-3) -> Path:
    corpus = tmp / "corpus.jsonl"
    if not corpus.exists():
        corpus.write_text(
            "".join(json.dumps({"text": f"Doc {i}. " + "keys and queries " * 20}) + "\n" for i in range(40))
        )
    spec = {
        "study": "own",
        "metric": "val/ppl",
        "baseline": {"arm": "ref"},
        "axes": {"arm": {"ref": {"model.optim.lr": lr}}},
        "profiles": {
            "paper": {"configs": [str(REPO / "configs" / "quickstart.yaml")]},
            "cpu": {
                "configs": [str(REPO / "configs" / "quickstart.yaml")],
                "seeds": [1],
                "overrides": {
                    "data.source": str(corpus),
                    "data.data_dir": str(tmp / "shards"),
                    "data.val_fraction": 0.2,
                    "data.seq_len": 16,
                    "data.batch_size": 2,
                    "model.config.n_layer": 1,
                    "model.config.n_embd": 16,
                    "model.config.n_head": 2,
                    "model.config.mlp_hidden": 32,
                    "trainer.max_steps": max_steps,
                    "trainer.val_check_interval": 1000,
                    "trainer.limit_val_batches": 1,
                    "trainer.enable_progress_bar": False,
                    "trainer.enable_model_summary": False,
                    "model.optim.warmup_steps": 1,
                },
            },
        },
    }
    path = tmp / "own.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _sweep_cmd(spec: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "lightning_cqk", "sweep", str(spec), "--output", str(out), "--no-report", *extra]


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")


def _sweep(spec: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        _sweep_cmd(spec, out, *extra), cwd=spec.parent, env=_env(), capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_second_sweep_is_refused_and_an_orphan_writer_is_never_deleted(tmp_path: Path):
    spec, out = _spec(tmp_path, max_steps=10**6), tmp_path / "out"
    runner = subprocess.Popen(
        _sweep_cmd(spec, out), cwd=tmp_path, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        run_dir = out / "ref-s1"
        deadline = time.monotonic() + 180
        while not (run_dir / "run.json").exists():  # the run is training
            assert runner.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        with pytest.raises(SystemExit, match=rf"is being run by another sweep \(pid {runner.pid}"):
            main(["sweep", str(spec), "--output", str(out), "--no-report"])  # (refused before anything starts)

        os.kill(runner.pid, signal.SIGKILL)  # the runner alone: its run goes on, an orphan
        runner.wait()
        child = json.loads((run_dir / "run.json").read_text())["attempts"][-1]["pid"]
        os.kill(child, 0)  # still alive
        with pytest.raises(SystemExit, match=rf"still being written by pid {child}"):
            main(["sweep", str(spec), "--output", str(out), "--no-report"])
        assert (run_dir / "run.json").exists() and (run_dir / ".lock").exists(), "the live run's directory is intact"
        os.kill(child, 0)  # and its writer untouched
    finally:
        os.killpg(runner.pid, signal.SIGKILL)


@pytest.mark.slow
def test_interrupted_run_with_an_edited_level_is_refused_then_restarted_only_on_request(tmp_path: Path):
    spec, out = _spec(tmp_path, max_steps=3), tmp_path / "out"
    sweep = expand(spec, "cpu", out)
    ledger, run = Ledger(sweep), sweep.runs[0]
    # What an interrupted attempt leaves: status running under the old settings, a checkpoint of them.
    old_hash = run.config_hash()
    ckpt = ledger.run_dir(run) / "checkpoints" / "last.ckpt"
    ckpt.parent.mkdir(parents=True)
    torch.save({"global_step": 2, "marker": "old settings"}, ckpt)
    ledger.set_status(run, status="running", attempts=1, config_hash=old_hash)

    _spec(tmp_path, max_steps=3, lr=1e-3)  # the level is edited
    with pytest.raises(SystemExit, match=rf"was interrupted with config hash {old_hash}.*--restart-changed"):
        main(["sweep", str(spec), "--output", str(out), "--no-report"])
    assert torch.load(ckpt, weights_only=False)["marker"] == "old settings", "nothing deleted, nothing resumed"

    restarted = _sweep(spec, out, "--restart-changed")
    assert restarted.returncode == 0, restarted.stdout[-2000:] + restarted.stderr[-2000:]
    assert "restarting it from scratch" in restarted.stdout
    attempts = json.loads((ledger.run_dir(run) / "run.json").read_text())["attempts"]
    assert len(attempts) == 1 and attempts[0]["from_step"] == 0 and attempts[0]["ckpt_path"] is None
    final = torch.load(ckpt, weights_only=False)
    assert final["global_step"] == 3 and final["hyper_parameters"]["optim"]["lr"] == 1e-3


def _lock_from_another_host(folder: Path, name: str) -> Path:
    """The lock file a sweep (or run) on host `elsewhere` leaves on a shared file system: pid 424242 is not ours."""
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / name
    owner = {"pid": 424242, "host": "elsewhere", "start": None, "since": time.time(), "argv": ["lightning_cqk"]}
    lock.write_text(json.dumps(owner))
    return lock


def _advice_to_delete(message: str, lock: Path) -> str:
    """The shell command a message gives for a lock of another host (and no `kill` of its pid)."""
    assert "kill 424242" not in message, message
    advice = "it runs on host elsewhere, which cannot be checked from here: if it is finished or dead, delete its "
    assert f"{advice}lock file (rm {lock}); otherwise wait for it" in message, message
    return f"rm {lock}"


@pytest.mark.parametrize("extra", [[], ["--run", "ref-s1"]], ids=["whole sweep", "one run"])
def test_a_sweep_lock_from_another_host_says_delete_it_never_kill(tmp_path: Path, extra: list[str]):
    """Issue 34 defect 7: the advice was `kill 424242`, a pid of another machine. Now it is the run lock's: delete
    the lock file if that sweep is finished or dead; the pasted command frees the directory."""
    spec, out = _spec(tmp_path, max_steps=3), tmp_path / "out"
    lock = _lock_from_another_host(out, ".sweep.lock")
    with pytest.raises(SystemExit) as refused:
        main(["sweep", str(spec), "--output", str(out), "--no-report", *extra])
    subprocess.run(_advice_to_delete(str(refused.value.code), lock), shell=True, check=True)
    acquire(out, name=".sweep.lock", what="Sweep directory").release()  # free now


def test_a_run_lock_from_another_host_says_delete_it_never_kill(tmp_path: Path):
    spec, out = _spec(tmp_path, max_steps=3), tmp_path / "out"
    sweep = expand(spec, "cpu", out)
    ledger, run = Ledger(sweep), sweep.runs[0]
    lock = _lock_from_another_host(ledger.run_dir(run), ".lock")
    subprocess.run(_advice_to_delete(ledger.problems(run), lock), shell=True, check=True)
    assert ledger.problems(run) is None
