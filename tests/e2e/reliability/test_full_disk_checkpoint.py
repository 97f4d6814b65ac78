"""A checkpoint save that runs out of disk says so (issue 25, class 8): a real `fit` whose run directory is on a full
disk (a small tmpfs) or past a file-size limit (RLIMIT_FSIZE in the child: EFBIG) ends with "No space left on device"
/ "File too large" in run.json and on stderr, never torch's "[enforce fail at inline_container.cc] ... unexpected
pos", and leaves no partial checkpoint file."""

from __future__ import annotations

import errno
import json
import os
import resource
import signal
import subprocess
from pathlib import Path

import pytest
from tiny_run import child_env, tiny_command


def _fit(shards: Path, runs: Path, cwd: Path, preexec_fn=None) -> subprocess.CompletedProcess:
    args = tiny_command(
        shards, runs, "--trainer.max_steps=2", "--trainer.val_check_interval=1000", "--trainer.limit_val_batches=1"
    )
    env = child_env(LIGHTNING_CQK_LOG_DIR=str(cwd), LIGHTNING_CQK_DEBUG=None)
    return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=300, preexec_fn=preexec_fn)


def _check(done: subprocess.CompletedProcess, runs: Path, code: int) -> None:
    assert done.returncode == 1, done.stderr[-3000:]
    said = os.strerror(code)
    (record,) = runs.glob("*/*/run.json")
    attempt = json.loads(record.read_text())["attempts"][-1]
    assert attempt["status"] == "failed"
    assert attempt["error"].startswith(
        f"StorageFullError: {said} (errno {code}, {errno.errorcode[code]}) while writing"
    )
    assert "enforce fail" not in attempt["error"] and "unexpected pos" not in attempt["error"]
    assert "--ckpt_path last" in attempt["error"]
    assert f"lightning_cqk fit: {said}" in done.stderr and "Traceback" not in done.stderr
    assert not [p for p in runs.rglob("*") if p.name.endswith(".tmp")], "no partial checkpoint is left"


@pytest.mark.slow
def test_a_full_disk_during_a_checkpoint_save_is_recorded_as_such(tiny_shards: Path, tmp_path: Path):
    disk = tmp_path / "disk"
    disk.mkdir()
    try:  # 96 KiB: room for config.yaml, run.json and the events, not for the checkpoint
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(disk)], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as err:
        pytest.skip(f"cannot mount a tmpfs here ({err}); the file-size-limit test covers the same path")
    try:
        _check(_fit(tiny_shards, disk / "runs", tmp_path), disk / "runs", errno.ENOSPC)
    finally:
        subprocess.run(["umount", str(disk)], check=False)


@pytest.mark.slow
def test_a_file_size_limit_during_a_checkpoint_save_is_recorded_as_such(tiny_shards: Path, tmp_path: Path):
    def limit() -> None:  # SIGXFSZ would kill the child: ignored, a write past the limit fails with EFBIG
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (48 * 1024, 48 * 1024))

    _check(_fit(tiny_shards, tmp_path / "runs", tmp_path, preexec_fn=limit), tmp_path / "runs", errno.EFBIG)
