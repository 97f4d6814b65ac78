"""The run's last step is always validated (issue 45 item 9): with `accumulate_grad_batches` 3 and shards shorter than
the run, epochs end inside a window, Lightning's validations (counted in micro-batches) drift off the steps, and the
last one was at step 31 of 40, printed by the summary beside "steps 40" as the run's loss. `FinalValidation` asks for a
validation at the last step whenever the schedule leaves it out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tiny_run import tiny_fit, write_tiny_corpus

from lightning_cqk.cli.main import main
from lightning_cqk.study.run.run_scalars import read_scalars

RUN = "standard-tiny-L1-H2-d16-ff32-s1337"


@pytest.mark.parametrize(
    "accumulate,interval,steps",
    [(3, 30, 40), (1, 10, 15), (1, 30, 5)],  # epochs ending in a window; max_steps no multiple; no validation due
    ids=["accumulation-on-short-data", "steps-no-multiple-of-the-interval", "interval-beyond-the-run"],
)
def test_the_last_step_is_validated(tmp_path: Path, accumulate: int, interval: int, steps: int):
    corpus = write_tiny_corpus(tmp_path / "corpus.jsonl", documents=12)  # 46 micro-batches of 2 windows an epoch
    runs = tmp_path / "runs"
    main(
        tiny_fit(
            tmp_path / "shards", runs, f"--data.source={corpus}", "--data.val_fraction=0.2",
            f"--trainer.accumulate_grad_batches={accumulate}", f"--trainer.val_check_interval={interval}",
            f"--trainer.max_steps={steps}", "--trainer.limit_val_batches=1", "--trainer.log_every_n_steps=1",
        )
    )  # fmt: skip
    run_dir = runs / "quickstart" / RUN
    validated = [step + 1 for step, _ in read_scalars(run_dir)["val/loss"]]
    assert validated[-1] == steps, f"validated after steps {validated}"
    assert len(validated) == len(set(validated)), "the last step validated once"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == steps and summary["last_validation"]["step"] == steps
    assert summary["last_validation"]["val/loss"] == pytest.approx(read_scalars(run_dir)["val/loss"][-1][1])
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == steps
