"""RunCheckpoint and AtomicCheckpointIO: step and time triggers, retention, last.ckpt as a hard link, RNG state, a
crash while writing that leaves the previous file intact, and truncated/corrupt checkpoints refused by name with the
newest intact one to use instead (in-process and through `lightning_cqk fit --ckpt_path last`)."""

from __future__ import annotations

import os
import random
import re
import shutil
import sys
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from tiny_run import tiny_fit

from lightning_cqk.callbacks import AtomicCheckpointIO, RunCheckpoint
from lightning_cqk.checkpoint.reading import CorruptCheckpointError, checkpoint_problem


def ckpt_trainer(make_trainer, callback: RunCheckpoint, max_steps: int, **kwargs) -> L.Trainer:
    return make_trainer(
        [callback], max_steps=max_steps, enable_checkpointing=True, plugins=[AtomicCheckpointIO()], **kwargs
    )


def steps_on_disk(folder: Path) -> list[int]:
    return sorted(int(p.stem.split("=")[1]) for p in folder.glob("step=*.ckpt"))


def test_step_trigger_retention_milestones_and_hard_linked_last(make_module, make_trainer, token_loader, tmp_path):
    callback = RunCheckpoint(every_n_steps=2, keep_last=2, keep_every_n_steps=4)
    trainer = ckpt_trainer(make_trainer, callback, max_steps=11)
    trainer.fit(make_module(), token_loader())
    folder = tmp_path / "run" / "checkpoints"
    assert steps_on_disk(folder) == [4, 8, 10], "newest two (8, 10) + milestones (4, 8)"
    assert [s for s, _ in callback.periodic] == [4, 8, 10]
    last = torch.load(folder / "last.ckpt", weights_only=True)  # loads without trusting pickled objects
    assert last["global_step"] == 11, "training ended off a trigger: last.ckpt still holds the final state"
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt", *(f"step={s:08d}.ckpt" for s in (4, 8, 10))]


def test_last_is_a_hard_link_of_the_periodic_file(make_module, make_trainer, token_loader, tmp_path):
    trainer = ckpt_trainer(make_trainer, RunCheckpoint(every_n_steps=3, keep_last=None), max_steps=6)
    trainer.fit(make_module(), token_loader())
    folder = tmp_path / "run" / "checkpoints"
    assert steps_on_disk(folder) == [3, 6]
    assert (folder / "last.ckpt").stat().st_ino == (folder / "step=00000006.ckpt").stat().st_ino


def test_time_trigger(make_module, make_trainer, token_loader, tmp_path, monkeypatch):
    import lightning_cqk.callbacks.run_checkpoint as module

    clock = {"now": 0.0}
    monkeypatch.setattr(module.time, "monotonic", lambda: clock["now"])

    class Tick(L.Callback):  # every training step takes 25 simulated seconds
        def on_train_batch_start(self, *args) -> None:
            clock["now"] += 25.0

    callback = RunCheckpoint(every_n_steps=None, every_minutes=1.0, keep_last=None)
    trainer = make_trainer([Tick(), callback], max_steps=9, enable_checkpointing=True)
    trainer.fit(make_module(), token_loader())
    assert steps_on_disk(tmp_path / "run" / "checkpoints") == [3, 6, 9], "a save at the first step past each minute"


def test_sigterm_saves_at_the_end_of_the_batch(make_module, make_trainer, token_loader, tmp_path):
    class Sigterm(L.Callback):  # what Lightning's SIGTERM handler does, at step 6
        def on_train_batch_start(self, trainer, *args) -> None:
            if trainer.global_step == 6:
                trainer._signal_connector.received_sigterm = True

    module = make_module()
    trainer = make_trainer([Sigterm(), RunCheckpoint(every_n_steps=4)], max_steps=20, enable_checkpointing=True)
    with pytest.raises(SystemExit):  # SIGTERMException
        trainer.fit(module, token_loader())
    folder = tmp_path / "run" / "checkpoints"
    assert steps_on_disk(folder) == [4, 7]
    last = torch.load(folder / "last.ckpt", weights_only=True)
    assert last["global_step"] == 7, "step 6 finished (global_step 7) before the process exits"
    assert all(torch.equal(last["state_dict"][n], p.detach()) for n, p in module.named_parameters())


def test_rng_state_is_saved_and_restored():
    callback = RunCheckpoint(every_n_steps=1)
    torch.manual_seed(1), np.random.seed(1), random.seed(1)
    state = callback.state_dict() | {"best_model_path": ""}
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(2), np.random.seed(2), random.seed(2)
    callback.load_state_dict(state)
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(expected[0], again[0]) and np.array_equal(expected[1], again[1]) and expected[2] == again[2]


def test_a_crash_while_writing_leaves_the_previous_checkpoint_intact(tmp_path, monkeypatch):
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"step": 1, "w": torch.ones(1000)}, path)

    def dies_halfway(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", dies_halfway)
    with pytest.raises(OSError, match="No space left"):
        io.save_checkpoint({"step": 2, "w": torch.zeros(1000)}, path)
    monkeypatch.undo()
    assert io.load_checkpoint(path)["step"] == 1, "the old file is untouched"
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"], "no temporary file left behind"


def test_leftover_temporary_files_are_removed_at_start(make_module, make_trainer, token_loader, tmp_path):
    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    (folder / ".last.ckpt.12345.tmp").write_bytes(b"partial")
    ckpt_trainer(make_trainer, RunCheckpoint(every_n_steps=2), max_steps=2).fit(make_module(), token_loader())
    assert not (folder / ".last.ckpt.12345.tmp").exists()


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty"])
def test_corrupt_checkpoint_names_the_file_and_the_newest_intact_one(
    damage, make_module, make_trainer, token_loader, tmp_path
):
    trainer = ckpt_trainer(make_trainer, RunCheckpoint(every_n_steps=2, keep_last=None), max_steps=5)
    trainer.fit(make_module(), token_loader())
    folder = tmp_path / "run" / "checkpoints"
    last = folder / "last.ckpt"
    last.unlink()  # a file of its own (not a link of step=4's), so damaging it leaves step=4 intact
    trainer.save_checkpoint(last)
    data = bytearray(last.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip":
        data[len(data) // 2 : len(data) // 2 + 64] = bytes(64)
    else:
        data = bytearray()
    last.write_bytes(bytes(data))
    assert checkpoint_problem(last) is not None
    good = folder / "step=00000004.ckpt"
    with pytest.raises(CorruptCheckpointError, match=rf"Checkpoint {last} cannot be loaded: .*--ckpt_path {good}"):
        ckpt_trainer(make_trainer, RunCheckpoint(every_n_steps=2), max_steps=8).fit(
            make_module(), token_loader(), ckpt_path=str(last)
        )


def test_corrupt_last_through_the_cli(tiny_shards, tmp_path, monkeypatch):
    """`lightning_cqk fit --ckpt_path last` on a run whose last.ckpt is damaged: the error names it and step=2."""
    from lightning_cqk.cli import main

    monkeypatch.setattr(sys, "argv", ["lightning_cqk"])
    args = tiny_fit(
        tiny_shards,
        tmp_path / "runs",
        "--trainer.max_steps=3",
        "--trainer.limit_val_batches=1",
        "--trainer.callbacks=lightning_cqk.callbacks.RunCheckpoint",
        "--trainer.callbacks.every_n_steps=2",
    )
    main(args)
    folder = next((tmp_path / "runs").glob("*/*/checkpoints"))
    assert steps_on_disk(folder) == [2]
    last = folder / "last.ckpt"
    data = last.read_bytes()
    last.unlink()
    last.write_bytes(data[:1000])
    with pytest.raises(CorruptCheckpointError, match=rf"{last} cannot be loaded.*--ckpt_path {folder}/step=00000002"):
        main([*args, "--trainer.max_steps=5", f"--ckpt_path={last}"])
    # `--ckpt_path last` resumes from that newest intact file instead, and says so (issue 13 class 7b,
    # run/directory.py).
    main([*args, "--trainer.max_steps=5", "--ckpt_path=last"])
    assert torch.load(last, weights_only=False)["global_step"] == 5


def test_bad_options():
    with pytest.raises(ValueError, match="needs a trigger: set every_n_steps"):
        RunCheckpoint(every_n_steps=None, every_minutes=None)
    with pytest.raises(ValueError, match="keep_last must be a positive integer .*last.ckpt is kept regardless"):
        RunCheckpoint(keep_last=0)
    with pytest.raises(ValueError, match="every_minutes must be positive"):
        RunCheckpoint(every_minutes=0)


def test_the_newest_intact_checkpoint_is_chosen_by_step_not_by_modification_time(tmp_path):
    """Issue 34 defect 8: after a `cp -r`, an rsync without -t or a restore the modification times say nothing (here
    step 4 is the most recently modified); the advice beside a damaged last.ckpt names step 16, the highest step."""
    from lightning_cqk.checkpoint.reading import load_checkpoint, newest_intact_checkpoint

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    for step, mtime in ((16, 1_000_000), (4, 2_000_000)):
        path = folder / f"step={step:08d}.ckpt"
        torch.save({"global_step": step}, path)
        os.utime(path, (mtime, mtime))
    last = folder / "last.ckpt"
    last.write_bytes(b"PK\x03\x04 cut short")
    with pytest.raises(CorruptCheckpointError, match=re.escape(f"--ckpt_path {folder / 'step=00000016.ckpt'}")):
        load_checkpoint(last)
    copied = folder / "copied.ckpt"  # no step in its name, the oldest time: its step is read from the file
    torch.save({"global_step": 20}, copied)
    os.utime(copied, (0, 0))
    assert newest_intact_checkpoint(folder, exclude=last) == copied


def test_a_periodic_file_newer_than_last_ckpt_is_resumed_from(make_module, make_trainer, token_loader, tmp_path):
    """Issue 34 defect 10: a kill between writing step=8 and pointing last.ckpt at it leaves last.ckpt at step 4;
    the resume takes step 8 (nothing retrained), also when last.ckpt is a copy rather than a link (`cp -r`)."""
    from lightning_cqk.run.directory import resumable_checkpoint

    trainer = ckpt_trainer(make_trainer, RunCheckpoint(every_n_steps=4, keep_last=None), max_steps=8)
    trainer.fit(make_module(), token_loader())
    run_dir = tmp_path / "run"
    folder, last = run_dir / "checkpoints", run_dir / "checkpoints" / "last.ckpt"
    newest, older = folder / "step=00000008.ckpt", folder / "step=00000004.ckpt"
    last.unlink()
    os.link(older, last)  # the state right after the kill: the link still names step 4
    found, note = resumable_checkpoint(run_dir)
    assert found == newest and "step 8" in note and "step 4" in note
    last.unlink()
    shutil.copyfile(older, last)  # a copied run: last.ckpt is a file of its own, its step read from it
    assert resumable_checkpoint(run_dir)[0] == newest
    newest.write_bytes(newest.read_bytes()[:1000])  # the newer file damaged: last.ckpt (step 4) it is
    assert resumable_checkpoint(run_dir) == (last, "")


def test_a_resume_from_an_earlier_file_deletes_the_continuation_it_replaces(
    make_module, make_trainer, token_loader, tmp_path
):
    """Issue 34 defect 10, its other side: resuming from step 4 explicitly replaces the continuation to step 8, so
    that file must not outrank this run's own last.ckpt (step 6) when the run is next resumed."""
    from lightning_cqk.run.directory import resumable_checkpoint

    ckpt_trainer(make_trainer, RunCheckpoint(every_n_steps=4, keep_last=None), max_steps=8).fit(
        make_module(), token_loader()
    )
    folder = tmp_path / "run" / "checkpoints"
    ckpt_trainer(make_trainer, RunCheckpoint(every_n_steps=4, keep_last=None), max_steps=6).fit(
        make_module(), token_loader(), ckpt_path=str(folder / "step=00000004.ckpt")
    )
    assert steps_on_disk(folder) == [4]
    assert resumable_checkpoint(tmp_path / "run") == (folder / "last.ckpt", "")
    assert torch.load(folder / "last.ckpt", weights_only=True)["global_step"] == 6
