"""The package's atomic writer (issue 45 item 8): its temporary file is created exclusively under an unpredictable
name, so nothing planted beside the target, a file or a symlink, is ever opened, written through or renamed in."""

from __future__ import annotations

import secrets
from pathlib import Path

from lightning_cqk.files import atomic as atomic_files
from lightning_cqk.files.atomic import write_bytes_atomically, write_text_atomically


def test_a_symlink_planted_at_the_temporary_name_is_skipped_not_followed(tmp_path: Path, monkeypatch):
    victim = tmp_path / "victim.txt"
    victim.write_text("victim\n")
    target = tmp_path / "shared" / "file.txt"
    target.parent.mkdir()
    guesses = iter(["guessed", "fresh"])
    monkeypatch.setattr(secrets, "token_hex", lambda n: next(guesses))
    planted = target.with_name(f".file.txt.{atomic_files.os.getpid()}.guessed.tmp")
    planted.symlink_to(victim)
    write_bytes_atomically(target, b"new bytes")
    assert victim.read_text() == "victim\n", "the planted link was written through"
    assert target.read_bytes() == b"new bytes" and not target.is_symlink()
    assert planted.is_symlink(), "the planted link is left as it was, not put in place"
    assert sorted(p.name for p in target.parent.iterdir()) == sorted([planted.name, "file.txt"])


def test_a_symlink_at_the_target_is_replaced_not_followed(tmp_path: Path):
    victim = tmp_path / "victim.txt"
    victim.write_text("victim\n")
    target = tmp_path / "file.txt"
    target.symlink_to(victim)
    write_text_atomically(target, "mine\n")
    assert victim.read_text() == "victim\n" and not target.is_symlink() and target.read_text() == "mine\n"
