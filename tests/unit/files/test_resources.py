"""Config paths: the working directory first, then the package's shipped copy, else a clear error
(lightning_cqk/files/resources.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_cqk.files import resources
from lightning_cqk.files.resources import ConfigNotFound, find_config, resolve_config_args
from lightning_cqk.study.design.spec import SpecError, expand

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def shipped(monkeypatch: pytest.MonkeyPatch) -> Path:
    """Pretend this checkout's configs/ and callbacks/ are the installed package data."""
    monkeypatch.setattr(resources, "shipped_root", lambda folder: REPO / folder)
    return REPO


def test_working_directory_wins_over_the_shipped_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shipped):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "quickstart.yaml").write_text("seed_everything: 1\n")
    assert find_config("configs/quickstart.yaml") == Path("configs/quickstart.yaml")
    assert find_config("configs/attention/mla.yaml") == REPO / "configs" / "attention" / "mla.yaml"
    assert resolve_config_args(["fit", "--config=configs/attention/mla.yaml", "--config", "{a: 1}"]) == [
        "fit",
        f"--config={REPO / 'configs' / 'attention' / 'mla.yaml'}",
        "--config",
        "{a: 1}",
    ]


def test_a_missing_config_names_the_closest_shipped_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shipped):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigNotFound, match="Did you mean configs/quickstart.yaml"):
        find_config("configs/quickstrat.yaml")
    with pytest.raises(ConfigNotFound, match="Give a path to an existing file"):
        resolve_config_args(["fit", "--config", "elsewhere/x.yaml"])


def test_without_package_data_the_error_says_to_run_from_the_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(resources, "shipped_root", lambda folder: None)
    with pytest.raises(ConfigNotFound, match="source checkout without being installed"):
        find_config("configs/quickstart.yaml")


def test_sweep_spec_and_its_configs_come_from_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shipped):
    monkeypatch.chdir(tmp_path)
    sweep = expand("configs/ablations/coupling.yaml", "cpu")
    assert sweep.runs[0].configs == [str(REPO / "configs" / "quickstart.yaml"), str(REPO / "callbacks" / "sweep.yaml")]
    with pytest.raises(SpecError, match="Did you mean configs/ablations/coupling.yaml"):
        expand("configs/ablations/couplin.yaml", "cpu")


def test_shared_data_placeholder_needs_the_variable(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("LIGHTNING_CQK_SHARED_DATA", raising=False)
    with pytest.raises(SpecError, match="set LIGHTNING_CQK_SHARED_DATA to the folder"):
        expand("configs/ablations/corpus.yaml", "cpu")
    assert expand("configs/ablations/coupling.yaml", "cpu").runs  # a profile without {shared_data} needs nothing
