"""The `lightning_cqk` command line.

    lightning_cqk fit --config configs/quickstart.yaml [--model.config.attention standard] [--trainer.max_steps 50]
    lightning_cqk validate | test | predict --config ... --ckpt_path runs/<experiment>/<run>/checkpoints/last.ckpt
    lightning_cqk prepare --source 'corpus/*.jsonl' --output_dir data/mycorpus-gpt2 --tokenizer gpt2
    lightning_cqk attention            # list the registered attention backends and their options
    lightning_cqk sweep configs/ablations/coupling.yaml --profile cpu [--dry-run]   # an ablation study, resumable
    lightning_cqk report runs/coupling-cpu                                          # its tables and figures
    lightning_cqk fit --config configs/glue/sst2.yaml --model.checkpoint <ckpt>   # downstream: GlueCLI
    lightning_cqk glue --checkpoint <ckpt> | glue-table <ckpt|dir>... | mc-eval --checkpoint <ckpt> --tasks '[a.jsonl]'

`fit/validate/test/predict` are LightningCLI subcommands: configs compose left to right, command-line flags win,
`--print_config` prints the resolved config, and the resolved config is saved as `config.yaml` next to every
run's logs. Two values are linked so that model and data cannot disagree: `model.config.block_size` is the data's
`seq_len`, and `model.config.vocab_size` is the data tokenizer's vocabulary size.

Defaults chosen here (all overridable): TensorBoard logs under `runs/<experiment>/<run name>/` where the run name
is `{attention}-{size}-s{seed}` (size: the preset, plus any shape field set against it, e.g. `60m-L6`; a `-2`,
`-3`, ... suffix keeps a new run from writing into an old one), and
`trainer.precision: null` meaning bf16-mixed on a bf16-capable GPU, fp32 elsewhere.

Restarts: `lightning_cqk fit ... --ckpt_path last` resumes the newest run directory with the run's name from its
`checkpoints/last.ckpt` (or starts afresh when there is none). `fit` locks its run directory (`run_lock.py`) before
building anything, installs `AtomicCheckpointIO` (atomic, verified checkpoints), and unknown config keys get a
did-you-mean (`cli_hints.py`). See docs/reliability.md.

Budgets: a `budget:` group (top-level key, `lightning_cqk.callbacks.TokenBudget`) is always present and does nothing
unless set: `--budget.tokens 2e6`, `--budget.flops 1e15`, `--budget.wallclock 600`, or
`--budget.match_to runs/<experiment>/<run> --budget.ratio 2.4 [--budget.match_on tokens]`. Every run writes
`budget.json` (tokens, flops, wallclock, steps) into its run directory.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("LITDATA_DISABLE_VERSION_CHECK", "1")  # litdata would otherwise ping PyPI (offline runs)

import torch  # noqa: E402
from lightning.pytorch import LightningDataModule, Trainer  # noqa: E402
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI  # noqa: E402
from lightning.pytorch.loggers import TensorBoardLogger  # noqa: E402
from lightning.pytorch.plugins.io import TorchCheckpointIO  # noqa: E402

from lightning_cqk.callbacks import RunSummary, TokenBudget  # noqa: E402
from lightning_cqk.callbacks.checkpoint import AtomicCheckpointIO  # noqa: E402
from lightning_cqk.cli_presets import PresetArgumentParser, unset_shape_defaults  # noqa: E402
from lightning_cqk.config import size_label  # noqa: E402
from lightning_cqk.module import LitLM  # noqa: E402
from lightning_cqk.run_lock import acquire, is_rank_zero_process  # noqa: E402


def _vocab_size_of(datamodule: LightningDataModule) -> int:
    return datamodule.vocab_size


class CQKCLI(LightningCLI):
    """LightningCLI with the links, defaults and run naming of this framework."""

    def __init__(self, args: list[str] | None = None, run: bool = True, **kwargs: Any) -> None:
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
        # Always present, a no-op unless a budget is set: `--budget.tokens 1e6`, `--budget.match_to <run dir>`.
        parser.add_lightning_class_args(TokenBudget, "budget")
        parser.set_defaults(unset_shape_defaults())  # shape fields left unset come from the preset (cli_presets.py)
        _count_or_fraction_first_int(parser)
        parser.link_arguments("data.init_args.seq_len", "model.config.block_size", apply_on="parse")
        parser.link_arguments("data", "model.config.vocab_size", compute_fn=_vocab_size_of, apply_on="instantiate")

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        trainer = config.trainer
        if trainer.get("precision") is None:
            trainer.precision = _auto_precision(trainer.get("accelerator"))
        logger = trainer.get("logger")
        if _is_tensorboard(logger) and logger.init_args.get("version") is None:
            logger.init_args.version = _run_name(config, logger.init_args, resuming=bool(config.get("ckpt_path")))
        if self.subcommand == "fit" and _is_tensorboard(logger) and is_rank_zero_process():
            # One live process per run directory, checked before anything is built (lightning_cqk/run_lock.py).
            args = logger.init_args
            acquire(Path(args.get("save_dir") or "runs") / str(args.get("name") or "default") / str(args.version))

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        trainer = super().instantiate_trainer(**kwargs)
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:  # atomic, fsynced, clear errors on load
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()
        if not any(isinstance(cb, RunSummary) for cb in trainer.callbacks):
            trainer.callbacks.insert(0, RunSummary())  # first: it records a validation before a checkpoint saves
        return trainer


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


def _is_tensorboard(logger: Any) -> bool:
    class_path = getattr(logger, "class_path", None) if logger is not None else None
    return class_path is not None and class_path.rsplit(".", 1)[-1] == TensorBoardLogger.__name__


def _auto_precision(accelerator: Any) -> str:
    """bf16-mixed where a bf16-capable GPU will be used, fp32 otherwise."""
    wants_gpu = accelerator in (None, "auto", "gpu", "cuda")
    if wants_gpu and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "bf16-mixed"
    return "32-true"


def _run_name(config: Any, logger_args: Any, resuming: bool) -> str:
    """`{attention}-{size}-s{seed}` (size: `config.size_label`, e.g. `60m` or `60m-L6`); suffixed so a fresh run
    never writes into an existing run's directory.

    When resuming (`--ckpt_path`), the newest existing directory with that name is reused instead.
    """
    model_cfg = config.model.config
    shape = {key: model_cfg.get(key) for key in ("n_layer", "n_head", "n_embd", "mlp_hidden")}
    base = f"{model_cfg.attention}-{size_label(model_cfg.preset, **shape)}-s{config.seed_everything}"
    root = Path(logger_args.get("save_dir") or "runs") / str(logger_args.get("name") or "default")
    candidates = [base] + [f"{base}-{i}" for i in range(2, 1000)]
    existing = [name for name in candidates if (root / name).exists()]
    if resuming:
        return existing[-1] if existing else base
    return next(name for name in candidates if not (root / name).exists())


# ------------------------------------------------------------------------------------------ extra commands
def _prepare_command(argv: list[str]) -> None:
    from jsonargparse import CLI

    from lightning_cqk.data import prepare

    CLI(prepare, args=argv, prog="lightning_cqk prepare", as_positional=False)


def _attention_command(argv: list[str]) -> None:
    import textwrap

    from lightning_cqk import attention

    print("Attention backends (model.config.attention) and their options (model.config.attention_options):\n")
    for name in attention.available():
        cls = attention.get_attention(name)
        doc = (cls.__doc__ or "").strip().splitlines()[0].replace(f"`{name}`: ", "")
        print(f"{name:<16} {doc}")
        options = []
        for f in dataclasses.fields(cls.Options):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            options.append(f"{f.name}={default!r}")
        print(textwrap.fill(", ".join(options), width=116, initial_indent=" " * 17, subsequent_indent=" " * 17))


def _sweep_command(argv: list[str]) -> None:
    from lightning_cqk.sweep.runner import sweep_command

    sweep_command(argv)


def _report_command(argv: list[str]) -> None:
    from lightning_cqk.sweep.report import report_command

    report_command(argv)


def _glue_command(argv: list[str]) -> None:
    from lightning_cqk.downstream.run_glue import glue_command

    glue_command(argv)


def _glue_table_command(argv: list[str]) -> None:
    from lightning_cqk.downstream.run_glue import glue_table_command

    glue_table_command(argv)


def _mc_eval_command(argv: list[str]) -> None:
    from lightning_cqk.downstream.multiple_choice import mc_eval_command

    mc_eval_command(argv)


EXTRA_COMMANDS = {
    "prepare": _prepare_command,
    "attention": _attention_command,
    "sweep": _sweep_command,
    "report": _report_command,
    "glue": _glue_command,
    "glue-table": _glue_table_command,
    "mc-eval": _mc_eval_command,
}

USAGE = """usage: lightning_cqk {fit,validate,test,predict,prepare,attention,sweep,report,glue,glue-table,mc-eval} ...

  fit        train:                     lightning_cqk fit --config configs/quickstart.yaml
  validate   evaluate a checkpoint:     lightning_cqk validate --config <run>/config.yaml --ckpt_path <ckpt>
  test       test split evaluation
  predict    run predictions
  prepare    text -> token shards:      lightning_cqk prepare --source 'corpus/*.txt' --output_dir data/x
  attention  list attention backends and their options
  sweep      run an ablation study:     lightning_cqk sweep configs/ablations/coupling.yaml --profile cpu
  report     tables + figures of it:    lightning_cqk report runs/coupling-cpu
  glue       GLUE fine-tuning of a checkpoint, every task x seeds -> glue.json/glue.md beside it:
                  lightning_cqk glue --checkpoint <ckpt> [--tasks '[cola, rte]'] [--seeds '[1, 2]']
  glue-table GLUE tables of several checkpoints side by side: lightning_cqk glue-table <ckpt|dir|glue.json>...
  mc-eval    zero/few-shot multiple choice (jsonl: context, choices, label):
                  lightning_cqk mc-eval --checkpoint <ckpt> --tasks '[arc.jsonl]' [--num_fewshot 5]

A config whose model.class_path is in lightning_cqk.downstream (configs/glue/<task>.yaml) trains with the downstream
CLI:                                    lightning_cqk fit --config configs/glue/sst2.yaml --model.checkpoint <ckpt>

Every subcommand takes --help. Trainer subcommands also take --print_config.
"""


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (`lightning_cqk` and `python -m lightning_cqk`)."""
    from_command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    torch.set_float32_matmul_precision("high")
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return
    if argv[0] in EXTRA_COMMANDS:
        EXTRA_COMMANDS[argv[0]](argv[1:])
        return
    # From the shell, LightningCLI reads sys.argv itself (passing it again as `args` makes it warn).
    from lightning_cqk.downstream.cli import GlueCLI, names_downstream_model

    cli_class = GlueCLI if names_downstream_model(argv) else CQKCLI
    cli_class(args=None if from_command_line else argv)


if __name__ == "__main__":
    main()
