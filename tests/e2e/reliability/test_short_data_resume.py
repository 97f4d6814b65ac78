"""Tokens are counted from the micro-batches trained into optimizer steps (issue 45 item 9).

With `accumulate_grad_batches` 3 and shards shorter than the run, a stop at the end of an epoch and a resume gave
bit-identical weights but 2 micro-batches more in "tokens seen" (and `budget.json`): the resume replays the epoch's
last micro-batches as a short epoch of their own that no optimizer step takes (their gradients are zeroed at the next
window), and they were counted. Now a micro-batch counts once its step is taken and is dropped with its gradients."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_run import child_env, quickstart_callbacks, tiny_fit, write_tiny_corpus

RUN = "standard-tiny-L1-H2-d16-ff32-s1337"


def _fit(root: Path, runs: Path, *extra: str) -> list[str]:
    corpus = root / "corpus.jsonl"
    if not corpus.exists():
        write_tiny_corpus(corpus, documents=12)  # 46 micro-batches of 2 windows an epoch: 15 steps of 3, one of 1
    callbacks = quickstart_callbacks(root / f"{runs.name}-callbacks.yaml", every_n_steps=5, keep_last=2)
    flags = tiny_fit(
        root / "shards", runs, f"--data.source={corpus}", "--data.val_fraction=0.2",
        "--trainer.accumulate_grad_batches=3", "--trainer.val_check_interval=30", "--trainer.max_steps=40",
        "--trainer.limit_val_batches=1", "--trainer.deterministic=true", *extra, configs=[callbacks],
    )  # fmt: skip
    return [sys.executable, "-m", "lightning_cqk", *flags]


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = child_env(Path(__file__).parent)
    proc = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


@pytest.mark.slow
def test_a_stop_at_an_epochs_end_and_a_resume_count_the_tokens_of_the_uninterrupted_run(tmp_path: Path):
    straight = _run(_fit(tmp_path, tmp_path / "straight"), tmp_path)
    assert straight.returncode == 0, straight.stderr[-3000:]
    probe = ["--trainer.callbacks+=signal_probe.SignalAtBatch", "--trainer.callbacks.at_batch=48",
             "--trainer.callbacks.signal_name=SIGTERM"]  # fmt: skip  # step 17: epoch 2's third micro-batch
    stopped = _run(_fit(tmp_path, tmp_path / "stopped", *probe), tmp_path)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    resumed = _run(_fit(tmp_path, tmp_path / "stopped", "--ckpt_path=last"), tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    runs = [tmp_path / name / "quickstart" / RUN for name in ("straight", "stopped")]
    finals = [torch.load(run / "checkpoints" / "last.ckpt", weights_only=False) for run in runs]
    for name in finals[0]["state_dict"]:
        assert torch.equal(finals[0]["state_dict"][name], finals[1]["state_dict"][name]), name
    assert finals[0]["tokens_seen"] == finals[1]["tokens_seen"] == 116 * 2 * 16, "46 + 46 + 24 micro-batches"
    assert finals[0]["flops_seen"] == finals[1]["flops_seen"]
    budgets = [json.loads((run / "budget.json").read_text()) for run in runs]
    summaries = [json.loads((run / "summary.json").read_text()) for run in runs]
    assert budgets[0]["tokens"] == budgets[1]["tokens"] and summaries[0]["tokens_seen"] == summaries[1]["tokens_seen"]
