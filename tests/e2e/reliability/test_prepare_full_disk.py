"""`prepare` that cannot finish stops cleanly (issue 34 defect 3), tested with real `prepare` subprocesses.

On a full disk (a 4 MiB tmpfs) or past a file-size limit (RLIMIT_FSIZE: EFBIG), `prepare --overwrite` of a corpus
whose shards do not fit used to sleep for ever at 0% CPU: litdata's worker, whose last chunk write failed, waited at
exit for a helper process it stops only on success, and the parent joined that worker, holding the data folder's
lock (every `fit` on the folder waited on it). Now it ends in seconds with one paragraph ("No space left on device
... the previous build ... is unchanged" and how to make room), exit status 1, the previous build byte for byte, no
`.prepare-*` folder, no process left and the lock released. A `prepare` stopped by SIGTERM mid-build (its worker
blocked reading a FIFO) used to die at once, leaving its workers running and its partial build on disk; now it stops
its workers, removes the partial build and releases the lock before it exits with status 143.

Each `prepare` runs in its own session, so every process it started (an orphan too) is found by its process group.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lightning_cqk.data import prepare
from lightning_cqk.data.folder_lock import writing

REPO = Path(__file__).resolve().parents[3]
ENV = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
ENV.pop("PYTEST_CURRENT_TEST", None)
ENV.pop("LIGHTNING_CQK_DEBUG", None)


def corpus(path: Path, documents: int, words: int) -> Path:
    with path.open("w") as f:
        for i in range(documents):
            f.write(json.dumps({"text": f"Document {i}. " + "keys meet queries " * words}) + "\n")
    return path


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def start_prepare(source: Path, out: Path, log: Path, preexec_fn=None) -> subprocess.Popen:
    args = ["prepare", "--source", str(source), "--output_dir", str(out), "--overwrite", "true"]
    with log.open("w") as f:
        return subprocess.Popen(
            [sys.executable, "-m", "lightning_cqk", *args], env=ENV, stdout=f, stderr=subprocess.STDOUT, text=True,
            start_new_session=True, preexec_fn=preexec_fn,
        )  # fmt: skip


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def finish(proc: subprocess.Popen, timeout: float) -> int:
    """The exit status of `proc` within `timeout` s; on a hang, kill its whole group and fail."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"prepare still ran after {timeout} s (hung); its processes were killed")


def assert_nothing_left(proc: subprocess.Popen, out: Path, before: dict[str, bytes]) -> None:
    deadline = time.monotonic() + 5
    while group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = group_alive(proc.pid)
    if left:
        os.killpg(proc.pid, signal.SIGKILL)
    assert not left, "prepare left worker processes running"
    assert not list(out.glob(".prepare-*")), "the partial build is removed"
    assert snapshot(out) == before, "the previous build is unchanged, byte for byte"
    taken = subprocess.run(  # the lock is free: another process takes it at once
        [sys.executable, "-c", f"from lightning_cqk.data.folder_lock import writing\nwith writing({str(out)!r}): pass"],
        env=ENV, timeout=30, capture_output=True, text=True,
    )  # fmt: skip
    assert taken.returncode == 0, taken.stderr


@pytest.fixture
def small_tmpfs(tmp_path: Path):
    disk = tmp_path / "disk"
    disk.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as err:
        pytest.skip(f"cannot mount a tmpfs here ({err}); test_prepare_past_a_file_size_limit covers the same path")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_prepare_on_a_full_disk_says_so_and_keeps_the_previous_build(tmp_path: Path, small_tmpfs: Path):
    out = small_tmpfs / "shards"
    prepare(str(corpus(tmp_path / "small.jsonl", 40, 5)), str(out), val_fraction=0.2)
    before = snapshot(out)
    big = corpus(tmp_path / "big.jsonl", 600, 300)  # 3.2 MB of text: 6.4 MB of uint16 shards on a 4 MiB disk
    proc = start_prepare(big, out, tmp_path / "prepare.log")
    code = finish(proc, timeout=60)
    said = (tmp_path / "prepare.log").read_text()
    assert code == 1, said
    assert "prepare: No space left on device (errno 28, ENOSPC) while writing the new token shards" in said
    assert f"the previous build in {out} is unchanged" in said and f"df -h {out}" in said
    assert "Traceback" not in said and "We found the following error" not in said
    assert_nothing_left(proc, out, before)


def test_prepare_past_a_file_size_limit_says_so_and_keeps_the_previous_build(tmp_path: Path):
    def limit() -> None:  # SIGXFSZ would kill the child: ignored, a write past the limit fails with EFBIG
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    out = tmp_path / "shards"
    prepare(str(corpus(tmp_path / "small.jsonl", 40, 5)), str(out), val_fraction=0.2)
    before = snapshot(out)
    proc = start_prepare(corpus(tmp_path / "big.jsonl", 200, 300), out, tmp_path / "prepare.log", preexec_fn=limit)
    code = finish(proc, timeout=60)
    said = (tmp_path / "prepare.log").read_text()
    assert code == 1, said
    assert "lightning_cqk prepare: File too large (errno 27, EFBIG) while writing the new token shards" in said
    assert f"the previous build in {out} is unchanged" in said and "--chunk_bytes" in said
    assert "Traceback" not in said
    assert_nothing_left(proc, out, before)


def test_a_prepare_stopped_by_sigterm_stops_its_workers_and_removes_its_partial_build(tmp_path: Path):
    out = tmp_path / "shards"
    prepare(str(corpus(tmp_path / "small.jsonl", 40, 5)), str(out), val_fraction=0.2)
    before = snapshot(out)
    fifo = tmp_path / "stream.jsonl"
    os.mkfifo(fifo)  # no writer: the worker that reads it blocks, so the build is in progress until stopped
    proc = start_prepare(fifo, out, tmp_path / "prepare.log")
    deadline = time.monotonic() + 60
    while "work units" not in (tmp_path / "prepare.log").read_text() and time.monotonic() < deadline:
        assert proc.poll() is None, (tmp_path / "prepare.log").read_text()
        time.sleep(0.1)
    time.sleep(1.0)  # litdata starts its worker, which blocks opening the FIFO
    assert list(out.glob(".prepare-*")), "the build is in progress"
    proc.send_signal(signal.SIGTERM)  # to prepare alone, as `kill` or `timeout` sends it
    code = finish(proc, timeout=30)
    said = (tmp_path / "prepare.log").read_text()
    assert code == 128 + signal.SIGTERM, said
    assert f"prepare: stopped by SIGTERM; the partial build is removed and the previous build in {out}" in said
    assert_nothing_left(proc, out, before)
    with writing(out):  # and this process takes the lock too
        pass
