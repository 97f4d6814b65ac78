"""`fit`, `validate`, `test`, `predict`: `CQKCLI`, the LightningCLI of this framework (see `lightning_cqk.cli`).

Imported only when a trainer subcommand runs, so that `lightning_cqk --help`, `attention`, `sweep` and `report`
answer without importing Lightning (`lightning_cqk.cli` is the light entry point). `CQKCLI` keeps Lightning's hooks
only: everything decided before anything is built is the run's preflight (`run/preflight.py`, called once), the
callbacks every run gets are `callbacks/run_stack.py`'s, and how a stopped attempt ends is `run/attempt.py`'s.
"""

from __future__ import annotations

import os
import sys
from operator import attrgetter
from typing import Any

os.environ.setdefault("LITDATA_DISABLE_VERSION_CHECK", "1")  # litdata would otherwise ping PyPI (offline runs)

from lightning.pytorch import LightningDataModule, Trainer  # noqa: E402
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI  # noqa: E402

from lightning_cqk.callbacks import TokenBudget  # noqa: E402
from lightning_cqk.callbacks.run_length import long_run_advice  # noqa: E402
from lightning_cqk.callbacks.run_session import RunSession  # noqa: E402
from lightning_cqk.callbacks.run_stack import add_run_callbacks  # noqa: E402
from lightning_cqk.cli import class_paths  # noqa: E402
from lightning_cqk.cli.checkpoint_settings import merge_checkpoint_settings  # noqa: E402
from lightning_cqk.cli.presets import PresetArgumentParser, unset_shape_defaults  # noqa: E402
from lightning_cqk.module import LitLM  # noqa: E402
from lightning_cqk.run.attempt import end_interrupted  # noqa: E402
from lightning_cqk.run.directory import FAILED, FINISHED, RunDirectory  # noqa: E402
from lightning_cqk.run.preflight import Inputs, RunPlan, check_memory_before_fit, preflight  # noqa: E402
from lightning_cqk.run.slurm_preemption import REQUEUE_SIGNAL_NAME, requeue_job  # noqa: E402


class CQKCLI(LightningCLI):
    """LightningCLI with the links and defaults of this framework; a run's preflight decides the rest."""

    def __init__(self, args: list[str] | None = None, run: bool = True, **kwargs: Any) -> None:
        class_paths.install()  # values typed Any stay data; class paths only from the allow-list
        self._argv = list(sys.argv[1:] if args is None else args)
        self.plan = RunPlan()
        self._session: RunSession | None = None
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("seed_everything_default", 1337)
        kwargs.setdefault("parser_class", PresetArgumentParser)
        super().__init__(
            LitLM,
            LightningDataModule,
            subclass_mode_data=True,
            auto_configure_optimizers=False,
            args=args,
            run=run,
            **kwargs,
        )

    @property
    def run_directory(self) -> RunDirectory | None:
        """The run directory this process claimed (rank zero of a fit), else None."""
        return self.plan.directory

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.set_defaults({"data": {"class_path": "lightning_cqk.data.TokenDataModule"}})
        logger = {"save_dir": "runs", "name": "default", "default_hp_metric": False}
        parser.set_defaults(
            {"trainer.logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger", "init_args": logger}}
        )
        parser.add_argument(
            "--on_unfinished",
            type=str,
            default="resume",
            help="fit without --ckpt_path when the newest run of this name is unfinished and has a checkpoint: "
            "resume it (when the settings are unchanged; else refuse with the exact commands), new (a new run "
            "beside it) or refuse (docs/reliability.md).",
        )
        parser.add_argument(
            "--memory_check",
            type=str,
            default="refuse",
            help="fit: refuse (default), warn about, or not check (off) a configuration whose analytic memory "
            "estimate exceeds the memory of its device, before anything is prepared "
            "(lightning_cqk/run/memory_check.py).",
        )
        # Always present, a no-op unless a budget is set: `--budget.tokens 1e6`, `--budget.match_to <run dir>`.
        parser.add_lightning_class_args(TokenBudget, "budget")
        parser.set_defaults(unset_shape_defaults())  # shape fields left unset come from the preset (cli/presets.py)
        _count_or_fraction_first_int(parser)
        parser.link_arguments("data.init_args.seq_len", "model.config.block_size", apply_on="parse")
        parser.link_arguments(
            "data", "model.config.vocab_size", compute_fn=attrgetter("vocab_size"), apply_on="instantiate"
        )

    def _parse_ckpt_path(self) -> None:
        """Replaced by the preflight's merge of the checkpoint's settings, once the checkpoint is known."""

    def _settings(self) -> Any:
        return self.config[self.subcommand] if self.subcommand else self.config

    def _merge_checkpoint(self, ckpt: str) -> dict[str, tuple[Any, Any]]:
        merged, changes = merge_checkpoint_settings(self.parser, self.config, self._argv, self.subcommand, ckpt)
        if merged is not None:
            self.config = merged
        return changes

    def before_instantiate_classes(self) -> None:
        dump = lambda config: self._parser("fit").dump(config, skip_none=False)  # noqa: E731
        self.plan = preflight(Inputs(self.subcommand, self._argv, self._settings, self._merge_checkpoint, dump))

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        if self.plan.config_text is not None:
            self.save_config_callback = None  # RunSession keeps the configuration, once training has started
        elif self.subcommand in ("validate", "test", "predict"):
            self.save_config_kwargs = {**self.save_config_kwargs, "config_filename": f"config.{self.subcommand}.yaml"}
        trainer = super().instantiate_trainer(**kwargs)
        advice = lambda: long_run_advice(self._argv, self.config.fit.data)  # noqa: E731
        callbacks = self._settings().trainer.get("callbacks")
        self._session = add_run_callbacks(trainer, self.subcommand, self.plan, advice, callbacks)
        return trainer

    def before_fit(self) -> None:
        """Before shards are prepared or a step is taken: refuse a run that will not fit in memory
        (run/memory_check.py)."""
        check_memory_before_fit(self.model, self.datamodule, self.trainer, self.config.fit)

    def _run_subcommand(self, subcommand: str) -> None:
        """`fit`: record how the attempt ended in run.json, and after a signal say how to resume."""
        run = self.run_directory
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        if subcommand == "fit" and run is None and self._session is not None:  # a rank other than zero
            try:
                return super()._run_subcommand(subcommand)
            except SIGTERMException:  # rank zero saved, records and prints how to resume
                sys.exit(143)
        if subcommand != "fit" or run is None:
            return super()._run_subcommand(subcommand)
        try:
            super()._run_subcommand(subcommand)
        except SIGTERMException:
            signal_name = (self._session.signal_name if self._session else None) or "SIGTERM"
            self._end_interrupted(signal_name)
            if signal_name == REQUEUE_SIGNAL_NAME:  # `#SBATCH --signal=SIGUSR1@90`: saved, now requeue the job
                print(requeue_job(), file=sys.stderr, flush=True)
            sys.exit({"SIGINT": 130, "SIGUSR1": 138}.get(signal_name, 143))
        except SystemExit as err:  # Lightning's answer to a second Ctrl-C (KeyboardInterrupt): exit 1, no save
            if run.started():
                self._end_interrupted("SIGINT (twice: stopped at once)")
            raise err
        except BaseException as err:
            if run.started():
                run.end_attempt(status=FAILED, step=self.trainer.global_step, error=f"{type(err).__name__}: {err}")
            raise
        else:
            if run.started():
                run.end_attempt(status=FINISHED, step=self.trainer.global_step)

    def _end_interrupted(self, signal_name: str) -> None:
        version = self.config.fit.trainer.logger.init_args.get("version")
        end_interrupted(self.run_directory, self.trainer.global_step, self._argv, version, signal_name)


_COUNT_OR_FRACTION = ("limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches")


def _count_or_fraction_first_int(parser: LightningArgumentParser) -> None:
    """Make `--trainer.limit_val_batches 1` mean one batch, as Lightning documents (int = count, float = fraction).

    The Trainer annotates these `Optional[Union[int, float]]`, but `typing` caches unions regardless of order, so the
    parser may receive `Union[float, int]` and turn 1 into 1.0 (= all batches). A `types.UnionType` is not cached
    with them and keeps int first.
    """
    for action in parser._actions:
        if action.dest.rsplit(".", 1)[-1] in _COUNT_OR_FRACTION and hasattr(action, "_typehint"):
            action._typehint = int | float | None
