"""FSDP2's distributed-checkpoint folders (issue 32 item 3), without a process group: what makes one intact, which
one a resume takes, how one is put in place whole, and the commands that need the weights in one file. The end to end
resume (a 1-rank FSDP2 fit stopped and resumed to the same weights) is tests/e2e/scale/test_strategy_flag.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tiny_run import checkpoint_folder

from lightning_cqk.checkpoint.reading import (
    CONSOLIDATE,
    checkpoint_problem,
    checkpoint_step,
    load_checkpoint,
    refuse_checkpoint_folder,
)
from lightning_cqk.errors import ConfigError
from lightning_cqk.files.atomic import link_folder, replace_folder
from lightning_cqk.run.directory import resolve_fit, resumable_checkpoint


def test_a_folder_is_intact_with_its_index_and_an_intact_meta(tmp_path: Path):
    assert checkpoint_problem(checkpoint_folder(tmp_path / "a.ckpt", 3)) is None
    assert ".metadata" in checkpoint_problem(checkpoint_folder(tmp_path / "b.ckpt", 3, index=False))
    assert "meta.pt" in checkpoint_problem(checkpoint_folder(tmp_path / "c.ckpt", 3, meta=False))
    cut = checkpoint_folder(tmp_path / "d.ckpt", 3)
    (cut / "meta.pt").write_bytes((cut / "meta.pt").read_bytes()[:40])
    assert "meta.pt is damaged" in checkpoint_problem(cut)
    assert checkpoint_step(tmp_path / "a.ckpt") == 3
    assert load_checkpoint(tmp_path / "a.ckpt")["global_step"] == 3, "its meta.pt"


def test_a_resume_takes_the_intact_folder_of_the_highest_step(tmp_path: Path):
    folder = tmp_path / "run" / "checkpoints"
    checkpoint_folder(folder / "step=00000002.ckpt", 2)
    checkpoint_folder(folder / "step=00000004.ckpt", 4)
    link_folder(folder / "step=00000004.ckpt", folder / "last.ckpt")
    assert resumable_checkpoint(tmp_path / "run") == (folder / "last.ckpt", "")
    checkpoint_folder(folder / "step=00000006.ckpt", 6)  # saved, then killed before last.ckpt was pointed at it
    ckpt, note = resumable_checkpoint(tmp_path / "run")
    assert ckpt == folder / "step=00000006.ckpt" and "newer than" in note
    (folder / "last.ckpt" / ".metadata").unlink()
    (folder / "step=00000006.ckpt" / "meta.pt").unlink()  # cut short
    ckpt, note = resumable_checkpoint(tmp_path / "run")
    assert ckpt == folder / "step=00000004.ckpt" and "without its .metadata" in note


def test_ckpt_path_may_name_a_folder(tmp_path: Path):
    ckpt = checkpoint_folder(tmp_path / "runs" / "x" / "r" / "checkpoints" / "step=00000002.ckpt", 2)
    (tmp_path / "runs" / "x" / "r" / "run.json").write_text('{"attempts": []}')
    plan = resolve_fit(tmp_path / "runs" / "x", "r", None, str(ckpt), argv=[])
    assert plan.run_dir == tmp_path / "runs" / "x" / "r" and plan.ckpt_path == str(ckpt) and plan.resuming


def test_a_folder_is_put_in_place_whole(tmp_path: Path):
    old = checkpoint_folder(tmp_path / "last.ckpt", 2)
    new = checkpoint_folder(tmp_path / ".last.ckpt.123.tmp", 4)
    replace_folder(new, old)
    assert checkpoint_step(old) == 4 and not new.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"], "the old folder is gone, nothing left aside"


def test_last_is_a_folder_of_hard_links(tmp_path: Path):
    source = checkpoint_folder(tmp_path / "step=00000004.ckpt", 4)
    link_folder(source, tmp_path / "last.ckpt")
    for name in ("__0_0.distcp", ".metadata", "meta.pt"):
        assert os.path.samefile(source / name, tmp_path / "last.ckpt" / name)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt", "step=00000004.ckpt"]


def test_commands_that_need_the_weights_refuse_a_folder_with_the_consolidating_command(tmp_path: Path):
    from lightning_cqk.inference.pretrained import read_checkpoint

    folder = checkpoint_folder(tmp_path / "last.ckpt", 2)
    with pytest.raises(ConfigError, match="distributed-checkpoint folder") as err:
        refuse_checkpoint_folder(folder)
    assert CONSOLIDATE.format(path=folder) in str(err.value)
    with pytest.raises(ConfigError, match="lightning_cqk consolidate"):
        read_checkpoint(folder)
