"""A run never deletes what it did not create, and never leaves save_dir (issue 25 class 7), through real `fit`s."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from tiny_run import child_env, tiny_command

from lightning_cqk.run.directory import UnsafeRunName, check_run_name_part


def fit(runs: Path, cwd: Path, *extra: str) -> subprocess.CompletedProcess:
    command = tiny_command("/nonexistent/shards", runs, "--trainer.max_steps=2", *extra)
    return subprocess.run(command, env=child_env(), cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("value", ["..", ".", "../x", "a/b", "/abs", "a\\b", "x\ny", "\x00"])
def test_unsafe_name_parts_are_refused_with_a_pasteable_fix(value):
    with pytest.raises(UnsafeRunName, match="is not a plain directory name") as refused:
        check_run_name_part(value, "--trainer.logger.init_args.version")
    fix = str(refused.value).split("e.g. --trainer.logger.init_args.version ")[1].split(";")[0]
    check_run_name_part(fix.strip("'"), "--trainer.logger.init_args.version")  # the suggested name passes


@pytest.mark.parametrize("value", [None, "", "run-2", "v1.0", 3, "..hidden"])
def test_plain_names_pass(value):
    check_run_name_part(value, "--trainer.logger.init_args.version")


@pytest.mark.slow
def test_unsafe_run_names_are_refused_and_a_failed_fit_keeps_a_directory_it_did_not_create(tmp_path: Path):
    work = tmp_path / "a" / "b" / "c"
    work.mkdir(parents=True)
    victim = tmp_path / "victim_empty"
    victim.mkdir()
    runs = work / "runs"
    refused = fit(runs, work, "--trainer.logger.init_args.version=../../../victim_empty")
    assert refused.returncode != 0 and "is not a plain directory name" in refused.stderr, refused.stderr[-3000:]
    assert "Traceback" not in refused.stderr
    assert victim.is_dir() and not runs.exists(), "refused before anything was created"

    # A pre-existing empty directory named as the run's version: the launch fails (no shards), and the directory,
    # which it did not create, stays (before: removed as "created by this launch").
    own = runs / "quickstart" / "victim"
    own.mkdir(parents=True)
    failed = fit(runs, work, "--trainer.logger.init_args.version=victim")
    assert failed.returncode != 0 and "No token shards" in failed.stderr, failed.stderr[-3000:]
    assert own.is_dir() and not list(own.iterdir()), "left as it was: empty, lock released"
    assert "created by this launch" not in failed.stderr

    # A directory the launch did create is still removed.
    created = fit(runs, work, "--trainer.logger.init_args.version=fresh")
    assert created.returncode != 0 and not (runs / "quickstart" / "fresh").exists(), created.stderr[-2000:]


def _suggested(message: str, flag: str = "--trainer.logger.init_args.version") -> str:
    """The name a refusal suggests (the shell word after `e.g. <flag> `), unquoted as a shell would."""
    import shlex

    return shlex.split(message.split(f"e.g. {flag} ")[1].split(";")[0])[0]


@pytest.mark.parametrize(
    "value, shown",
    [
        ("gnp\u202eexe.ckpt", "U+202E RIGHT-TO-LEFT OVERRIDE at position 4"),
        ("run\u2067x\u2069", "U+2067 RIGHT-TO-LEFT ISOLATE at position 4"),
        ("\u200fs1", "U+200F RIGHT-TO-LEFT MARK at position 1"),
        ("a\u200bb", "U+200B ZERO WIDTH SPACE at position 2"),
        ("x\u2028y", "U+2028 LINE SEPARATOR at position 2"),
    ],
)
def test_names_with_bidi_or_invisible_characters_are_refused(value: str, shown: str):
    """Issue 34 defect 13: a run name with a right-to-left override displayed as another name; now refused, naming
    the character, with a pasteable name without it."""
    with pytest.raises(UnsafeRunName) as refused:
        check_run_name_part(value, "--trainer.logger.init_args.version")
    message = str(refused.value)
    assert f"holds an invisible or text-direction character ({shown})" in message, message
    assert value not in message  # the message shows the name escaped, never displays it reordered
    check_run_name_part(_suggested(message), "--trainer.logger.init_args.version")


@pytest.mark.parametrize("value", ["a" * 300, "\u20ac" * 70], ids=["300 characters", "210 bytes of UTF-8"])
def test_names_too_long_for_a_directory_are_refused_before_mkdir(value: str, tmp_path: Path):
    """Issue 34 defect 12: a 300-character run name failed at mkdir with an `OSError: File name too long`
    traceback; now refused up front, with a shorter name that works as a directory with a suffix and a lock."""
    with pytest.raises(UnsafeRunName, match=r"long: a directory name holds at most 255 bytes") as refused:
        check_run_name_part(value, "--trainer.logger.init_args.name")
    short = _suggested(str(refused.value), "--trainer.logger.init_args.name")
    check_run_name_part(short, "--trainer.logger.init_args.name")
    assert value.startswith(short) and 198 <= len(short.encode()) <= 200  # cut between characters
    (tmp_path / f"{short}-999" / "status").mkdir(parents=True)
    (tmp_path / f"{short}-999" / "status" / f"{short}.lock").touch()


@pytest.mark.parametrize("value", ["a" * 200, "run-\u00e9t\u00e9", "\u05e9\u05dc\u05d5\u05dd", "\U0001f680-s1"])
def test_long_or_non_ascii_plain_names_pass(value: str):
    check_run_name_part(value, "--trainer.logger.init_args.version")
