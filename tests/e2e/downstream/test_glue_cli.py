"""`lightning_cqk glue fit --config configs/glue/<task>.yaml --model.checkpoint <ckpt>` (and the same as `fit`) for
every shipped GLUE config, `lightning_cqk glue` (glue.json, glue.md, TensorBoard summary), `lightning_cqk glue-table`,
and `make glue`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lightning_cqk.cli import main
from lightning_cqk.cli.main import names_downstream_model
from lightning_cqk.downstream.glue_table import load_glue_table, render_side_by_side, side_by_side
from lightning_cqk.downstream.glue_tasks import GLUE_TASKS
from lightning_cqk.files.strict_yaml import check_config_args

REPO = Path(__file__).resolve().parents[3]
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


@pytest.fixture(autouse=True)
def _plain_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["lightning_cqk"])


def test_every_task_has_a_config_naming_the_downstream_classes():
    for name in GLUE_TASKS:
        path = REPO / "configs" / "glue" / f"{name}.yaml"
        config = yaml.safe_load(path.read_text())
        assert config["data"]["init_args"]["task"] == name
        assert config["model"]["class_path"] == "lightning_cqk.downstream.GlueClassifier"
        argv = ["fit", "--config", str(path)]
        assert names_downstream_model(check_config_args(argv), argv)  # `fit` of it is `glue fit`
    argv = ["fit", "--config", str(REPO / "configs" / "quickstart.yaml")]
    assert not names_downstream_model(check_config_args(argv), argv)
    assert names_downstream_model([], ["fit", "--model=lightning_cqk.downstream.GlueClassifier"])
    assert names_downstream_model([], ["fit", "--model", "lightning_cqk.downstream.GlueClassifier"])


@pytest.mark.parametrize("name", list(GLUE_TASKS))
def test_glue_config_smoke_runs(name: str, lm_checkpoint: Path, glue_dir: Path, tmp_path: Path):
    """Each task fine-tunes through `glue fit` (its own subcommand); two through `fit`, which is the same command."""
    command = ["fit"] if name in ("rte", "stsb") else ["glue", "fit"]
    main(
        [
            *command,
            "--config",
            str(REPO / "configs" / "glue" / f"{name}.yaml"),
            f"--model.checkpoint={lm_checkpoint}",
            f"--data.data_dir={glue_dir}",
            "--data.batch_size=4",
            "--data.max_eval_examples=8",
            "--trainer.max_steps=2",
            "--trainer.val_check_interval=2",
            f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
            *QUIET,
        ]
    )
    run = tmp_path / "runs" / "glue" / f"{name}-standard-tiny-L1-s1337-s1"
    assert (run / "config.yaml").is_file() and list(run.glob("events.out.tfevents.*"))
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["data"]["init_args"]["task"] == name and saved["model"]["init_args"]["checkpoint"] == str(
        lm_checkpoint
    )


def test_glue_config_needs_a_checkpoint(glue_dir: Path):
    with pytest.raises((SystemExit, ValueError)):
        main(["fit", "--config", str(REPO / "configs" / "glue" / "rte.yaml"), f"--data.data_dir={glue_dir}"])


def test_real_shared_data_fine_tunes(lm_checkpoint: Path, shared_data: Path, tmp_path: Path):
    main(
        [
            "fit",
            "--config",
            str(REPO / "configs" / "glue" / "stsb.yaml"),
            f"--model.checkpoint={lm_checkpoint}",
            f"--data.data_dir={shared_data / 'glue'}",
            "--data.max_train_examples=32",
            "--data.max_eval_examples=16",
            "--data.batch_size=8",
            "--trainer.max_steps=2",
            "--trainer.val_check_interval=2",
            f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
            *QUIET,
        ]
    )


def test_glue_command_writes_tables_and_tensorboard(lm_checkpoint: Path, glue_dir: Path, tmp_path: Path, capsys):
    (glue_dir / "QQP" / "train.tsv").unlink()  # a task without data is reported, not run
    out = tmp_path / "tables"
    main(
        [
            "glue",
            f"--checkpoint={lm_checkpoint}",
            "--tasks=[sst2, qqp]",
            "--seeds=[1, 2]",
            "--max_steps=2",
            f"--data_dir={glue_dir}",
            f"--output_dir={out}",
            f"--log_dir={tmp_path / 'tb' / 'glue'}",
            f"--extra_args={json.dumps(QUIET + ['--data.batch_size=8'])}",
        ]
    )
    table = load_glue_table(out)
    sst2 = table["tasks"]["sst2"]
    assert sst2["status"] == "ok" and len(sst2["metrics"]["acc"]["per_seed"]) == 2
    assert sst2["score"] == pytest.approx(sum(sst2["metrics"]["acc"]["per_seed"]) / 2)
    # without local qqp files: "No training data" (no `datasets` package) or the failed Hub download (with it)
    reason = table["tasks"]["qqp"]["reason"]
    assert table["tasks"]["qqp"]["status"] == "skipped"
    assert "No training data" in reason or ("No local files for GLUE qqp" in reason and "could not be loaded" in reason)
    assert table["average_over"] == ["sst2"] and table["average"] == pytest.approx(sst2["score"])
    md = (out / "glue.md").read_text()
    assert "| QQP | | skipped |" in md and "Average score over 1 of 9 tasks (sst2)" in md
    runs = sorted(p.name for p in (tmp_path / "tb" / "glue").iterdir())
    assert runs == ["sst2-s1", "sst2-s2", "summary"]
    assert list((tmp_path / "tb" / "glue" / "summary").glob("events.out.tfevents.*"))
    assert "Average score" in capsys.readouterr().out

    # a second checkpoint's table, side by side
    other = tmp_path / "other"
    other.mkdir()
    table2 = json.loads((out / "glue.json").read_text())
    table2["checkpoint"] = "runs/x/coupled-tiny-s1/checkpoints/last.ckpt"
    table2["tasks"]["sst2"]["metrics"]["acc"] = {"mean": 0.75, "std": 0.05, "per_seed": [0.7, 0.8]}
    table2["tasks"]["sst2"]["score"], table2["average"] = 0.75, 0.75
    (other / "glue.json").write_text(json.dumps(table2))
    main(["glue-table", str(out), str(other / "glue.json")])
    with pytest.raises(ValueError, match="1 labels for 2 GLUE tables"):
        side_by_side([out, other], labels=["a"])
    printed = capsys.readouterr().out
    assert "| task | standard-tiny-L1-s1337 | coupled-tiny-s1 |" in printed
    assert (
        "| SST-2 (acc) |" in printed and "75.0 ± 5.0" in printed and "| QQP (F1/acc) | skipped | skipped |" in printed
    )
    assert "| **average score** |" in printed and "75.0 (1 tasks)" in printed


def test_side_by_side_by_hand():
    def table(acc: float, checkpoint: str) -> dict:
        return {
            "checkpoint": checkpoint,
            "tasks": {
                "rte": {"status": "ok", "metrics": {"acc": {"mean": acc, "std": 0.0, "per_seed": [acc]}}, "score": acc}
            },
            "average": acc,
            "average_over": ["rte"],
        }

    text = render_side_by_side([table(0.5, "a/checkpoints/last.ckpt"), table(0.625, "b.ckpt")])
    assert text.splitlines() == [
        "| task | a | b |",
        "|---|---|---|",
        "| RTE (acc) | 50.0 | 62.5 |",
        "| **average score** | 50.0 (1 tasks) | 62.5 (1 tasks) |",
    ]


def test_make_glue_runs_the_glue_command():
    out = subprocess.run(
        ["make", "-n", "glue", "CKPT=x.ckpt", "SEEDS=1 2", "GLUE_STEPS=5"], cwd=REPO, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert "lightning_cqk glue --checkpoint x.ckpt" in out.stdout and "--seeds '[1, 2]'" in out.stdout
    assert "--max_steps 5" in out.stdout


def test_test_stage_logs_under_test(lm_checkpoint: Path, glue_dir: Path, tmp_path: Path):
    from lightning_cqk.cli.glue import GlueCLI

    cli = GlueCLI(
        args=[
            "--config",
            str(REPO / "configs" / "glue" / "mnli.yaml"),
            f"--model.checkpoint={lm_checkpoint}",
            f"--data.data_dir={glue_dir}",
            f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
            *QUIET,
        ],
        run=False,
    )
    results = cli.trainer.test(cli.model, datamodule=cli.datamodule, verbose=False)
    logged = {k for r in results for k in r}
    assert {"test/matched/acc", "test/mismatched/acc", "test/score", "test/matched/loss"} <= logged
    assert set(cli.model.final_metrics) == {"matched/acc", "mismatched/acc", "score"}


def test_a_glue_callback_writing_into_another_run_is_refused_before_the_run_is_claimed(
    lm_checkpoint: Path, glue_dir: Path, tmp_path: Path
):
    """Issue 45 item 4: a fine-tuning run's callbacks, like a pretraining run's, write inside its own directory."""
    from lightning_cqk.run.outputs import OutsideRunDirectory

    other = tmp_path / "runs" / "glue" / "other" / "checkpoints"
    callback = {"class_path": "lightning_cqk.callbacks.BestCheckpoint", "init_args": {"dirpath": str(other)}}
    with pytest.raises(OutsideRunDirectory, match=r"trainer\.callbacks\[0\]\.init_args\.dirpath"):
        main(
            [
                "fit", "--config", str(REPO / "configs" / "glue" / "rte.yaml"), f"--model.checkpoint={lm_checkpoint}",
                f"--data.data_dir={glue_dir}", f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
                f"--trainer.callbacks+={json.dumps(callback)}", *QUIET,
            ]
        )  # fmt: skip
    assert not (tmp_path / "runs" / "glue").exists(), "nothing claimed or written"
