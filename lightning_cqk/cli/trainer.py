"""`fit`, `validate`, `test`, `predict`: `CQKCLI`, the LightningCLI of this framework (see `lightning_cqk.cli`).

Imported only when a trainer subcommand runs, so that `lightning_cqk --help`, `attention`, `sweep` and `report`
answer without importing Lightning (`lightning_cqk.cli` is the light entry point).
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("LITDATA_DISABLE_VERSION_CHECK", "1")  # litdata would otherwise ping PyPI (offline runs)

import torch  # noqa: E402
import yaml  # noqa: E402
from jsonargparse import Namespace  # noqa: E402
from lightning.pytorch import LightningDataModule, Trainer  # noqa: E402
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI  # noqa: E402
from lightning.pytorch.loggers import TensorBoardLogger  # noqa: E402
from lightning.pytorch.plugins.io import TorchCheckpointIO  # noqa: E402

from lightning_cqk.attention.registry import check_recorded  # noqa: E402
from lightning_cqk.callbacks import FinalValidation, RunSummary, TokenBudget  # noqa: E402
from lightning_cqk.callbacks.data_guard import DataFolderGuard  # noqa: E402
from lightning_cqk.callbacks.model_summary import without_flops_column  # noqa: E402
from lightning_cqk.callbacks.progress import use_line_progress  # noqa: E402
from lightning_cqk.callbacks.run_checkpoint import AtomicCheckpointIO  # noqa: E402
from lightning_cqk.callbacks.run_length import RunLengthCheck, limit_hours_from_env  # noqa: E402
from lightning_cqk.callbacks.run_session import RunSession  # noqa: E402
from lightning_cqk.callbacks.tensorboard import TensorBoardLogger as CQKTensorBoardLogger  # noqa: E402
from lightning_cqk.callbacks.tensorboard import layout_for  # noqa: E402
from lightning_cqk.checkpoint.reading import CorruptCheckpointError, load_checkpoint  # noqa: E402
from lightning_cqk.cli import class_paths, slurm  # noqa: E402
from lightning_cqk.cli.presets import PresetArgumentParser, unset_shape_defaults  # noqa: E402
from lightning_cqk.cli.strategy import refuse_folder_without_fsdp2, resolve_strategy  # noqa: E402
from lightning_cqk.errors import ConfigError  # noqa: E402
from lightning_cqk.model_config import size_label, upgrade_config_dict, upgrade_run_config  # noqa: E402
from lightning_cqk.module import LitLM  # noqa: E402
from lightning_cqk.run.directory import (  # noqa: E402
    FAILED,
    FINISHED,
    INTERRUPTED,
    OPTIMIZER_KEYS,
    FitPlan,
    ResumeRefused,
    RunDirectory,
    base_run_name,
    changed_settings,
    check_run_name_part,
    checkpoint_run,
    classify_changes,
    command_line,
    describe_changes,
    next_free_name,
    numbered_dirs,
    policy_table,
    resolve_fit,
    resumable_checkpoint,
)
from lightning_cqk.run.launch_rank import detect_launch, publish_failure, publish_plan, receive_plan  # noqa: E402
from lightning_cqk.run.outputs import refuse_outside_outputs  # noqa: E402


def _vocab_size_of(datamodule: LightningDataModule) -> int:
    return datamodule.vocab_size


class CQKCLI(LightningCLI):
    """LightningCLI with the links, defaults and run-directory handling of this framework (`run/directory.py`)."""

    def __init__(self, args: list[str] | None = None, run: bool = True, **kwargs: Any) -> None:
        class_paths.install()  # values typed Any stay data; class paths only from the allow-list
        self._argv = list(sys.argv[1:] if args is None else args)
        self.run_directory: RunDirectory | None = None
        self.run_plan: FitPlan | None = None
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

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.set_defaults({"data": {"class_path": "lightning_cqk.data.TokenDataModule"}})
        parser.set_defaults(
            {
                "trainer.logger": {
                    "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                    "init_args": {"save_dir": "runs", "name": "default", "default_hp_metric": False},
                }
            }
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
        parser.link_arguments("data", "model.config.vocab_size", compute_fn=_vocab_size_of, apply_on="instantiate")

    def _parse_ckpt_path(self) -> None:
        """Replaced by `_merge_checkpoint_hparams`, run once the checkpoint file is known (`last` resolved)."""

    def before_instantiate_classes(self) -> None:
        sub = self.subcommand
        config = self.config[sub] if sub else self.config
        attention_name = config.get("model.config.attention")
        if isinstance(attention_name, str):  # a recipe's name (gqa) gets a pointer to its config file
            from lightning_cqk.contract.backends_table import check_backend_name

            check_backend_name(attention_name)
        logger = config.trainer.get("logger")
        ckpt = config.get("ckpt_path")
        if is_tensorboard(logger):  # before anything is created: a run directory never leaves save_dir
            check_run_name_part(logger.init_args.get("name"), "--trainer.logger.init_args.name")
            check_run_name_part(logger.init_args.get("version"), "--trainer.logger.init_args.version")
        if sub == "fit" and is_tensorboard(logger):
            self._plan_fit()  # ResumeRefused / RunDirectoryInUse: `main` prints them without a traceback
        elif sub is not None and ckpt and Path(ckpt).exists():
            self._merge_checkpoint_hparams(ckpt)
        config = self.config[sub] if sub else self.config
        trainer = config.trainer
        if sub == "fit" and is_tensorboard(trainer.get("logger")):  # no epoch chart, the curves to read first
            trainer.logger.class_path = "lightning_cqk.callbacks.tensorboard.TensorBoardLogger"
        if trainer.get("precision") is None:
            trainer.precision = auto_precision(trainer.get("accelerator"))
        strategy = resolve_strategy(trainer.get("strategy"))  # `--trainer.strategy ModelParallelStrategy` (FSDP2)
        if isinstance(strategy, dict):
            trainer.strategy = Namespace(
                class_path=strategy["class_path"], init_args=Namespace(**strategy["init_args"])
            )
        refuse_folder_without_fsdp2(config.get("ckpt_path"), trainer.get("strategy"), sub)
        budget = config.get("budget")
        if sub == "fit" and budget is not None and any(budget.get(k) is not None for k in BUDGET_LIMITS):
            # The budget sets max_steps once the Trainer exists: Lightning's "`max_epochs` was not set. Setting it
            # to 1000 epochs" (max_steps -1 at construction) does not describe this run, which stops at its budget.
            warnings.filterwarnings("ignore", message=r"`max_epochs` was not set\. Setting it to 1000 epochs")
        logger = trainer.get("logger")
        if is_tensorboard(logger) and logger.init_args.get("version") is None:  # validate / test / predict
            owner = checkpoint_run(config.get("ckpt_path"))
            if owner is not None:  # evaluate beside the training curves of the run the checkpoint belongs to
                args = logger.init_args
                args.save_dir, args.name, args.version = str(owner.parent.parent), owner.parent.name, owner.name
            else:
                logger.init_args.version = _run_name(config, logger.init_args, resuming=bool(config.get("ckpt_path")))
        if not (sub == "fit" and is_tensorboard(logger)):  # a planned fit is checked in _make_plan, before its claim
            refuse_outside_outputs(trainer, _logger_run_dir(logger))

    # --------------------------------------------------------------------------------------- fit: the run
    def _plan_fit(self) -> None:
        """Decide the run directory and checkpoint (run_dir.resolve_fit), check the resume, lock the directory."""
        config = self.config.fit
        args = config.trainer.logger.init_args
        root = Path(args.get("save_dir") or "runs") / str(args.get("name") or "default")
        launch = detect_launch()
        if not launch.is_zero:  # rank zero alone plans, checks and locks; the others take its plan (run/launch_rank.py)
            return self._follow_plan(receive_plan(launch, root, log=lambda m: print(m, file=sys.stderr, flush=True)))
        try:
            apply_optimizer = self._make_plan(root)
        except BaseException as err:
            publish_failure(launch, root, f"{type(err).__name__}: {err}")  # the other ranks stop with this message
            raise
        plan = self.run_plan
        publish_plan(
            launch,
            root,
            {"run_dir": str(plan.run_dir), "ckpt_path": plan.ckpt_path, "apply_optimizer": apply_optimizer},
        )

    def _make_plan(self, root: Path) -> bool:
        """Rank zero: resolve, check and lock the run; returns whether the resume changes the optimizer settings."""
        config = self.config.fit
        args = config.trainer.logger.init_args
        model_cfg = config.model.config
        base = base_run_name(model_cfg.attention, _model_size(model_cfg), config.seed_everything)
        self.run_plan = resolve_fit(
            root, base, args.get("version"), config.get("ckpt_path"), config.get("on_unfinished"), self._argv
        )
        plan = self.run_plan
        changes: dict[str, tuple[Any, Any]] = {}
        if plan.ckpt_path is not None:
            changes.update(self._merge_checkpoint_hparams(plan.ckpt_path))
            config = self.config.fit
        args = config.trainer.logger.init_args
        args.save_dir, args.name, args.version = (
            str(plan.run_dir.parent.parent),
            plan.run_dir.parent.name,
            plan.run_dir.name,
        )
        config.ckpt_path = plan.ckpt_path
        if config.trainer.get("precision") is None:
            config.trainer.precision = auto_precision(config.trainer.get("accelerator"))
        parser = self._parser("fit")
        config_text = parser.dump(config, skip_none=False)
        previous = plan.previous_config
        if previous is not None:
            before = upgrade_run_config(yaml.safe_load(previous.read_text()) or {})  # older versions' field names
            changes.update(changed_settings(before, upgrade_run_config(yaml.safe_load(config_text))))
        allowed, refused = classify_changes(changes)
        if refused:
            raise ResumeRefused(self._refusal(plan, refused, previous))
        if plan.auto_resumed and allowed:
            raise ResumeRefused(
                f"{plan.run_dir} is an unfinished run of this name, and this command changes its settings "
                f"({describe_changes(allowed)}). To continue it with these changes: "
                f"{command_line(self._argv, drop=('--ckpt_path', '--on_unfinished'), add=('--ckpt_path', 'last'))}\n"
                "To start a new run beside it: "
                f"{command_line(self._argv, drop=('--on_unfinished',), add=('--on_unfinished', 'new'))}"
            )
        # Every callback, logger and profiler writes inside this run's directory (run/outputs.py), checked before
        # the directory is claimed or anything built.
        refuse_outside_outputs(config.trainer, plan.run_dir)
        for note in plan.notes:
            print(f"run: {note}", file=sys.stderr, flush=True)
        # One live process per run directory, checked before anything is built (lightning_cqk/run/lock.py).
        self.run_directory = RunDirectory.claim(plan.run_dir)
        atexit.register(self._abandon_if_not_started)
        apply_optimizer = any(k in OPTIMIZER_KEYS for k in allowed)
        self._session = RunSession(
            self.run_directory,
            config_text,
            resumed_from=plan.ckpt_path,
            changes=allowed,
            apply_optimizer=apply_optimizer,
            notes=plan.notes,
        )
        return apply_optimizer

    def _follow_plan(self, shared: dict[str, Any]) -> None:
        """A rank other than zero: the run directory and checkpoint rank zero chose (the same model, the same state)."""
        ckpt = shared.get("ckpt_path") or None
        self.run_plan = FitPlan(Path(shared["run_dir"]), ckpt, ckpt is not None)
        if ckpt is not None:
            self._merge_checkpoint_hparams(ckpt)  # the same settings as rank zero's (checked there)
        config = self.config.fit
        args = config.trainer.logger.init_args
        run_dir = self.run_plan.run_dir
        args.save_dir, args.name, args.version = str(run_dir.parent.parent), run_dir.parent.name, run_dir.name
        config.ckpt_path = ckpt
        if config.trainer.get("precision") is None:
            config.trainer.precision = auto_precision(config.trainer.get("accelerator"))
        config_text = self._parser("fit").dump(config, skip_none=False)
        self._session = RunSession(
            None, config_text, resumed_from=ckpt, apply_optimizer=bool(shared.get("apply_optimizer"))
        )

    def _refusal(self, plan: FitPlan, refused: dict, previous: Path | None) -> str:
        keys = ", ".join(refused)
        flags = " ".join(f"--{k}" for k in refused)
        where = f"its last attempt's configuration, {previous}" if previous else f"the checkpoint {plan.ckpt_path}"
        fix = (
            f"To resume it as it was: lightning_cqk fit --config {previous} --ckpt_path last"
            if previous
            else f"To resume it as it was, drop {flags} (and any config file setting them): the checkpoint's values "
            "are used"
        )
        return (
            f"Resuming {plan.run_dir} with settings that a resume cannot change ({describe_changes(refused)}; "
            f"compared with {where}). A resumed run must stay the same experiment: {keys} would not be (or could "
            f"not be) applied to the restored state. {fix}. To train with the new settings, start a new run: drop "
            "--ckpt_path (with --on_unfinished new when an unfinished run of this name exists).\n" + policy_table()
        )

    def _merge_checkpoint_hparams(self, ckpt: str) -> dict[str, tuple[Any, Any]]:
        """Take the model's settings from the checkpoint, keeping the ones the command line or a config file sets.

        Lightning's own `_parse_ckpt_path` puts the checkpoint's hyper-parameters over the whole command line; here
        they are the defaults (inserted right after the subcommand, so every `--config` file and flag wins) and every
        explicit value that differs from the checkpoint is returned as a change (fit) or refused (the architecture,
        for evaluation too). Returns {setting: (checkpoint's, this run's)}.
        """
        sub = self.subcommand
        try:  # an untrusted file is refused here, before anything is built (UntrustedCheckpointError)
            hparams = load_checkpoint(ckpt, verify=False).get("hyper_parameters") or {}
        except (CorruptCheckpointError, OSError, AttributeError):  # named when it is loaded for real (CRCs checked)
            return {}
        hparams = {k: v for k, v in hparams.items() if k in ("config", "optim", "compile")}
        try:  # data, never code: a class_path anywhere in them is refused before the parser sees them
            class_paths.refuse_class_specs(hparams, f"The checkpoint {ckpt}")
        except class_paths.PlainDataError as err:
            sys.exit(f"lightning_cqk {sub}: {err}")
        if isinstance(hparams.get("config"), dict):  # a checkpoint of an older version: today's field names
            hparams["config"] = upgrade_config_dict(hparams["config"])
            typed = (self.config[sub] if sub else self.config).get("model.config")
            try:  # a plugin it names is imported only when installed or trusted, or typed again now
                check_recorded(hparams["config"], f"The checkpoint {ckpt}", typed)
            except ConfigError as err:
                sys.exit(f"lightning_cqk {sub}: {err}")
        if not hparams or sub not in self._argv:
            return {}
        at = self._argv.index(sub) + 1
        try:
            self.config = self.parser.parse_args([*self._argv[:at], f"--model={json.dumps(hparams)}", *self._argv[at:]])
        except SystemExit:  # settings this version does not know: the command line alone builds the model, and the
            print(  # checkpoint's architecture is still checked field by field when its weights load
                f"note: the settings saved in {ckpt} do not parse with this version; the command line's are used.",
                file=sys.stderr,
            )
            return {}
        model = self.config[sub].model
        now_ = {k: model[k].as_dict() if hasattr(model[k], "as_dict") else model[k] for k in hparams}
        if isinstance(now_.get("config"), dict):  # compared in today's field names, as the checkpoint's are
            now_["config"] = upgrade_config_dict(now_["config"])
        changes = changed_settings({"model": hparams}, {"model": now_})
        for linked in ("model.config.vocab_size", "model.config.block_size"):  # checked when the weights load
            changes.pop(linked, None)
        if sub != "fit":
            arch = {k: v for k, v in changes.items() if k.startswith("model.config.") and k != "model.config.dropout"}
            if arch:
                sys.exit(
                    f"lightning_cqk {sub}: the checkpoint {ckpt} holds another model than this command asks for "
                    f"({describe_changes(arch)}). Drop {' '.join('--' + k for k in arch)} (and any config file "
                    "setting them): the checkpoint's own settings are used."
                )
        return changes

    def _abandon_if_not_started(self) -> None:
        if self.run_directory is not None:
            self.run_directory.abandon(log=lambda m: print(m, file=sys.stderr))

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        if self._session is not None:
            self.save_config_callback = None  # RunSession keeps the configuration, once training has started
        elif self.subcommand in ("validate", "test", "predict"):
            self.save_config_kwargs = {**self.save_config_kwargs, "config_filename": f"config.{self.subcommand}.yaml"}
        trainer = super().instantiate_trainer(**kwargs)
        slurm.take_over(trainer)  # Lightning's SLURM requeue never writes nor restores hpc_ckpt_* (cli/slurm.py)
        strays = slurm.stray_hpc_checkpoints(trainer.default_root_dir, os.getcwd())
        if strays and trainer.is_global_zero:
            print(slurm.stray_note(strays), file=sys.stderr)
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:  # atomic, fsynced, clear errors on load
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()
        if not any(isinstance(cb, RunSummary) for cb in trainer.callbacks):
            trainer.callbacks.insert(0, RunSummary())  # first: it records a validation before a checkpoint saves
        if self.subcommand == "fit" and not any(isinstance(cb, FinalValidation) for cb in trainer.callbacks):
            trainer.callbacks.insert(0, FinalValidation())  # the last step validated, before a checkpoint saves it
        if self._session is not None:
            trainer.callbacks.append(self._session)
        if self.subcommand == "fit" and not any(isinstance(cb, DataFolderGuard) for cb in trainer.callbacks):
            trainer.callbacks.append(DataFolderGuard())  # after RunSession: a refused resume is a recorded attempt
        without_flops_column(trainer.callbacks)  # Lightning's FLOPs column reads 0 for LitLM (model_summary.py)
        for logger in trainer.loggers:  # TensorBoard's Custom Scalars: only the charts this run's callbacks log
            if isinstance(logger, CQKTensorBoardLogger):
                logger.layout = layout_for(trainer.callbacks)
        if self.subcommand == "fit" and not any(isinstance(cb, RunLengthCheck) for cb in trainer.callbacks):
            trainer.callbacks.append(RunLengthCheck(limit_hours_from_env(), advice=self._long_run_advice))
        sub = self.subcommand
        use_line_progress(trainer, (self.config[sub] if sub else self.config).trainer.get("callbacks"))
        return trainer

    def _long_run_advice(self) -> str:
        """What a run that would train for days here can do instead: the same command on GPUs, or at CPU size."""
        data = self.config.fit.data
        init = data.get("init_args", data) if hasattr(data, "get") else {}
        corpus = init.get("corpus") if hasattr(init, "get") else None
        stem = str(corpus) if corpus else Path(str(init.get("data_dir") or "data")).name.split("-")[0] or "data"
        gpu_flags = ("--trainer.devices", "--trainer.strategy", "--trainer.accelerator", "--ckpt_path")
        gpu = command_line(self._argv, drop=gpu_flags, add=("--trainer.devices", "8", "--trainer.strategy", "ddp"))
        cpu_size = dict(CPU_SIZE, **{"--data.data_dir": f"data/{stem}-bytes-cpu"})
        cpu = command_line(
            self._argv, drop=(*cpu_size, "--ckpt_path"), add=tuple(x for kv in cpu_size.items() for x in kv)
        )
        return (
            "Ctrl-C stops it (saved at the end of the step in progress). On a node with 8 GPUs (docs/scaling-out.md "
            f"for SLURM and several nodes): torchrun --standalone --nproc_per_node 8 -m {gpu}. At CPU size, the same "
            "recipe with a small shape, bytes and 200 steps (docs/configs-and-data.md#a-paper-config-at-cpu-size): "
            f"{cpu}."
        )

    def before_fit(self) -> None:
        """Before shards are prepared or a step is taken: refuse a run that will not fit in memory
        (run/memory_check.py)."""
        from lightning_cqk.run.memory_check import check_memory

        fit = self.config.fit
        resuming = bool(fit.get("ckpt_path"))  # the advice then names only what a resume may change
        check_memory(self.model, self.datamodule, self.trainer, fit.get("memory_check", "refuse"), resuming=resuming)

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
            self._end_interrupted(signal_name, saved=True)
            if signal_name == slurm.REQUEUE_SIGNAL_NAME:  # `#SBATCH --signal=SIGUSR1@90`: saved, now requeue the job
                print(slurm.requeue_job(), file=sys.stderr, flush=True)
            sys.exit({"SIGINT": 130, "SIGUSR1": 138}.get(signal_name, 143))
        except SystemExit as err:  # Lightning's answer to a second Ctrl-C (KeyboardInterrupt): exit 1, no save
            if run.started():
                self._end_interrupted("SIGINT (twice: stopped at once)", saved=False)
            raise err
        except BaseException as err:
            if run.started():
                run.end_attempt(status=FAILED, step=self.trainer.global_step, error=f"{type(err).__name__}: {err}")
            raise
        else:
            if run.started():
                run.end_attempt(status=FINISHED, step=self.trainer.global_step)

    def _end_interrupted(self, signal_name: str, saved: bool) -> None:
        run = self.run_directory
        ckpt, note = resumable_checkpoint(run.path)
        if ckpt is None and self.trainer.global_step == 0 and run.created:
            return self._end_before_first_step(signal_name)
        run.end_attempt(status=INTERRUPTED, signal=signal_name, step=self.trainer.global_step, checkpoint=str(ckpt))
        resume = command_line(self._argv, drop=("--ckpt_path", "--on_unfinished"), add=("--ckpt_path", "last"))
        if self.config.fit.trainer.logger.init_args.get("version") and "init_args.version" not in " ".join(self._argv):
            resume += f" --trainer.logger.init_args.version={run.path.name}"
        state = f"saved {ckpt}" if ckpt else "no checkpoint to resume from"
        print(
            f"\nrun: {run.path} interrupted by {signal_name} at step {self.trainer.global_step} ({state}"
            f"{'; ' + note if note else ''}). Resume with:\n  {resume}",
            file=sys.stderr,
            flush=True,
        )

    def _end_before_first_step(self, signal_name: str) -> None:
        """Stopped before the first optimizer step: nothing to resume. Remove the directory this launch created (it
        would show as an empty run in TensorBoard and make a pasted `--ckpt_path last` refuse) and say how to start."""
        run = self.run_directory
        removed = run.discard(log=lambda m: None)
        where = f"{run.path} is removed" if removed else f"{run.path} is left as it was (another launch holds it)"
        print(
            f"\nrun: stopped by {signal_name} before its first optimizer step; nothing was trained or saved, and "
            f"{where}. Start it again with:\n  {command_line(self._argv)}",
            file=sys.stderr,
            flush=True,
        )


#: The shape, data and length flags that shrink a recipe to a CPU (docs/configs-and-data.md, "A paper config at CPU
#: size"); every other setting of the recipe stays. `--data.data_dir` is added per run (the bytes shards' folder).
CPU_SIZE = {
    "--model.config.n_layer": "2",
    "--model.config.n_embd": "64",
    "--model.config.n_head": "4",
    "--model.config.mlp_hidden": "256",
    "--data.tokenizer": "bytes",
    "--data.seq_len": "128",
    "--data.batch_size": "8",
    "--budget.tokens": "null",
    "--trainer.max_steps": "200",
    "--model.optim.warmup_steps": "20",
    "--trainer.accumulate_grad_batches": "1",
    "--trainer.val_check_interval": "100",
    "--trainer.limit_val_batches": "8",
    "--trainer.accelerator": "cpu",
}

BUDGET_LIMITS = ("tokens", "flops", "wallclock", "match_to")  # a `budget:` that sets the run's length

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


def _logger_run_dir(logger: Any) -> Path | None:
    """The run directory of a command whose logger is the run's TensorBoard logger (save_dir/name/version), or None."""
    if not is_tensorboard(logger) or logger.init_args.get("version") is None:
        return None
    args = logger.init_args
    return Path(args.get("save_dir") or "runs") / str(args.get("name") or "default") / str(args.get("version"))


def is_tensorboard(logger: Any) -> bool:
    class_path = getattr(logger, "class_path", None) if logger is not None else None
    return class_path is not None and class_path.rsplit(".", 1)[-1] == TensorBoardLogger.__name__


def auto_precision(accelerator: Any) -> str:
    """bf16-mixed where a bf16-capable GPU will be used, fp32 otherwise."""
    wants_gpu = accelerator in (None, "auto", "gpu", "cuda")
    if wants_gpu and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "bf16-mixed"
    return "32-true"


def _model_size(model_cfg: Any) -> str:
    """The size part of a run name: the preset, plus any shape field set against it (`config.size_label`)."""
    shape = {key: model_cfg.get(key) for key in ("n_layer", "n_head", "n_embd", "mlp_hidden")}
    return size_label(model_cfg.preset, **shape)


def _run_name(config: Any, logger_args: Any, resuming: bool) -> str:
    """validate / test / predict: the newest run directory of this name when a checkpoint is given, else a new one.

    (`fit` decides with `run_dir.resolve_fit`.)
    """
    model_cfg = config.model.config
    base = base_run_name(model_cfg.attention, _model_size(model_cfg), config.seed_everything)
    root = Path(logger_args.get("save_dir") or "runs") / str(logger_args.get("name") or "default")
    existing = numbered_dirs(root, base)
    if resuming and existing:
        return existing[-1].name
    return next_free_name(root, base)
