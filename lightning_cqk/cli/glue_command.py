"""``lightning_cqk glue``: fine-tune a checkpoint on every GLUE task that has data, over a fixed seed set; table it.

    lightning_cqk glue --checkpoint runs/quickstart/standard-tiny-s1337/checkpoints/last.ckpt \
        [--tasks '[cola, sst2]'] [--seeds '[1, 2, 3]'] [--max_steps 60] --data_dir /path/to/glue

Each (task, seed) is one ``lightning_cqk fit --config configs/glue/<task>.yaml`` run, in this process, with the
given budget; the final dev metrics of every run are collected (the last validation, after ``max_steps``: no
selection on the dev set), averaged over seeds and written beside the checkpoint as ``glue.json`` and ``glue.md``
(``glue_table``). A task without training data is not run; its row says why. TensorBoard: each fine-tuning run logs
under ``<run dir>/glue/<task>-s<seed>/`` (the checkpoint's run directory, so ``tensorboard --logdir runs`` shows it
beside the pre-training curves; a later ``glue`` of the same checkpoint gets ``<task>-s<seed>-2``, ... rather than
writing into an earlier one's directory: ``run_dir.next_free_name``), and ``<run dir>/glue/summary/`` holds the
table (text) and ``glue/<task>`` scores.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

from lightning_cqk.checkpoint.reading import check_checkpoint, refuse_checkpoint_folder
from lightning_cqk.downstream.glue_table import render_table, summarise_seeds, write_glue_table
from lightning_cqk.downstream.glue_tasks import GLUE_TASKS, TaskDataMissing, get_task, load_task
from lightning_cqk.errors import MissingInputError
from lightning_cqk.files.resources import find_config
from lightning_cqk.run.directory import checkpoint_run, next_free_name

#: The GLUE task configs: `configs/glue/` of the working directory, else the copy shipped with the package.
GLUE_CONFIGS = "configs/glue"


def glue(
    checkpoint: str,
    tasks: list[str] | None = None,
    seeds: list[int] | None = None,
    max_steps: int = 60,
    batch_size: int = 16,
    data_dir: str | None = None,
    source: str = "auto",
    config_dir: str | None = None,
    output_dir: str | None = None,
    log_dir: str | None = None,
    max_eval_examples: int | None = 1000,
    accelerator: str = "auto",
    extra_args: list[str] | None = None,
) -> dict[str, Any]:
    """Fine-tune and evaluate a checkpoint on GLUE; write ``glue.json`` and ``glue.md``; return the table.

    Args:
        checkpoint: the pretrained LM's ``.ckpt``.
        tasks: task names (default: all nine; those without data are reported as skipped).
        seeds: fine-tuning seeds (default 1 2 3); each seed changes the head's init, dropout and the data order.
        max_steps: optimizer steps per run (CPU-sized default; the learning-rate schedule spans them).
        batch_size: training examples per step (CPU-sized default; the configs' own is 32).
        data_dir: the GLUE folder (one sub-folder per task); required unless ``source`` is ``hf``.
        source: ``auto``, ``files`` or ``hf`` (see ``GlueDataModule``).
        config_dir: folder with ``<task>.yaml`` (default: the repository's ``configs/glue``).
        output_dir: where ``glue.json``/``glue.md`` go (default: beside the checkpoint).
        log_dir: TensorBoard root for the runs (default: ``<checkpoint's run dir>/glue``).
        max_eval_examples: evaluate on at most this many examples per split (a fixed random subset, the same for
            every run and checkpoint; None: all).
            The default keeps CPU runs short (CoLA's dev has 1,043, STS-B's 1,500, QQP's and MNLI's more; the others
            fewer).
        accelerator: ``trainer.accelerator``.
        extra_args: more ``lightning_cqk fit`` flags for every run (e.g. ``["--model.pooling=mean"]``).
    """
    from lightning_cqk.cli.glue import GlueCLI  # Lightning: imported when fine-tuning, not for glue-table

    ckpt = Path(checkpoint)
    refuse_checkpoint_folder(ckpt)
    if not ckpt.is_file():
        raise MissingInputError(f"Checkpoint {ckpt} does not exist; give a .ckpt written by `lightning_cqk fit`.")
    check_checkpoint(ckpt)  # truncated, corrupt or untrusted: refused once, before any task runs
    if data_dir is None and source != "hf":
        raise ValueError(
            "glue needs the GLUE data: --data_dir /path/to/glue (one sub-folder per task: CoLA/, SST-2/, ...), or "
            "--source hf to download it with the `datasets` library."
        )
    names = [get_task(t).name for t in (tasks or list(GLUE_TASKS))]
    seeds = list(seeds or [1, 2, 3])
    configs = Path(config_dir) if config_dir else find_config(GLUE_CONFIGS)
    logs = Path(log_dir) if log_dir else (checkpoint_run(ckpt) or ckpt.parent) / "glue"
    out = Path(output_dir) if output_dir else ckpt.parent
    settings = {
        "max_steps": max_steps,
        "batch_size": batch_size,
        "data_dir": data_dir,
        "source": source,
        "max_eval_examples": max_eval_examples,
        "extra_args": list(extra_args or []),
    }
    table: dict[str, Any] = {
        "checkpoint": str(ckpt),
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "seeds": seeds,
        "settings": settings,
        "tasks": {},
    }
    for name in names:
        config = configs / f"{name}.yaml"
        if not config.is_file():
            raise FileNotFoundError(f"No config {config} for GLUE {name}; give config_dir with <task>.yaml files.")
        try:
            data = load_task(name, data_dir, source)
        except TaskDataMissing as err:
            table["tasks"][name] = {"status": "skipped", "reason": str(err).split(":")[0]}
            print(f"[glue] {name}: skipped ({err})", file=sys.stderr)
            continue
        per_seed = []
        for seed in seeds:
            args = [
                "--config",
                str(config),
                f"--model.checkpoint={ckpt}",
                f"--seed_everything={seed}",
                f"--data.source={source}",
                f"--data.seed={seed}",
                f"--trainer.max_steps={max_steps}",
                f"--data.batch_size={batch_size}",
                "--trainer.max_epochs=-1",  # the step budget alone ends a run
                f"--trainer.accelerator={accelerator}",
                f"--trainer.logger.init_args.save_dir={logs.parent}",
                f"--trainer.logger.init_args.name={logs.name}",
                f"--trainer.logger.init_args.version={next_free_name(logs, f'{name}-s{seed}')}",
                *settings["extra_args"],
            ]
            if data_dir is not None:
                args.append(f"--data.data_dir={data_dir}")
            if max_eval_examples is not None:
                args.append(f"--data.max_eval_examples={max_eval_examples}")
            print(f"[glue] {name} seed {seed}: lightning_cqk fit {' '.join(args)}", file=sys.stderr)
            per_seed.append(_fit_then_validate(GlueCLI, args))
        n_eval = {s: min(len(v), max_eval_examples or len(v)) for s, v in data.evals.items()}
        eval_note = "; ".join(
            f"{s}: {note}" + (f", fixed random {n_eval[s]} used" if n_eval[s] < len(data.evals[s]) else "")
            for s, note in data.eval_notes.items()
        )
        table["tasks"][name] = {
            "status": "ok",
            **summarise_seeds(per_seed),
            "train": data.provenance,
            "eval": eval_note,
            "heldout": data.heldout,
        }
        write_glue_table(table, out)  # after every task, so an interrupted run keeps what it finished
    json_path, md_path = write_glue_table(table, out)
    _log_summary(logs / "summary", json_path)
    print(render_table(json.loads(json_path.read_text())))
    print(f"\nwrote {json_path} and {md_path}; TensorBoard: tensorboard --logdir {logs}")
    return table


def _fit_then_validate(cli_class: Any, args: list[str]) -> dict[str, float]:
    """Train without validating (a fixed budget, nothing selected on dev), then validate once: the final metrics."""
    argv, sys.argv = sys.argv, sys.argv[:1]  # the `glue` command's own flags are not LightningCLI's
    try:
        cli = cli_class(args=[*args, "--trainer.limit_val_batches=0", "--trainer.num_sanity_val_steps=0"], run=False)
    finally:
        sys.argv = argv
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    cli.trainer.limit_val_batches = 1.0
    cli.trainer.validate(cli.model, datamodule=cli.datamodule, verbose=False)
    if getattr(cli, "run_directory", None) is not None:
        cli.run_directory.lock.release()  # this run is over: its directory is no longer in use
    if not cli.model.final_metrics:
        raise RuntimeError(f"No validation metrics after `lightning_cqk fit {' '.join(args)}`.")
    return dict(cli.model.final_metrics)


def _log_summary(directory: Path, json_path: Path) -> None:
    """The table as TensorBoard text and each task's score as a scalar ``glue/<task>`` (and ``glue/average``)."""
    from torch.utils.tensorboard import SummaryWriter

    table = json.loads(json_path.read_text())
    writer = SummaryWriter(str(directory))
    try:
        writer.add_text("glue/table", render_table(table), global_step=0)
        for name, entry in table["tasks"].items():
            if entry.get("status") == "ok":
                writer.add_scalar(f"glue/{name}", 100 * entry["score"], global_step=0)
                for metric, value in entry["metrics"].items():
                    writer.add_scalar(f"glue/{name}/{metric}", 100 * value["mean"], global_step=0)
        if table.get("average") is not None:
            writer.add_scalar("glue/average", 100 * table["average"], global_step=0)
    finally:
        writer.close()


def glue_command(argv: list[str]) -> None:
    """``lightning_cqk glue ...`` (jsonargparse over ``glue``)."""
    from jsonargparse import CLI

    CLI(glue, args=argv, prog="lightning_cqk glue", as_positional=False)


def glue_table_command(argv: list[str]) -> None:
    """``lightning_cqk glue-table <glue.json | checkpoint | dir>...``: the GLUE tables side by side."""
    import argparse

    from lightning_cqk.downstream.glue_table import side_by_side

    parser = argparse.ArgumentParser(prog="lightning_cqk glue-table", description=glue_table_command.__doc__)
    parser.add_argument("paths", nargs="+", help="glue.json files, checkpoints (their glue.json) or directories")
    parser.add_argument("--labels", nargs="*", default=None, help="column titles (default: run names)")
    args = parser.parse_args(argv)
    print(side_by_side(args.paths, args.labels))
