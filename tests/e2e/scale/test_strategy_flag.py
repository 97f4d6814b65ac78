"""`--trainer.strategy ModelParallelStrategy`, as docs/scaling-out.md writes it (issue 32 item 2): it stayed a string
that the Trainer rejected, and Lightning's default sizes asked 8 GPUs for tensor-parallel 8, which LitLM refuses.
Now the bare class name is the class, and FSDP2 shards over every process by default."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_run import child_env, plant_index, tiny_command

from lightning_cqk.cli.strategy import FSDP2Strategy
from lightning_cqk.run.strategy_flag import FSDP2_CLASS_PATH, resolve_strategy


def test_a_bare_strategy_class_name_is_its_class_and_model_parallel_is_fsdp2():
    assert resolve_strategy("ModelParallelStrategy")["class_path"] == "lightning_cqk.cli.strategy.FSDP2Strategy"
    assert FSDP2_CLASS_PATH == f"{FSDP2Strategy.__module__}.{FSDP2Strategy.__name__}"  # the path names the class
    assert resolve_strategy("DDPStrategy") == {
        "class_path": "lightning.pytorch.strategies.DDPStrategy",
        "init_args": {},
    }
    for kept in ("ddp", "auto", "fsdp", "lightning.pytorch.strategies.ModelParallelStrategy", "NoSuchStrategy", None):
        assert resolve_strategy(kept) == kept


@pytest.mark.parametrize(("nodes", "devices", "given", "sizes"), [
    (1, 8, {}, (8, 1)), (2, 8, {}, (16, 1)), (1, 8, {"tensor_parallel_size": 2}, (4, 2)),
    (1, 8, {"data_parallel_size": 8, "tensor_parallel_size": 1}, (8, 1)),
])  # fmt: skip
def test_fsdp2_shards_over_every_process_unless_told_otherwise(nodes, devices, given, sizes):
    strategy = FSDP2Strategy(**given)
    strategy.num_nodes = nodes
    strategy.parallel_devices = [torch.device("cpu")] * devices
    assert strategy.resolve_sizes() == sizes


SHARDED_CALLBACKS = """
trainer:
  val_check_interval: 2
  check_val_every_n_epoch: null
  limit_val_batches: 1
  callbacks:
    - class_path: lightning_cqk.callbacks.RunCheckpoint
      init_args: {every_n_steps: 1, keep_last: 2}
    - class_path: lightning_cqk.callbacks.BestCheckpoint
"""
#: The length of the sharded run, interrupted or not (and of its learning-rate schedule).
SHARDED_STEPS = 5


def _sharded_fit(shards: Path, root: Path, *extra: str) -> subprocess.CompletedProcess:
    (root / "callbacks.yaml").write_text(SHARDED_CALLBACKS)
    sharded = ["--trainer.strategy", "ModelParallelStrategy", "--trainer.devices=1"]
    # One schedule for every part: without it the cosine runs over each command's trainer.max_steps, so the 3-step
    # part would train at other rates than the first 3 steps of the 5-step run (a resume that changes max_steps
    # follows the new schedule, tests/e2e/reliability/test_resume_schedule.py), and no resume could equal the 5 steps.
    sharded.append(f"--model.optim.decay_steps={SHARDED_STEPS}")
    args = tiny_command(shards, root / "runs", *sharded, *extra, configs=[root / "callbacks.yaml"])
    return subprocess.run(args, env=child_env(), cwd=root, capture_output=True, text=True, timeout=300)


def _consolidated_weights(folder: Path, out: Path) -> dict[str, torch.Tensor]:
    """The weights of a distributed-checkpoint folder, consolidated by the command the package's refusals print."""
    from lightning_cqk.checkpoint.reading import CONSOLIDATE, load_checkpoint

    command = CONSOLIDATE.format(path=folder).split() + ["--output", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", *command], env=child_env(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return load_checkpoint(out)["state_dict"]


@pytest.mark.slow
def test_the_documented_flag_trains_sharded_and_resumes_exactly(tiny_shards: Path, tmp_path: Path):
    """Issue 32 item 3: an FSDP2 run's checkpoints are folders; `--ckpt_path last` resumed none of them (a silent
    restart from step 0). Now it continues at the saved step, to the same weights as a run never stopped, with
    retention and last.ckpt as for files."""
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    whole.mkdir(), parts.mkdir()
    done = _sharded_fit(tiny_shards, whole, f"--trainer.max_steps={SHARDED_STEPS}")
    assert done.returncode == 0, done.stderr[-3000:]
    first = _sharded_fit(tiny_shards, parts, "--trainer.max_steps=3")
    assert first.returncode == 0, first.stderr[-3000:]
    (run,) = (parts / "runs" / "quickstart").iterdir()
    folder = run / "checkpoints"
    assert (folder / "last.ckpt").is_dir(), "a distributed-checkpoint folder: the model was sharded"
    assert sorted(p.name for p in folder.glob("step=*")) == ["step=00000002.ckpt", "step=00000003.ckpt"], "keep_last 2"
    assert os.path.samefile(folder / "last.ckpt" / "meta.pt", folder / "step=00000003.ckpt" / "meta.pt"), "linked"
    (folder / ".step=00000004.ckpt.99999.tmp").mkdir()  # a save killed before it was put in place
    again = _sharded_fit(tiny_shards, parts, f"--trainer.max_steps={SHARDED_STEPS}", "--ckpt_path", "last")
    assert again.returncode == 0, again.stderr[-3000:]
    assert sorted(p.name for p in (parts / "runs" / "quickstart").iterdir()) == [run.name], "no new run"
    attempts = json.loads((run / "run.json").read_text())["attempts"]
    assert [(a["ckpt_path"], a["from_step"]) for a in attempts] == [(None, 0), (str(folder / "last.ckpt"), 3)]
    assert attempts[-1]["status"] == "finished" and attempts[-1]["step"] == 5
    assert not list(folder.glob(".*.tmp")), "the killed save's leftover is removed"
    # the last step is validated (callbacks/final_validation.py) and scores best here
    assert sorted(p.name for p in folder.glob("*step=*")) == ["best-step=5.ckpt", "step=00000004.ckpt",
                                                              "step=00000005.ckpt"]  # fmt: skip
    (whole_run,) = (whole / "runs" / "quickstart").iterdir()
    resumed = _consolidated_weights(folder / "last.ckpt", tmp_path / "resumed.ckpt")
    uninterrupted = _consolidated_weights(whole_run / "checkpoints" / "last.ckpt", tmp_path / "whole.ckpt")
    assert resumed.keys() == uninterrupted.keys() and resumed
    for name, value in uninterrupted.items():
        torch.testing.assert_close(resumed[name], value, rtol=0, atol=0, msg=f"{name} differs after the resume")
    # Issue 45 item 1, the silent variant: the run's last.ckpt copied as "a colleague's checkpoint", its index replaced
    # by a pickle that runs a command and then returns the genuine index. torch's reader ran it and resumed; now the
    # resume refuses it by name before anything of it is loaded.
    colleague, marker = tmp_path / "colleague" / "last.ckpt", tmp_path / "ran"
    shutil.copytree(folder / "last.ckpt", colleague)
    plant_index(colleague, marker)
    planted = _sharded_fit(
        tiny_shards, parts, f"--trainer.max_steps={SHARDED_STEPS + 1}", "--ckpt_path", str(colleague)
    )
    assert planted.returncode != 0 and "asks for" in planted.stderr, planted.stderr[-3000:]
    assert "Traceback" not in planted.stderr, planted.stderr[-3000:]
    assert not marker.exists(), "the planted command ran"
