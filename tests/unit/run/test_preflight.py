"""A run's preflight (lightning_cqk/run/preflight.py): the ordered checks, each on its own, without a parser or a run.

The end-to-end behaviour of each (resumes, locks, ranks, refusals through `lightning_cqk fit`) is tested where it
was before the checks moved here: tests/reliability/ (test_run_dir.py, test_launch_plan.py, test_run_names.py,
test_run_outputs.py), tests/e2e/scale/test_strategy_flag.py, tests/e2e/test_cli.py.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from jsonargparse import Namespace

from lightning_cqk.errors import ConfigError
from lightning_cqk.run import preflight as pf
from lightning_cqk.run.directory import UnsafeRunName
from lightning_cqk.run.outputs import OutsideRunDirectory

TB = "lightning.pytorch.loggers.TensorBoardLogger"


def settings(tmp_path: Path, **over) -> Namespace:
    """A trainer command's settings as the parser leaves them (only the keys the checks read)."""
    logger = Namespace(class_path=TB, init_args=Namespace(save_dir=str(tmp_path / "runs"), name="exp", version=None))
    trainer = Namespace(logger=logger, precision=None, accelerator="cpu", strategy="auto", callbacks=None)
    model = Namespace(config=Namespace(attention="standard", preset="tiny", n_layer=None, n_head=None, n_embd=None))
    model.config.mlp_hidden = None
    config = Namespace(trainer=trainer, model=model, ckpt_path=None, budget=None, seed_everything=1)
    for key, value in over.items():
        config[key] = value
    return config


def inputs(config: Namespace, sub: str = "validate", merged: list | None = None) -> pf.Inputs:
    def merge(ckpt):
        (merged if merged is not None else []).append(ckpt)
        return {}

    return pf.Inputs(sub, [sub], lambda: config, merge, lambda c: "config: text\n")


def test_the_checks_run_in_the_documented_order(monkeypatch):
    ran = []
    monkeypatch.setattr(pf, "CHECKS", tuple(lambda i, p, n=c.__name__: ran.append(n) for c in pf.CHECKS))
    plan = pf.preflight(inputs(Namespace()))
    assert isinstance(plan, pf.RunPlan) and plan.directory is None
    assert ran == [
        "check_attention_name",
        "check_run_names",
        "plan_run",
        "use_run_logger",
        "default_precision",
        "check_strategy",
        "quiet_budget_warning",
        "place_evaluation_logs",
        "check_outputs",
    ]


def test_check_attention_name_points_a_recipe_name_at_its_config(tmp_path):
    pf.check_attention_name(inputs(settings(tmp_path)), pf.RunPlan())  # a backend passes
    config = settings(tmp_path)
    config.model.config.attention = "gqa"
    with pytest.raises(ConfigError, match="gqa is a recipe, not a backend: configs/attention/gqa.yaml"):
        pf.check_attention_name(inputs(config), pf.RunPlan())


def test_check_run_names_refuses_a_name_that_leaves_the_folder(tmp_path):
    config = settings(tmp_path)
    config.trainer.logger.init_args.version = "../elsewhere"
    with pytest.raises(UnsafeRunName):
        pf.check_run_names(inputs(config), pf.RunPlan())


def test_plan_run_merges_an_evaluated_checkpoint_s_settings(tmp_path):
    ckpt = tmp_path / "a.ckpt"
    ckpt.write_bytes(b"x")
    merged: list = []
    pf.plan_run(inputs(settings(tmp_path, ckpt_path=str(ckpt)), merged=merged), pf.RunPlan())
    pf.plan_run(inputs(settings(tmp_path, ckpt_path=str(tmp_path / "absent.ckpt")), merged=merged), pf.RunPlan())
    assert merged == [str(ckpt)]  # an absent file is the strategy check's to refuse


def test_use_run_logger_gives_fit_the_framework_s_tensorboard(tmp_path):
    fit, validate = settings(tmp_path), settings(tmp_path)
    pf.use_run_logger(inputs(fit, "fit"), pf.RunPlan())
    pf.use_run_logger(inputs(validate, "validate"), pf.RunPlan())
    assert fit.trainer.logger.class_path == "lightning_cqk.callbacks.tensorboard.TensorBoardLogger"
    assert validate.trainer.logger.class_path == TB


def test_default_precision_is_fp32_without_a_bf16_gpu_and_a_set_one_stays(tmp_path):
    config = settings(tmp_path)
    pf.default_precision(inputs(config), pf.RunPlan())
    assert config.trainer.precision == "32-true"
    config.trainer.precision = "bf16-mixed"
    pf.default_precision(inputs(config), pf.RunPlan())
    assert config.trainer.precision == "bf16-mixed"


def test_check_strategy_resolves_a_class_name_and_refuses_a_folder_to_ddp(tmp_path):
    config = settings(tmp_path)
    config.trainer.strategy = "ModelParallelStrategy"
    pf.check_strategy(inputs(config), pf.RunPlan())
    assert config.trainer.strategy.class_path == "lightning_cqk.cli.strategy.FSDP2Strategy"
    folder = tmp_path / "last.ckpt"
    folder.mkdir()
    config = settings(tmp_path, ckpt_path=str(folder))
    config.trainer.strategy = "ddp"
    with pytest.raises(ConfigError, match="distributed-checkpoint folder saved by FSDP2"):
        pf.check_strategy(inputs(config), pf.RunPlan())


def test_quiet_budget_warning_only_for_a_fit_with_a_budget(tmp_path):
    message = "`max_epochs` was not set. Setting it to 1000 epochs"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pf.quiet_budget_warning(inputs(settings(tmp_path), "fit"), pf.RunPlan())
        warnings.warn(message, stacklevel=1)
        pf.quiet_budget_warning(inputs(settings(tmp_path, budget=Namespace(tokens=1e6)), "fit"), pf.RunPlan())
        warnings.warn(message, stacklevel=1)
    assert len(caught) == 1


def test_place_evaluation_logs_beside_the_checkpoint_s_run(tmp_path):
    ckpt = tmp_path / "runs" / "exp" / "standard-tiny-s1" / "checkpoints" / "last.ckpt"
    config = settings(tmp_path, ckpt_path=str(ckpt))
    pf.place_evaluation_logs(inputs(config), pf.RunPlan())
    args = config.trainer.logger.init_args
    assert (args.save_dir, args.name, args.version) == (str(tmp_path / "runs"), "exp", "standard-tiny-s1")
    fresh = settings(tmp_path)
    pf.place_evaluation_logs(inputs(fresh), pf.RunPlan())
    assert fresh.trainer.logger.init_args.version == "standard-tiny-s1"  # a new run name of this model


def test_check_outputs_refuses_a_callback_writing_outside_the_run(tmp_path):
    config = settings(tmp_path)
    config.trainer.logger.init_args.version = "v"
    pf.check_outputs(inputs(config), pf.RunPlan())
    callback = Namespace(class_path="lightning.pytorch.callbacks.ModelCheckpoint", init_args=Namespace(dirpath="/"))
    config.trainer.callbacks = [callback]
    with pytest.raises(OutsideRunDirectory):
        pf.check_outputs(inputs(config), pf.RunPlan())
