"""No callback, logger or profiler writes outside its own run directory (issue 45 item 4).

The trigger: `--trainer.callbacks+='{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args":
{"dirpath": "<another run>/checkpoints", "filename": "last"}}'` overwrote that run's `last.ckpt`; in a sweep spec's
overrides every run wrote into one folder; the allow-list admitted whole library modules. Now such settings are
refused naming the key before anything is built (`run/outputs.py`), Lightning's checkpoint callbacks are refused
naming the package's, and of the libraries only the classes `class_paths.TRUSTED_CLASSES` lists may be named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from tiny_run import QUICKSTART, REPO, tiny_fit

from lightning_cqk.cli import class_paths
from lightning_cqk.cli.main import main
from lightning_cqk.run.outputs import OutsideRunDirectory, output_problems, run_trainer_settings


def _callback(class_path: str, **init_args) -> str:
    return "--trainer.callbacks+=" + json.dumps({"class_path": class_path, "init_args": init_args})


@pytest.fixture
def other_run(tmp_path: Path) -> Path:
    """Another run's checkpoint folder, with its last.ckpt."""
    folder = tmp_path / "runs" / "other" / "version_0" / "checkpoints"
    folder.mkdir(parents=True)
    (folder / "last.ckpt").write_bytes(b"the other run's checkpoint")
    return folder


def _refused(args: list[str], match: str) -> str:
    with pytest.raises(OutsideRunDirectory, match=match) as caught:
        main(args)
    return str(caught.value)


def test_a_checkpoint_callback_pointed_into_another_run_is_refused_before_anything(tiny_shards, tmp_path, other_run):
    runs = tmp_path / "runs"
    lightning = _callback(
        "lightning.pytorch.callbacks.ModelCheckpoint", dirpath=str(other_run), filename="last", every_n_train_steps=1
    )
    message = _refused(tiny_fit(tiny_shards, runs, lightning, "--trainer.max_steps=2"), r"trainer\.callbacks\[4\]")
    assert "lightning_cqk.callbacks.RunCheckpoint" in message and "BestCheckpoint" in message
    best = _callback("lightning_cqk.callbacks.BestCheckpoint", dirpath=str(other_run), filename="last")
    _refused(
        tiny_fit(tiny_shards, runs, best), rf"trainer\.callbacks\[4\]\.init_args\.dirpath '{other_run}' is outside"
    )
    escape = _callback("lightning_cqk.callbacks.LossSpikeMonitor", filename="../../other/version_0/spikes.json")
    _refused(tiny_fit(tiny_shards, runs, escape), r"trainer\.callbacks\[4\]\.init_args\.filename .* leaves its folder")
    assert (other_run / "last.ckpt").read_bytes() == b"the other run's checkpoint"
    assert sorted(p.name for p in runs.iterdir()) == ["other"], "no run directory was created"


def test_a_profiler_writing_elsewhere_is_refused_for_validate_too(tiny_shards, tmp_path):
    profiler = {"class_path": "lightning.pytorch.profilers.SimpleProfiler", "init_args": {"dirpath": str(tmp_path)}}
    args = tiny_fit(tiny_shards, tmp_path / "runs", f"--trainer.profiler={json.dumps(profiler)}")
    _refused(args, r"trainer\.profiler\.init_args\.dirpath")
    _refused(["validate", *args[1:]], r"trainer\.profiler\.init_args\.dirpath")


def test_the_rules_on_plain_settings(tmp_path):
    run = tmp_path / "runs" / "a" / "v0"
    inside = {"callbacks": [{"class_path": "x.Cb", "init_args": {"dirpath": str(run / "ckpts"), "filename": "f/g"}}]}
    assert output_problems(inside, run, cwd=tmp_path) == []
    loggers = {
        "logger": [
            {"class_path": "lightning.pytorch.loggers.TensorBoardLogger", "init_args": {"save_dir": "runs"}},
            {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": "elsewhere"}},
            {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(run), "name": ".."}},
        ]
    }
    problems = output_problems(loggers, run, cwd=tmp_path)
    assert (
        len(problems) == 3 and "trainer.logger[0]" in problems[0] and "trainer.logger[2].init_args.name" in problems[2]
    )
    the_run_logger = {"logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger", "init_args": {}}}
    assert output_problems(the_run_logger, run, cwd=tmp_path) == []
    remote = {"profiler": {"class_path": "p.P", "init_args": {"dirpath": "s3://bucket/x"}}}
    assert "remote" in output_problems(remote, run, cwd=tmp_path)[0]
    assert "no run directory" in output_problems(inside, None, cwd=tmp_path)[0]


def test_only_the_listed_library_classes_may_be_named(monkeypatch):
    monkeypatch.delenv(class_paths.TRUSTED_ENV, raising=False)
    import lightning.pytorch.callbacks as callbacks

    # a listed class passes under its canonical import path too
    class_paths.check_imported_class(
        "lightning.pytorch.callbacks.lr_monitor.LearningRateMonitor", callbacks.LearningRateMonitor
    )
    with pytest.raises(class_paths.UntrustedClassError, match="LambdaCallback.*export LIGHTNING_CQK_TRUSTED_MODULES="):
        class_paths.check_imported_class("lightning.pytorch.callbacks.LambdaCallback", callbacks.LambdaCallback)
    monkeypatch.setenv(class_paths.TRUSTED_ENV, "lightning.pytorch.callbacks.LambdaCallback")
    class_paths.check_imported_class("lightning.pytorch.callbacks.LambdaCallback", callbacks.LambdaCallback)


def test_a_library_class_outside_the_list_is_refused_by_the_command_line(tmp_path, monkeypatch):
    monkeypatch.delenv(class_paths.TRUSTED_ENV, raising=False)
    argv = [
        "fit",
        "--config",
        str(QUICKSTART),
        _callback("lightning.pytorch.callbacks.LambdaCallback"),
        "--print_config",
    ]
    with pytest.raises((SystemExit, class_paths.UntrustedClassError)) as caught:
        main(argv)
    assert not isinstance(caught.value, SystemExit) or caught.value.code not in (0, None)


def _spec(tmp_path: Path, overrides: dict) -> Path:
    spec = {
        "study": "mini",
        "metric": "val/loss",
        "baseline": {"arm": "ref"},
        "axes": {
            "arm": {"ref": {"model.config.attention": "standard"}, "other": {"model.config.attention": "coupled"}}
        },
        "profiles": {
            "paper": {"configs": [str(QUICKSTART)]},
            "cpu": {"configs": [str(QUICKSTART)], "seeds": [1], "overrides": overrides},
        },
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_sweep_spec_whose_overrides_share_an_output_folder_is_refused(tmp_path):
    from lightning_cqk.study.design.spec import expand

    shared = {"class_path": "lightning_cqk.callbacks.BestCheckpoint", "init_args": {"dirpath": str(tmp_path / "one")}}
    with pytest.raises(OutsideRunDirectory, match=r"run other-s1: .*trainer\.callbacks\[4\]\.init_args\.dirpath"):
        expand(_spec(tmp_path, {"trainer.callbacks+": [shared]}), "cpu", tmp_path / "sweep")
    profiler = {"trainer.profiler": {"class_path": "lightning.pytorch.profilers.SimpleProfiler"}}
    profiler["trainer.profiler.init_args.dirpath"] = str(tmp_path / "one")
    with pytest.raises(OutsideRunDirectory, match=r"trainer\.profiler\.init_args\.dirpath"):
        expand(_spec(tmp_path, profiler), "cpu", tmp_path / "sweep")
    assert len(expand(_spec(tmp_path, {}), "cpu", tmp_path / "sweep").runs) == 2


SHIPPED = sorted([*(REPO / "configs").rglob("*.yaml"), *(REPO / "callbacks").glob("*.yaml")])


@pytest.mark.parametrize("config", SHIPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_the_shipped_configs_pass(config: Path, tmp_path):
    trainer = run_trainer_settings([str(config)], {})
    assert output_problems(trainer, tmp_path / "runs" / "x" / "v0", cwd=tmp_path) == []
    from jsonargparse._util import import_object

    for entry in [*(trainer.get("callbacks") or []), trainer.get("logger"), trainer.get("profiler")]:
        if isinstance(entry, dict) and "class_path" in entry:
            class_paths.check_class_path(entry["class_path"])
            class_paths.check_imported_class(entry["class_path"], import_object(entry["class_path"]))
