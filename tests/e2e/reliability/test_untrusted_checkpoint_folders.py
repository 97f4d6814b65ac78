"""Hostile round four (issue 45 items 1, 5, 7): a distributed-checkpoint folder is read without running code from it,
a folder missing a shard is not intact, and `consolidate` answers plausible mistakes in one paragraph.

Each trigger plants a pickle whose `__reduce__` creates a marker file: it runs only if something unpickles the planted
bytes as they are (torch's `FileSystemReader.read_metadata` is a bare `pickle.load`; its default load planner reads a
stored item with `torch.load(weights_only=False)`). The FSDP2 resume of such a folder is
tests/e2e/scale/test_strategy_flag.py's slow test."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_run import Planted, checkpoint_folder, child_env, plant_index, tiny_command

from lightning_cqk.checkpoint.consolidate import consolidate
from lightning_cqk.checkpoint.folder import load_into, read_full_state
from lightning_cqk.checkpoint.reading import (
    CorruptCheckpointError,
    UntrustedCheckpointError,
    checkpoint_problem,
)
from lightning_cqk.errors import ConfigError
from lightning_cqk.run.directory import resumable_checkpoint


def test_a_planted_index_is_refused_without_running_it(tmp_path: Path):
    folder, marker = checkpoint_folder(tmp_path / "last.ckpt", 4), tmp_path / "ran"
    plant_index(folder, marker)
    with pytest.raises(UntrustedCheckpointError, match=r"asks for _?operator\.getitem"):
        checkpoint_problem(folder)
    with pytest.raises(UntrustedCheckpointError):
        consolidate(folder, tmp_path / "out.ckpt")
    with pytest.raises(UntrustedCheckpointError):
        read_full_state(folder)
    assert not marker.exists(), "the planted command ran"
    assert not (tmp_path / "out.ckpt").exists()


def test_a_resume_refuses_a_planted_folder_instead_of_passing_it_over(tmp_path: Path):
    checkpoints = tmp_path / "run" / "checkpoints"
    checkpoint_folder(checkpoints / "step=00000002.ckpt", 2)
    planted = checkpoint_folder(checkpoints / "step=00000004.ckpt", 4)
    plant_index(planted, tmp_path / "ran")
    with pytest.raises(UntrustedCheckpointError, match="step=00000004"):
        resumable_checkpoint(tmp_path / "run")
    assert not (tmp_path / "ran").exists()


def test_a_stored_item_that_is_not_plain_data_is_refused_by_name(tmp_path: Path):
    import torch.distributed.checkpoint as dcp

    marker = tmp_path / "ran"
    folder = tmp_path / "last.ckpt"
    dcp.save({"state_dict": {"w": torch.ones(2)}, "extra": Planted(marker)}, checkpoint_id=folder, no_dist=True)
    torch.save({"global_step": 1}, folder / "meta.pt")
    assert checkpoint_problem(folder) is None, "the index itself is genuine"
    with pytest.raises(UntrustedCheckpointError, match="'extra'"):
        read_full_state(folder)
    with pytest.raises(UntrustedCheckpointError, match="'extra'"):
        load_into({"state_dict": {"w": torch.zeros(2)}, "extra": None}, folder)  # the resume's reader
    assert not marker.exists(), "the planted item ran"
    state = {"state_dict": {"w": torch.zeros(2)}}
    load_into(state, folder)  # plain items and tensors still load
    assert torch.equal(state["state_dict"]["w"], torch.ones(2))


def test_plain_stored_items_load(tmp_path: Path):
    folder = checkpoint_folder(tmp_path / "last.ckpt", 3)
    state = read_full_state(folder)
    assert state["optimizer_0"]["param_groups"][0]["lr"] == pytest.approx(1e-3)
    assert set(state["state_dict"]) == {"weight", "bias"}


@pytest.mark.parametrize("damage", ["delete", "truncate"])
def test_a_folder_missing_a_shard_is_not_intact_and_the_newest_complete_one_resumes(tmp_path: Path, damage: str):
    """Item 5: a folder whose index names a missing (or cut short) shard counted as intact; `--ckpt_path last`
    picked it and ended in a FileNotFoundError traceback."""
    checkpoints = tmp_path / "run" / "checkpoints"
    intact = checkpoint_folder(checkpoints / "step=00000002.ckpt", 2)
    broken = checkpoint_folder(checkpoints / "step=00000004.ckpt", 4)
    shutil.copytree(broken, checkpoints / "last.ckpt")
    for folder in (broken, checkpoints / "last.ckpt"):
        shard = folder / "__0_0.distcp"
        if damage == "delete":
            shard.unlink()
        else:
            shard.write_bytes(shard.read_bytes()[:100])
    problem = checkpoint_problem(broken)
    assert problem is not None and "__0_0.distcp" in problem
    assert ("missing" if damage == "delete" else "cut short") in problem
    chosen, note = resumable_checkpoint(tmp_path / "run")
    assert chosen == intact and "step=00000002.ckpt" in note
    with pytest.raises(CorruptCheckpointError, match=r"__0_0\.distcp"):
        consolidate(broken, tmp_path / "out.ckpt")


def test_consolidate_follows_a_symlinked_shard(tmp_path: Path):
    """Item 7: a folder whose shard is a link to a copy elsewhere (a shared store) consolidates like the original."""
    folder = checkpoint_folder(tmp_path / "a" / "last.ckpt", 3)
    linked = tmp_path / "b" / "last.ckpt"
    shutil.copytree(folder, linked)
    store = tmp_path / "store.distcp"
    (linked / "__0_0.distcp").rename(store)
    (linked / "__0_0.distcp").symlink_to(store)
    one, two = consolidate(folder, tmp_path / "one.ckpt"), consolidate(linked, tmp_path / "two.ckpt")
    a, b = torch.load(one, weights_only=True), torch.load(two, weights_only=True)
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for name, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][name])


def test_consolidate_refuses_a_meta_holding_a_class_and_a_missing_outputcheckpoint_folder(tmp_path: Path):
    folder = checkpoint_folder(tmp_path / "last.ckpt", 3)
    with pytest.raises(ConfigError, match="does not exist. Create it first"):
        consolidate(folder, tmp_path / "nowhere" / "out.ckpt")
    torch.save({"global_step": 3, "hyper_parameters": {"x": Planted(tmp_path / "ran")}}, folder / "meta.pt")
    with pytest.raises(UntrustedCheckpointError, match="not plain data"):
        consolidate(folder, tmp_path / "out.ckpt")
    assert not (tmp_path / "ran").exists()


def _consolidate_command(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lightning_cqk", "consolidate", *args],
        env=child_env(),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_consolidate_command_answers_in_one_paragraph(tmp_path: Path):
    """The command as a user runs it: a planted folder, a missing output folder, a file where a folder goes."""
    planted = checkpoint_folder(tmp_path / "planted.ckpt", 4)
    plant_index(planted, tmp_path / "ran")
    good = checkpoint_folder(tmp_path / "good.ckpt", 2)
    single = tmp_path / "single.ckpt"
    torch.save({"global_step": 1}, single)
    cases = [
        ((str(planted), "--output", str(tmp_path / "o1")), "asks for"),
        ((str(good), "--output", str(tmp_path / "no" / "o2")), "does not exist"),
        ((str(single),), "one file already"),
    ]
    for args, expected in cases:
        done = _consolidate_command(*args, cwd=tmp_path)
        assert done.returncode != 0, args
        assert expected in done.stderr, done.stderr[-2000:]
        assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "ran").exists()
    done = _consolidate_command(str(good), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "good.ckpt.consolidated").is_file()


def test_a_folder_without_the_fsdp2_strategy_and_a_url_are_refused_before_lightning(tiny_shards: Path, tmp_path: Path):
    """Item 6: an FSDP2 folder resumed on a laptop without the strategy ended in an IsADirectoryError traceback;
    item 7: `validate --ckpt_path http://...` downloaded the file and ended in torch's advice to weaken weights_only."""
    folder = checkpoint_folder(tmp_path / "colleague" / "last.ckpt", 3)
    url = "http://127.0.0.1:9/last.ckpt"  # the discard port: nothing is downloaded, whatever happens
    cases = [
        (tiny_command(tiny_shards, tmp_path / "runs", "--ckpt_path", str(folder)), "--trainer.strategy ModelParallel"),
        (tiny_command(tiny_shards, tmp_path / "runs", "--ckpt_path", url, subcommand="validate"), "Download it first"),
    ]
    for argv, expected in cases:
        done = subprocess.run(argv, env=child_env(), cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert done.returncode != 0
        assert expected in done.stderr, done.stderr[-3000:]
        assert "Traceback" not in done.stderr and "weights_only=False" not in done.stderr, done.stderr[-3000:]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("*.ckpt")), "nothing trained"
