"""`ModelConfig.mlp` is now `ffn` (`mlp` also names an attention backend): the old name still reads, with a
FutureWarning, from Python and the command line, and checkpoints and run configs of older versions load (issue 18)."""

from __future__ import annotations

import sys
from pathlib import Path

import lightning
import pytest
import torch

from lightning_cqk.cli.trainer import CQKCLI
from lightning_cqk.errors import ConfigError
from lightning_cqk.model_config import ModelConfig, upgrade_config_dict, upgrade_run_config
from lightning_cqk.module import LitLM, check_checkpoint_config

QUICKSTART = Path(__file__).resolve().parents[3] / "configs" / "quickstart.yaml"
SMALL = dict(preset="tiny", n_layer=1, n_head=2, n_embd=32, mlp_hidden=64, block_size=32, vocab_size=257)


def test_the_old_name_reads_as_ffn_with_a_deprecation_message():
    with pytest.warns(FutureWarning, match=r"ModelConfig.mlp is renamed ffn .*--model.config.ffn swiglu"):
        config = ModelConfig(**SMALL, mlp="swiglu")
    assert config.ffn == "swiglu" and config.mlp is None
    assert "mlp" not in config.to_dict() and config.to_dict()["ffn"] == "swiglu"
    with pytest.raises(ConfigError, match="both are set"):
        ModelConfig(**SMALL, mlp="gelu", ffn="swiglu")


def test_upgrading_dicts_of_older_versions():
    assert upgrade_config_dict({"mlp": "swiglu", "n_layer": 2}) == {"ffn": "swiglu", "n_layer": 2}
    assert upgrade_config_dict({"mlp": None, "ffn": "gelu"}) == {"ffn": "gelu"}
    run = {"model": {"config": {"mlp": "swiglu"}, "optim": {}}, "trainer": {}}
    assert upgrade_run_config(run)["model"] == {"config": {"ffn": "swiglu"}, "optim": {}}


@pytest.fixture
def old_checkpoint(tmp_path) -> Path:
    """A checkpoint as an older version wrote it: `mlp: swiglu` in its hyper-parameters, no `ffn`."""
    torch.manual_seed(0)
    lit = LitLM(config=ModelConfig(**SMALL, ffn="swiglu"))
    hparams = dict(lit.hparams)
    config = dict(hparams["config"])
    config["mlp"] = config.pop("ffn")
    path = tmp_path / "old.ckpt"
    torch.save(
        {
            "state_dict": lit.state_dict(),
            "hyper_parameters": {**hparams, "config": config},
            "pytorch-lightning_version": lightning.__version__,
        },
        path,
    )
    return path


def test_an_old_checkpoint_loads_with_its_weights_and_is_checked(old_checkpoint):
    loaded = LitLM.load_from_checkpoint(old_checkpoint, map_location="cpu")
    assert loaded.config.ffn == "swiglu"
    saved = torch.load(old_checkpoint, weights_only=True)
    for key, value in saved["state_dict"].items():
        assert torch.equal(loaded.state_dict()[key], value), key
    check_checkpoint_config(saved, ModelConfig(**SMALL, ffn="swiglu"), str(old_checkpoint), resuming=False)
    with pytest.raises(ConfigError, match=r"ffn: checkpoint 'swiglu', this run 'gelu'"):
        check_checkpoint_config(saved, ModelConfig(**SMALL, ffn="gelu"), str(old_checkpoint), resuming=False)


def test_the_cli_takes_the_old_flag_and_an_old_checkpoints_settings(old_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["lightning_cqk"])
    monkeypatch.chdir(tmp_path)

    class Parsed(CQKCLI):
        def _run_subcommand(self, subcommand: str) -> None:  # the model is built; nothing runs
            pass

    logs = ["--trainer.logger.init_args.save_dir", str(tmp_path / "runs")]
    with pytest.warns(FutureWarning, match="ModelConfig.mlp is renamed ffn"):
        cli = Parsed(args=["validate", "--config", str(QUICKSTART), "--model.config.mlp", "swiglu", *logs])
    assert cli.model.config.ffn == "swiglu"
    cli = Parsed(args=["validate", "--config", str(QUICKSTART), "--ckpt_path", str(old_checkpoint), *logs])
    assert cli.model.config.ffn == "swiglu" and cli.model.config.n_embd == 32  # the checkpoint's settings
