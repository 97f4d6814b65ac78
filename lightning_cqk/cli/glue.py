"""The LightningCLI of downstream fine-tuning: ``lightning_cqk glue fit|validate|test ...``, one GLUE task.

    lightning_cqk glue fit --config configs/glue/sst2.yaml --model.checkpoint runs/<exp>/<run>/checkpoints/last.ckpt

Why a second CLI: ``CQKCLI`` is built around ``LitLM`` and links the data's ``seq_len``/tokenizer into the model's
config, which only makes sense for language modelling. Here the direction is the other way round (the checkpoint
decides the tokenizer and the context length, and the data module takes them from the model at setup), and the one
link is ``data.task`` -> ``model.task``, so the head, loss and metrics always match the data. ``lightning_cqk fit`` with
such a config (a ``--config`` file's ``model.class_path`` in ``lightning_cqk.downstream``) is the same command:
``lightning_cqk.cli.main`` reads that from the config files it checks anyway, so the language model's ``fit`` never
imports this module.

Defaults: TensorBoard logs under ``runs/glue/<task>-<checkpoint run>-s<seed>[-N]/`` (named, suffixed and locked
by ``lightning_cqk/run/directory.py``: a new run never writes into an earlier one's directory), ``trainer.precision``
as for pre-training (bf16-mixed on a bf16 GPU, fp32 elsewhere), seed 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from lightning_cqk.checkpoint.reading import check_checkpoint, refuse_checkpoint_folder
from lightning_cqk.errors import ConfigError, MissingInputError
from lightning_cqk.run.directory import RunDirectory, checkpoint_run_name, is_husk, next_free_name
from lightning_cqk.run.launch_rank import is_rank_zero_launch
from lightning_cqk.run.outputs import refuse_outside_outputs


class GlueCLI(LightningCLI):
    """LightningCLI for `GlueClassifier` + `GlueDataModule` (or subclasses), linked by the task name."""

    def __init__(self, args: list[str] | None = None, run: bool = True, **kwargs: Any) -> None:
        from lightning_cqk.cli import class_paths
        from lightning_cqk.downstream.classifier import GlueClassifier
        from lightning_cqk.downstream.glue_data import GlueDataModule

        class_paths.install()  # values typed Any stay data; class paths only from the allow-list
        self.run_directory: RunDirectory | None = None
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("seed_everything_default", 1)
        super().__init__(
            GlueClassifier,
            GlueDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            auto_configure_optimizers=False,
            args=args,
            run=run,
            **kwargs,
        )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.set_defaults(
            {
                "trainer.logger": {
                    "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                    "init_args": {"save_dir": "runs", "name": "glue", "default_hp_metric": False},
                }
            }
        )
        parser.link_arguments("data.init_args.task", "model.init_args.task", apply_on="parse")

    def before_instantiate_classes(self) -> None:
        from lightning_cqk.run.preflight import auto_precision, is_tensorboard

        config = self.config[self.subcommand] if self.subcommand else self.config
        trainer = config.trainer
        if trainer.get("precision") is None:
            trainer.precision = auto_precision(trainer.get("accelerator"))
        checkpoint = config.model.init_args.get("checkpoint")
        if not checkpoint:
            raise ConfigError(
                "Give the pretrained LM checkpoint: --model.checkpoint runs/<experiment>/<run>/checkpoints/last.ckpt"
            )
        refuse_checkpoint_folder(checkpoint)
        if not Path(checkpoint).is_file():
            raise MissingInputError(
                f"--model.checkpoint {checkpoint} does not exist. Give a .ckpt written by `lightning_cqk fit`, e.g. "
                "runs/<experiment>/<run>/checkpoints/last.ckpt."
            )
        # Refused here, by name: inside the model's constructor jsonargparse would bury the message in its own.
        check_checkpoint(checkpoint)
        logger = trainer.get("logger")
        if not is_tensorboard(logger):
            refuse_outside_outputs(trainer, None)  # no run directory: no callback may name a folder of its own
            return
        args = logger.init_args
        root = Path(args.get("save_dir") or "runs") / str(args.get("name") or "glue")
        if args.get("version") is None:  # a new run never writes into an earlier one's directory (run/directory.py)
            task = config.data.init_args.task
            args.version = next_free_name(root, f"{task}-{checkpoint_run_name(checkpoint)}-s{config.seed_everything}")
        elif self.subcommand == "fit" and (root / args.version).exists() and not is_husk(root / args.version):
            raise ConfigError(
                f"{root / args.version} already holds a run; a new fine-tuning run must not write into it. Choose "
                "another --trainer.logger.init_args.version, or leave it unset for a fresh name."
            )
        refuse_outside_outputs(trainer, root / args.version)  # callbacks write inside this run only (run/outputs.py)
        if self.subcommand == "fit" and is_rank_zero_launch():
            self.run_directory = RunDirectory.claim(root / args.version)  # one live process per run directory

    def instantiate_trainer(self, **kwargs: Any) -> Any:
        from lightning.pytorch.plugins.io import TorchCheckpointIO

        from lightning_cqk.callbacks.progress import use_line_progress
        from lightning_cqk.callbacks.run_checkpoint import AtomicCheckpointIO
        from lightning_cqk.run import slurm_preemption as slurm

        trainer = super().instantiate_trainer(**kwargs)
        slurm.take_over(trainer)  # no hpc_ckpt_* written or restored (run/slurm_preemption.py)
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:  # atomic saves; weights_only, clear errors
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()
        sub = self.subcommand
        use_line_progress(trainer, (self.config[sub] if sub else self.config).trainer.get("callbacks"))
        return trainer
