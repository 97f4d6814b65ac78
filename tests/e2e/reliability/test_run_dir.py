"""One owner for the run directory (issue 13, classes 3, 7b and 8), through real `lightning_cqk fit` subprocesses.

Class 3: a resume may change the learning rate (and then it is applied to the restored optimizer and schedule) but
not the architecture or the data; a refused resume writes nothing, and every attempt's configuration is kept.
Class 7b: `--ckpt_path last` beside a missing or damaged last.ckpt resumes from the newest intact step=*.ckpt.
Class 8: SIGTERM to the whole process group (DataLoader workers included) and Ctrl-C save and print how to resume;
the same command again resumes the unfinished run; a failed launch leaves no directory behind.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from tiny_run import child_env, quickstart_callbacks, tiny_fit

from lightning_cqk.cli import main
from lightning_cqk.optim.schedule import warmup_cosine
from lightning_cqk.run.directory import ResumeRefused, resolve_fit, resumable_checkpoint


def fit(shards: Path, runs: Path, *extra: str, every: int = 2) -> list[str]:
    """`-m lightning_cqk` and the tiny run with the quickstart's callbacks, RunCheckpoint every `every` steps."""
    cb = quickstart_callbacks(runs.parent / f"{runs.name}-callbacks.yaml", every_n_steps=every, keep_last=3)
    delta = ["--model.optim.warmup_steps=2", "--trainer.val_check_interval=1000", "--trainer.limit_val_batches=1"]
    return [
        "-m",
        "lightning_cqk",
        *tiny_fit(shards, runs, *delta, "--trainer.log_every_n_steps=1", *extra, configs=[cb]),
    ]


def env() -> dict[str, str]:
    return child_env()


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], env=env(), cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_resume_applies_a_changed_lr_refuses_a_changed_model_and_records_only_what_happened(tiny_shards, tmp_path):
    runs = tmp_path / "runs"
    first = run(fit(tiny_shards, runs, "--trainer.max_steps=4"), tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    (run_dir,) = (runs / "quickstart").iterdir()
    config = (run_dir / "config.yaml").read_bytes()
    last = run_dir / "checkpoints" / "last.ckpt"

    # An explicit checkpoint file + another architecture: Lightning's CLI would load the checkpoint's settings over
    # the command line and train a standard model silently. Refused, naming the setting; nothing is written.
    # (Refusals come before anything is built: they are checked in this process, with the real CLI.)
    with pytest.raises(ResumeRefused) as refused:
        other_model = "--model.config.attention=coupled"
        main(fit(tiny_shards, runs, "--trainer.max_steps=6", f"--ckpt_path={last}", other_model)[2:])
    assert 'model.config.attention: "standard" -> "coupled"' in str(refused.value)
    assert (run_dir / "config.yaml").read_bytes() == config, "a refused resume must not rewrite config.yaml"
    assert not list(run_dir.glob("config.resume-*.yaml"))
    assert len(json.loads((run_dir / "run.json").read_text())["attempts"]) == 1
    with pytest.raises(ResumeRefused) as data:
        main(fit(tiny_shards, runs, "--trainer.max_steps=6", "--ckpt_path=last", "--data.seq_len=8")[2:])
    assert "data.seq_len: 16 -> 8" in str(data.value)
    assert (run_dir / "config.yaml").read_bytes() == config and not list(run_dir.glob("config.resume-*.yaml"))
    # The refusal's own advice works when pasted (the recorded configuration is intact).
    advice = str(data.value).split("To resume it as it was: ")[1].split(". To train")[0].split()
    assert advice[:2] == ["lightning_cqk", "fit"]
    pasted = run(["-m", "lightning_cqk", *advice[1:]], tmp_path)
    assert pasted.returncode == 0, pasted.stderr[-2000:]

    # Class 7b: last.ckpt gone, step=*.ckpt intact beside it: the newest intact one is used, and the run says so.
    last.unlink()
    (run_dir / "checkpoints" / "step=00000004.ckpt").write_bytes(b"truncated")  # the newest one is damaged too
    # and so is the best file of the final validation at step 4 (callbacks/final_validation.py), a full checkpoint
    (run_dir / "checkpoints" / "best-step=4.ckpt").write_bytes(b"truncated")
    lr = 1e-4
    resumed = run(
        fit(tiny_shards, runs, "--trainer.max_steps=6", "--ckpt_path=last", f"--model.optim.lr={lr}"), tmp_path
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "last.ckpt is missing; using step=00000002.ckpt" in resumed.stderr
    assert "model.optim.lr: 0.002 -> 0.0001" in resumed.stderr
    final = torch.load(last, weights_only=False)
    assert final["global_step"] == 6
    groups = final["optimizer_states"][0]["param_groups"]
    assert {g["initial_lr"] for g in groups} == {lr}, "the changed peak learning rate is applied, not the saved one"
    assert final["lr_schedulers"][0]["base_lrs"] == [lr] * len(groups)
    assert groups[0]["lr"] == pytest.approx(lr * warmup_cosine(6, 2, 6, 0.1))
    # Every attempt's configuration is kept; the record says what changed and from where it resumed.
    assert (run_dir / "config.yaml").read_bytes() == config
    # (The pasted resume of the finished run trained no step: an attempt too, issue 25 class 3: config.resume-1.)
    resume_cfg = yaml.safe_load((run_dir / "config.resume-2.yaml").read_text())
    assert resume_cfg["model"]["optim"]["lr"] == lr and resume_cfg["trainer"]["max_steps"] == 6
    attempts = json.loads((run_dir / "run.json").read_text())["attempts"]
    assert [a["status"] for a in attempts] == ["finished", "finished", "finished"]
    assert attempts[1]["trained_no_step"] is True and attempts[1]["config"] == "config.resume-1.yaml"
    assert attempts[2]["from_step"] == 2 and attempts[2]["changed"]["model.optim.lr"] == [0.002, lr]
    assert attempts[2]["ckpt_path"].endswith("step=00000002.ckpt")


def _wait_for(path: Path, proc: subprocess.Popen, seconds: float = 120) -> None:
    """Wait for `path` to appear; on failure kill `proc`'s whole process group (it would train for ever)."""
    deadline = time.monotonic() + seconds
    try:
        while not path.exists():
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, f"{path} did not appear"
            time.sleep(0.05)
    except BaseException:
        _kill_group(proc)
        raise


def _kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=60)


@pytest.mark.slow
def test_sigterm_to_the_process_group_and_ctrl_c_save_and_the_same_command_resumes(tiny_shards, tmp_path):
    runs = tmp_path / "runs"
    command = [
        sys.executable,
        *fit(tiny_shards, runs, "--trainer.max_steps=100000", "--data.num_workers=2", every=10**6),
    ]
    run_dir = runs / "quickstart" / "standard-tiny-L1-H2-d16-ff32-s1337"  # the size label names the shape

    # A failed launch (a typo in a path) leaves no directory that a later --ckpt_path last could pick.
    typo = run([*command[1:], "--data.data_dir=/nonexistent/shards"], tmp_path)
    assert typo.returncode != 0, typo.stderr[-2000:]
    assert not run_dir.exists() and not list((runs / "quickstart").glob("*")), "nothing left by the failed launch"

    saved_steps = []
    for sig, status in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
        proc = subprocess.Popen(command, env=env(), cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)  # fmt: skip
        try:
            _wait_for(run_dir / "run.json", proc)
            record = json.loads((run_dir / "run.json").read_text())
            while len(record["attempts"]) < len(saved_steps) + 1:
                time.sleep(0.05)
                record = json.loads((run_dir / "run.json").read_text())
            time.sleep(1.0)  # a few steps, with both DataLoader workers busy
            os.killpg(proc.pid, sig)  # what `timeout`, `kill -- -PGID` and Ctrl-C in a terminal do
            err = proc.communicate(timeout=120)[1]
        finally:  # never leave a run of 100,000 steps behind a failed assertion
            _kill_group(proc)
        assert proc.returncode == status, err[-3000:]
        assert "is killed by signal" not in err
        name = signal.Signals(sig).name
        assert f"interrupted by {name}" in err and "Resume with:" in err, err[-2000:]
        attempt = json.loads((run_dir / "run.json").read_text())["attempts"][-1]
        assert attempt["status"] == "interrupted" and attempt["signal"] == name
        step = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"]
        assert step == attempt["step"] > (saved_steps[-1] if saved_steps else 0), "saved at the step it stopped"
        if saved_steps:  # the same command again resumed the interrupted run (not step 0 in a new -2 directory)
            assert attempt["from_step"] == saved_steps[-1] and "resuming it from" in err
        saved_steps.append(step)
    assert sorted(p.name for p in (runs / "quickstart").iterdir()) == [run_dir.name]


def probe_flags(at_batch: int, signal_name: str) -> list[str]:
    return ["--trainer.callbacks+=signal_probe.SignalAtBatch", f"--trainer.callbacks.at_batch={at_batch}",
            f"--trainer.callbacks.signal_name={signal_name}"]  # fmt: skip


def _signal_at_micro_batch(fit_args: list[str], run_dir: Path, sig: signal.Signals, at_batch: int) -> tuple[int, str]:
    """Run `fit` in its own process group; `signal_probe.SignalAtBatch` sends `sig` to the group at micro-batch
    `at_batch` (the same moment every time). Returns the exit status and the output."""
    environment = child_env(Path(__file__).parent)
    command = [sys.executable, *fit_args, *probe_flags(at_batch, sig.name)]
    proc = subprocess.Popen(command, env=environment, cwd=run_dir.parents[2], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        _kill_group(proc)
    return proc.returncode, out + err


@pytest.mark.slow
def test_ctrl_c_before_the_first_optimizer_step_removes_the_run_and_the_printed_command_starts_it(
    tiny_shards, tmp_path
):
    """Issue 35 item 2: at step 0 of an accumulated step (the card's PubMed job on a CPU) Ctrl-C left an empty run
    folder and printed a `--ckpt_path last` command that was refused when pasted."""
    runs = tmp_path / "runs"
    args = fit(tiny_shards, runs, "--trainer.max_steps=2", "--trainer.accumulate_grad_batches=100")
    run_dir = runs / "quickstart" / "standard-tiny-L1-H2-d16-ff32-s1337"
    status, output = _signal_at_micro_batch(args, run_dir, signal.SIGINT, at_batch=30)
    assert status == 130, output[-3000:]
    assert "no optimizer step has been taken, so nothing is saved" in output
    assert "before its first optimizer step; nothing was trained or saved" in output, output[-3000:]
    assert not run_dir.exists() and not list((runs / "quickstart").iterdir()), "no empty run left for TensorBoard"
    pasted = output.split("Start it again with:\n", 1)[1].splitlines()[0].strip()
    assert shlex.split(pasted) == ["lightning_cqk", *args[2:], *probe_flags(30, "SIGINT")], "the command as typed"
    again = run(args, tmp_path)  # pasted, without the test's probe
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((run_dir / "run.json").read_text())["attempts"][-1]["status"] == "finished"


@pytest.mark.slow
def test_a_stop_between_accumulated_micro_batches_waits_for_the_step_and_resumes_exactly(tiny_shards, tmp_path):
    """A save between two micro-batches of a step lost their gradients: the resumed step accumulated fewer. Now the
    stop waits for the step's last micro-batch, and interrupted + resumed equals uninterrupted, bit for bit."""
    runs = tmp_path / "runs"
    args = fit(tiny_shards, runs, "--trainer.max_steps=3", "--trainer.accumulate_grad_batches=50")
    run_dir = runs / "quickstart" / "standard-tiny-L1-H2-d16-ff32-s1337"
    status, output = _signal_at_micro_batch(args, run_dir, signal.SIGTERM, at_batch=75)  # mid-way through step 2
    assert status == 143, output[-3000:]
    saved = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)
    micro_batches = saved["loops"]["fit_loop"]["epoch_loop.batch_progress"]["total"]["processed"]
    assert (saved["global_step"], micro_batches) == (2, 100), "saved at the end of the step in progress"

    resumed = run([*args, "--ckpt_path=last"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    straight_args = fit(
        tiny_shards, tmp_path / "straight", "--trainer.max_steps=3", "--trainer.accumulate_grad_batches=50"
    )
    straight = run(straight_args, tmp_path)
    assert straight.returncode == 0, straight.stderr[-3000:]
    finals = [r / "quickstart" / run_dir.name / "checkpoints" / "last.ckpt" for r in (runs, tmp_path / "straight")]
    weights = [torch.load(final, weights_only=False)["state_dict"] for final in finals]
    assert weights[0].keys() == weights[1].keys()
    for name in weights[0]:
        torch.testing.assert_close(weights[0][name], weights[1][name], rtol=0, atol=0, msg=name)


def _ckpt(path: Path, step: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"global_step": step}, path)


def test_missing_or_dangling_last_ckpt_resumes_from_the_newest_intact_step_file_or_is_refused(tmp_path):
    run_dir = tmp_path / "exp" / "standard-tiny-s1"
    ckpts = run_dir / "checkpoints"
    for step in (2, 4, 6):
        _ckpt(ckpts / f"step={step:08d}.ckpt", step)
    _ckpt(ckpts / "nonfinite-step7.ckpt", 7)  # the NaN guard's file is never picked automatically
    (ckpts / "last.ckpt").symlink_to(ckpts / "gone.ckpt")  # dangling
    (run_dir / "run.json").write_text(json.dumps({"attempts": [{"status": "running", "pid": 1, "step": 7}]}))
    found, note = resumable_checkpoint(run_dir)
    assert found == ckpts / "step=00000006.ckpt" and "dangling link" in note
    (ckpts / "step=00000006.ckpt").write_bytes(b"PK\x03\x04 cut short")
    found, note = resumable_checkpoint(run_dir)
    assert found == ckpts / "step=00000004.ckpt"
    plan = resolve_fit(tmp_path / "exp", "standard-tiny-s1", None, "last", argv=["fit"])
    assert plan.run_dir == run_dir and plan.ckpt_path == str(ckpts / "step=00000004.ckpt") and plan.resuming
    # No --ckpt_path: the unfinished run is resumed from the same file (the same command again).
    plan = resolve_fit(tmp_path / "exp", "standard-tiny-s1", None, None, argv=["fit"])
    assert plan.auto_resumed and plan.ckpt_path == str(ckpts / "step=00000004.ckpt")
    with pytest.raises(ResumeRefused, match="--on_unfinished new"):
        resolve_fit(tmp_path / "exp", "standard-tiny-s1", None, None, on_unfinished="refuse", argv=["fit"])
    # Nothing intact: refused by name (an explicit run directory), never a silent restart from step 0.
    for p in ckpts.glob("step=*.ckpt"):
        p.write_bytes(b"")
    found, note = resumable_checkpoint(run_dir)
    assert found is None and "no step=*.ckpt beside it reads back intact" in note
    with pytest.raises(ResumeRefused, match="no checkpoint to resume from"):
        resolve_fit(tmp_path / "exp", "x", "standard-tiny-s1", "last", argv=["fit"])
    # --ckpt_path last without an explicit directory passes over it, by name, and starts a new one.
    plan = resolve_fit(tmp_path / "exp", "standard-tiny-s1", None, "last", argv=["fit"])
    assert plan.ckpt_path is None and plan.run_dir.name == "standard-tiny-s1-2"
    assert any("passed over" in n for n in plan.notes)
