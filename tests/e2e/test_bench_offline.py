"""`make bench` without ../shared and offline (issue 26): the default presets run without their gpt2 rows and say so
in one line; a preset that names gpt2 stops with that line. The bench is run from a copy of benchmarks/ in a folder
with no ../shared beside it; tiktoken's download is refused through a closed local proxy port."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _offline_env(tmp_path: Path) -> dict[str, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", TIKTOKEN_CACHE_DIR=str(tmp_path / "tiktoken"))
    env.update(HTTPS_PROXY=f"http://127.0.0.1:{port}", https_proxy=f"http://127.0.0.1:{port}")
    env.pop("LIGHTNING_CQK_GPT2_BPE", None)
    return env


@pytest.mark.slow
def test_bench_without_the_gpt2_vocabulary_runs_the_bytes_rows_and_says_what_it_needs(tmp_path: Path):
    """The rows that tokenize text (loader, prepare) need the vocabulary file; without it the default presets run
    their bytes rows and say so in one line, and a preset that names gpt2 stops with that line."""
    bench = tmp_path / "repo" / "benchmarks"
    shutil.copytree(REPO / "benchmarks", bench, ignore=shutil.ignore_patterns("__pycache__"))
    script = [sys.executable, str(bench / "bench.py"), "--device", "cpu", "--threads", "1"]
    quick = ["--only", "loader", "--steps", "1", "--warmup", "0", "--rounds", "1"]
    run = subprocess.run([*script, *quick], env=_offline_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    (said,) = [line for line in run.stderr.splitlines() if line.startswith("bench: gpt2 rows skipped")]
    assert "--bpe_file" in said and "gpt2_bpe" in said
    assert "tiny/bytes 16x256" in run.stdout and "gpt2" not in run.stdout.split("\n", 1)[1]

    explicit = subprocess.run(
        [*script, *quick, "--presets", "tiny:gpt2:2x16"], env=_offline_env(tmp_path), capture_output=True, text=True
    )
    assert explicit.returncode == 1 and "Traceback" not in explicit.stderr
    assert explicit.stderr.strip().startswith("bench: they need the GPT-2 vocabulary")
    assert len(explicit.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_rows_that_draw_random_ids_need_no_vocabulary_file(tmp_path: Path):
    """Issue 32 item 7: `--only backends` (and framework, inference) draw random ids below the vocabulary size, so
    their gpt2 rows run offline without the vocabulary file (they were skipped, or the command stopped)."""
    bench = tmp_path / "repo" / "benchmarks"
    shutil.copytree(REPO / "benchmarks", bench, ignore=shutil.ignore_patterns("__pycache__"))
    script = [sys.executable, str(bench / "bench.py"), "--device", "cpu", "--threads", "1"]
    script += ["--presets", "tiny:gpt2:2x16"]
    quick = ["--only", "backends", "--backends", "k_eq_v", "--steps", "1", "--warmup", "0"]
    run = subprocess.run([*script, *quick], env=_offline_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert "skipped" not in run.stderr and "tiny/gpt2 2x16" in run.stdout and "k_eq_v: step time" in run.stdout


def test_bench_only_prepare_without_the_gpt2_vocabulary_says_so_and_fails(tmp_path: Path):
    """Issue 35: it printed an empty table and exited 0."""
    bench = tmp_path / "repo" / "benchmarks"
    shutil.copytree(REPO / "benchmarks", bench, ignore=shutil.ignore_patterns("__pycache__"))
    script = [sys.executable, str(bench / "bench.py"), "--device", "cpu", "--threads", "1", "--only", "prepare"]
    run = subprocess.run(script, env=_offline_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert run.stderr.startswith("bench: nothing to measure: --only prepare times the GPT-2 tokenizer"), run.stderr
    assert "--bpe_file" in run.stderr and not run.stdout.strip()
