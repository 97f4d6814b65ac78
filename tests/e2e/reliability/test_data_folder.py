"""A data folder has an owner (issue 25 class 2, issue 24 item 6), tested with real `prepare` and `fit` subprocesses.

- Concurrent `prepare`s into one folder (the multi-node case: every node's local rank 0 prepares one shared data_dir)
  leave one intact build: one builds, the others wait for it and reuse it; no build is deleted under another.
- `prepare --overwrite` into the data_dir of a live `fit` is refused, naming the run (pid, host, run directory).
- Shards changed under a live run anyway (copied over by hand, bypassing the lock) stop it at its next validation,
  recorded in run.json and summary.json; a resume on rebuilt shards is refused.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_run import callbacks_config, child_env, tiny_command

from lightning_cqk.data import Manifest, prepare
from lightning_cqk.data.folder_lock import DataFolderInUse, hold_for_reading, writing
from lightning_cqk.data.integrity import BUILD_FILE, check_build, check_split

ENV = child_env(MKL_NUM_THREADS="1")


def corpus(path: Path, word: str, n: int = 200) -> Path:
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"text": f"{word} {i}. " + f"{word} jumps over the lazy dog. " * (3 + i % 5)}) + "\n")
    return path


def cli(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "lightning_cqk", *args], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, **kw,
    )  # fmt: skip


def assert_one_intact_build(out: Path) -> Manifest:
    manifest = Manifest.load(out)
    check_build(out, manifest.extra["build_id"])  # the manifest describes the shards beside it
    for split in ("train", "val"):
        index = check_split(out, split)
        assert sum(c["dim"] for c in index["chunks"]) == manifest.splits[split].tokens
    assert not list(out.glob(".prepare-*")), "no build left behind"
    return manifest


@pytest.mark.slow
def test_concurrent_prepares_leave_one_intact_build(tmp_path: Path):
    src, out = corpus(tmp_path / "a.jsonl", "fox"), tmp_path / "shards"
    args = ("prepare", "--source", str(src), "--output_dir", str(out), "--val_fraction", "0.2")
    with writing(out):  # hold the folder as a prepare would, so that all three start while it is taken
        procs = [cli(*args) for _ in range(3)]
        time.sleep(8)  # each one starts, finds no manifest, and waits for the lock
        assert all(p.poll() is None for p in procs), [p.communicate()[0][-2000:] for p in procs if p.poll()]
    outputs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outputs
    built = [o for o in outputs if "prepare: wrote" in o]
    reused = [o for o in outputs if "just built by the prepare this one waited for" in o]
    assert len(built) == 1 and len(reused) == 2, outputs
    assert "is being prepared by pid" in "".join(outputs), "the waiters say whom they wait for"
    assert_one_intact_build(out)

    # With --overwrite and another source each: the second waits, then rebuilds; one intact build, the last one.
    other = corpus(tmp_path / "b.jsonl", "cat")
    with writing(out):
        first = cli("prepare", "--source", str(src), "--output_dir", str(out), "--overwrite", "true")
        time.sleep(4)
        second = cli("prepare", "--source", str(other), "--output_dir", str(out), "--overwrite", "true")
        time.sleep(4)
    logs = [p.communicate(timeout=240)[0] for p in (first, second)]
    assert first.returncode == 0 and second.returncode == 0, logs
    manifest = assert_one_intact_build(out)
    assert manifest.sources in ([str(src.resolve())], [str(other.resolve())]), manifest.sources
    assert not (out / ".data.lock").exists() and not (out / ".readers").exists(), "no lock file left behind"


def test_a_folder_read_by_a_run_is_not_rebuilt_and_a_reader_waits_for_a_writer(tmp_path: Path):
    src, out = corpus(tmp_path / "a.jsonl", "fox", 40), tmp_path / "shards"
    prepare(str(src), str(out), val_fraction=0.25)
    reader = subprocess.Popen(  # a "run": holds the folder for reading, as TokenDataModule.setup does
        [sys.executable, "-c", f"from lightning_cqk.data.folder_lock import hold_for_reading as h; h({str(out)!r}, "
         "run_dir='runs/x/standard-tiny-s1'); print('held', flush=True); import time; time.sleep(120)"],
        env=ENV, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert reader.stdout.readline().strip() == "held"
        with pytest.raises(DataFolderInUse, match=rf"read by 1 live run\(s\): pid {reader.pid} on host .*runs/x/st"):
            prepare(str(corpus(tmp_path / "b.jsonl", "cat", 40)), str(out), overwrite=True)
        assert prepare(str(src), str(out), val_fraction=0.25).sources == [str(src.resolve())], "reuse is allowed"
    finally:
        reader.kill()
        reader.wait()
    # The reader died without releasing (SIGKILL): the kernel dropped its lock; its record is recognised as stale.
    prepare(str(corpus(tmp_path / "b.jsonl", "cat", 40)), str(out), overwrite=True)
    assert_one_intact_build(out)

    # A reader (a run starting) waits while a prepare builds, then reads the finished build.
    with writing(out):
        waiter = subprocess.Popen(
            [sys.executable, "-c", f"from lightning_cqk.data.folder_lock import hold_for_reading as h; h({str(out)!r})"
             "; print('got it', flush=True)"],
            env=ENV, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        time.sleep(3)
        assert waiter.poll() is None, "the reader waits for the writer"
    assert waiter.communicate(timeout=60)[0].strip().endswith("got it")
    hold = hold_for_reading(out)  # this process reads it: it cannot rebuild it itself
    try:
        with pytest.raises(DataFolderInUse, match="read by this process"):
            prepare(str(src), str(out), overwrite=True)
    finally:
        hold.release()


def test_a_manifest_beside_another_builds_shards_is_refused(tmp_path: Path):
    out = tmp_path / "shards"
    prepare(str(corpus(tmp_path / "a.jsonl", "fox", 40)), str(out), val_fraction=0.25)
    (out / "val" / BUILD_FILE).write_text("0123456789abcdef\n")  # as a race on a lock-less file system leaves it
    with pytest.raises(ValueError, match="not the build its manifest.json describes"):
        check_build(out, Manifest.load(out).extra["build_id"])


def fit_command(shards: Path, runs: Path, *extra: str) -> list[str]:
    checkpoint = {"class_path": "lightning_cqk.callbacks.RunCheckpoint", "init_args": {"every_n_steps": 4}}
    callbacks = callbacks_config(runs.parent / "callbacks.yaml", [checkpoint])
    delta = ["--trainer.val_check_interval=4", "--trainer.limit_val_batches=1", "--trainer.log_every_n_steps=1"]
    return tiny_command(shards, runs, *delta, *extra, configs=[callbacks])


def wait_for(predicate, seconds: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"gave up waiting (rc {proc.poll()}): {proc.communicate()[0][-3000:]}")
        time.sleep(0.2)


@pytest.mark.slow
def test_a_live_run_keeps_its_data_folder_and_stops_when_its_shards_change_anyway(tmp_path: Path):
    shards, runs = tmp_path / "shards", tmp_path / "runs"
    prepare(str(corpus(tmp_path / "a.jsonl", "fox")), str(shards), val_fraction=0.2)
    run = cli(*fit_command(shards, runs, "--trainer.max_steps=100000")[3:])
    summary = lambda: next(iter((runs / "quickstart").glob("*/summary.json")), None)  # noqa: E731
    wait_for(lambda: summary() is not None, 120, run)  # trained and validated: the run reads the folder
    run_dir = summary().parent

    # 1. prepare --overwrite into its data_dir is refused, naming the run; the shards are untouched.
    before = Manifest.load(shards).extra["build_id"]
    other = corpus(tmp_path / "b.jsonl", "cat")
    refused = subprocess.run(
        [sys.executable, "-m", "lightning_cqk", "prepare", "--source", str(other), "--output_dir", str(shards),
         "--overwrite", "true"], env=ENV, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert refused.returncode != 0, refused.stdout[-2000:]
    message = refused.stderr + refused.stdout
    assert f"is being read by 1 live run(s): pid {run.pid} on host" in message, message[-3000:]
    assert f"run directory {run_dir}" in message and "Traceback" not in message
    assert Manifest.load(shards).extra["build_id"] == before and run.poll() is None

    # 2. Shards copied over by hand (bypassing the lock, as on a file system without cross-host locks): the run
    #    stops before its next validation and records why.
    prepare(str(other), str(tmp_path / "elsewhere"), val_fraction=0.2)
    for name in ("val", "train"):
        os.rename(shards / name, tmp_path / f"old-{name}")
        os.rename(tmp_path / "elsewhere" / name, shards / name)
    os.replace(tmp_path / "elsewhere" / "manifest.json", shards / "manifest.json")
    output = run.communicate(timeout=120)[0]
    assert run.returncode == 1, output[-3000:]
    assert "changed under this run" in output and "Traceback" not in output, output[-3000:]
    attempt = json.loads((run_dir / "run.json").read_text())["attempts"][-1]
    assert attempt["status"] == "failed" and "changed under this run" in attempt["error"], attempt
    stopped = json.loads((run_dir / "summary.json").read_text())
    assert stopped["finished"] is False and str(shards) in stopped["data_changed"]["folder"], stopped

    # 3. Resuming on the rebuilt shards is refused (the checkpoint was trained on others), recorded as an attempt.
    resumed = subprocess.run(
        fit_command(shards, runs, "--trainer.max_steps=100000", "--ckpt_path=last"), env=ENV, capture_output=True,
        text=True, timeout=180,
    )  # fmt: skip
    assert resumed.returncode == 1 and "on resume at step" in resumed.stderr, resumed.stderr[-3000:]
    attempts = json.loads((run_dir / "run.json").read_text())["attempts"]
    assert len(attempts) == 2 and attempts[-1]["status"] == "failed" and "on resume" in attempts[-1]["error"]
    assert not list(shards.glob(".readers/*.json")), "both runs released their hold"


def holds_open(pid: int, path: Path) -> bool:
    """Whether process `pid` has `path` open (Linux /proc)."""
    try:
        return any(os.readlink(fd) == str(path) for fd in Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to see the run waiting on the lock")
@pytest.mark.parametrize("waits_as", ["reader", "writer"])
def test_a_run_stopped_by_sigterm_while_waiting_for_a_data_lock_leaves_no_run_directory(tmp_path: Path, waits_as):
    """Issue 34 defect 13: a `fit` SIGTERMed while it waits for a data folder (a prepare holds it) used to die at once,
    leaving its run directory (TensorBoard events file and lock), so the next run of the name became `-2`. Now the
    wait unwinds: status 143, the directory it created is removed, the name is free. `reader`: the run waits to read
    finished shards; `writer`: the run prepares them itself (data.source) and waits for the prepare that holds them."""
    from lightning_cqk.run.directory import next_free_name

    shards, runs = tmp_path / "shards", tmp_path / "runs"
    source = corpus(tmp_path / "a.jsonl", "fox")
    if waits_as == "reader":
        prepare(str(source), str(shards), val_fraction=0.2)
    command = fit_command(shards, runs, "--trainer.max_steps=2")
    if waits_as == "writer":  # no shards yet: the run prepares them from its source
        command = [a for a in command if a != "--data.source=null"] + [f"--data.source={source}"]
    with writing(shards):  # a prepare builds the folder for as long as this holds
        run = cli(*command[3:])
        wait_for(lambda: holds_open(run.pid, shards / ".data.lock"), 120, run)  # it waits on the folder's lock
        time.sleep(1.0)
        run.send_signal(signal.SIGTERM)
        output = run.communicate(timeout=60)[0]
    left = [p for p in runs.rglob("*") if p.is_file()]
    assert not left, f"the run that never started left {left}"
    assert run.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert f"data: stopped by SIGTERM while waiting for {shards}" in output, output[-3000:]
    assert "run directory: removed" in output and "Traceback" not in output, output[-3000:]
    name = "standard-tiny-L1-H2-d16-ff32-s1337"
    assert next_free_name(runs / "quickstart", name) == name, "the next run takes the name, not -2"
