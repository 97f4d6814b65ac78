"""A key given twice in a `--config` file of `fit` is refused naming the file and both lines, before anything is
built (jsonargparse reads configs with `safe_load`, which keeps the last of two keys silently); every shipped YAML
passes (issue 25, class 5, for configs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_cqk.cli import main
from lightning_cqk.files.strict_yaml import YAMLInputError, check_text

REPO = Path(__file__).resolve().parents[2]
DUPLICATE = """\
model:
  config:
    n_layer: 2
    n_embd: 32
    n_layer: 4
"""


def test_every_shipped_yaml_has_no_duplicate_key():
    files = [*REPO.glob("configs/**/*.yaml"), *REPO.glob("callbacks/*.yaml")]
    assert len(files) > 20
    for path in files:
        check_text(path.read_text(), str(path))


@pytest.mark.parametrize("form", ["--config", "--config="])
def test_a_duplicate_key_in_a_config_file_is_refused_before_fit_builds_anything(tmp_path: Path, monkeypatch, form):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dup.yaml").write_text(DUPLICATE)
    args = ["fit", "--config", "dup.yaml"] if form == "--config" else ["fit", "--config=dup.yaml"]
    with pytest.raises(YAMLInputError) as err:
        main([*args, "--trainer.max_steps=1"])
    assert str(err.value).startswith(
        "--config dup.yaml, line 5: key 'n_layer' (in model.config) appears twice (first on line 3)"
    )
    assert not (tmp_path / "runs").exists() and not (tmp_path / "lightning_logs").exists()


def test_the_real_command_says_it_in_one_paragraph(tmp_path: Path):
    (tmp_path / "dup.yaml").write_text(DUPLICATE)
    env = {**os.environ, "PYTHONPATH": str(REPO), "LIGHTNING_CQK_LOG_DIR": str(tmp_path)}
    env.pop("LIGHTNING_CQK_DEBUG", None)
    cmd = [sys.executable, "-m", "lightning_cqk", "fit", "--config", "dup.yaml"]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.startswith("lightning_cqk fit: --config dup.yaml, line 5: key 'n_layer'"), done.stderr
    assert "Traceback" not in done.stderr
