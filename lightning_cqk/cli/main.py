"""The `lightning_cqk` command line.

    lightning_cqk fit --config configs/quickstart.yaml [--model.config.attention standard] [--trainer.max_steps 50]
    lightning_cqk validate | test | predict --config ... --ckpt_path runs/<experiment>/<run>/checkpoints/last.ckpt
    lightning_cqk prepare --source 'corpus/*.jsonl' --output_dir data/mycorpus-gpt2 --tokenizer gpt2
    lightning_cqk attention            # list the registered attention backends and their options
    lightning_cqk sweep configs/ablations/coupling.yaml --profile cpu [--dry-run]   # an ablation study, resumable
    lightning_cqk report runs/coupling-cpu                                          # its tables and figures
    lightning_cqk glue fit --config configs/glue/sst2.yaml --model.checkpoint <ckpt>   # one GLUE task: GlueCLI
    lightning_cqk glue --checkpoint <ckpt> | glue-table <ckpt|dir>... | mc-eval --checkpoint <ckpt> --tasks '[a.jsonl]'
    lightning_cqk consolidate runs/<experiment>/<run>/checkpoints/last.ckpt     # FSDP2 folder -> one file

`fit/validate/test/predict` are LightningCLI subcommands: configs compose left to right, command-line flags win,
`--print_config` prints the resolved config. Two values are linked so that model and data cannot disagree:
`model.config.block_size` is the data's `seq_len`, and `model.config.vocab_size` is the data tokenizer's vocabulary
size.

Defaults chosen here (all overridable): TensorBoard logs under `runs/<experiment>/<run name>/` where the run name
is `{attention}-{size}-s{seed}` (size: the preset, plus any shape field set against it, e.g. `60m-L6`; a `-2`,
`-3`, ... suffix keeps a new run from writing into an old one), and
`trainer.precision: null` meaning bf16-mixed on a bf16-capable GPU, fp32 elsewhere.

Run directories (`run/directory.py`, docs/reliability.md): `fit` decides the directory and the checkpoint to resume from
(`--ckpt_path last`: the newest run of this name with a checkpoint; the same command again resumes an unfinished
run when nothing changed, `--on_unfinished new|refuse|resume`), checks that a resume changes only what a resume may
change (and applies a changed learning rate or schedule), locks the directory (`run/lock.py`) before building
anything, and records each attempt (`run.json`; `config.yaml`, then `config.resume-<n>.yaml` per resume) once
training has started. SIGTERM and a first Ctrl-C save a checkpoint and print the command that resumes.
`validate/test/predict` save their configuration as `config.<subcommand>.yaml`. `fit` also installs
`AtomicCheckpointIO` (atomic, verified checkpoints), and unknown config keys get a did-you-mean (`cli/hints.py`).

Budgets: a `budget:` group (top-level key, `lightning_cqk.callbacks.TokenBudget`) is always present and does nothing
unless set: `--budget.tokens 2e6`, `--budget.flops 1e15`, `--budget.wallclock 600`, or
`--budget.match_to runs/<experiment>/<run> --budget.ratio 2.4 [--budget.match_on tokens]`. Every run writes
`budget.json` (tokens, flops, wallclock, steps) into its run directory.

Errors (`cli/error_report.py`): a user error (`lightning_cqk.errors.UserError`, a refused resume, a run directory in
use) prints as `lightning_cqk <command>: <message>` and exits 1; its traceback goes to
~/.cache/lightning_cqk/last-error.log (`--debug` or LIGHTNING_CQK_DEBUG=1 prints it). Any other exception keeps its
traceback. Warnings that repeat on every run and that nobody can act on are hidden by message (`cli/warnings.py`, the
one list).

This module imports neither torch nor Lightning: `--help`, `attention`, `sweep` and `report` answer at once, and the
trainer subcommands import `cli/trainer.py` (CQKCLI) when they run.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from lightning_cqk.cli.error_report import pop_debug, user_errors_reported
from lightning_cqk.environment import EnvironmentValueError

os.environ.setdefault("LITDATA_DISABLE_VERSION_CHECK", "1")  # litdata would otherwise ping PyPI (offline runs)

TRAINER_COMMANDS = ("fit", "validate", "test", "predict")
_JSONARGPARSE_COMMANDS = (*TRAINER_COMMANDS, "prepare", "glue", "mc-eval", "eval")  # parsers that build classes
_TORCH_COMMANDS = (*TRAINER_COMMANDS, "mc-eval", "glue")  # in-process model math: fp32 matmuls may use TF32 ("high")


# ------------------------------------------------------------------------------------------ extra commands
def _prepare_command(argv: list[str]) -> None:
    import functools
    import inspect

    from jsonargparse import CLI

    from lightning_cqk.data import prepare

    # jsonargparse makes a parameter without a default required, so `source` (None: download the named corpus)
    # could not be left out: the command sees every parameter as keyword-only, `source` defaulting to None.
    @functools.wraps(prepare)
    def command(**kwargs):
        return prepare(**kwargs)

    params = [
        p.replace(kind=inspect.Parameter.KEYWORD_ONLY, **({"default": None} if p.name == "source" else {}))
        for p in inspect.signature(prepare).parameters.values()
    ]
    command.__signature__ = inspect.signature(prepare).replace(parameters=params)
    CLI(command, args=argv, prog="lightning_cqk prepare", as_positional=False)


def _attention_command(argv: list[str]) -> None:
    from lightning_cqk.contract.backends_table import attention_command

    attention_command(argv)


def _check_backend_command(argv: list[str]) -> None:
    from lightning_cqk.contract.check_backend import check_backend_command

    check_backend_command(argv)


def _new_study_command(argv: list[str]) -> None:
    from lightning_cqk.study.design.new_study import new_study_command

    new_study_command(argv)


def _sweep_command(argv: list[str]) -> None:
    from lightning_cqk.study.report.after_sweep import after_sweep
    from lightning_cqk.study.run.runner import sweep_command

    after_sweep(sweep_command(argv))  # the runs, then the power plan (dry run) or the report


def _report_command(argv: list[str]) -> None:
    from lightning_cqk.study.report.report_command import report_command

    report_command(argv)


def _claims_table_command(argv: list[str]) -> None:
    from lightning_cqk.study.report.claims_table import claims_table_command

    claims_table_command(argv)


def _units_table_command(argv: list[str]) -> None:
    from lightning_cqk.study.design.units import units_table_command

    units_table_command(argv)


def _study_data_command(argv: list[str]) -> None:
    from lightning_cqk.data.study_data import study_data_command

    study_data_command(argv)


def _glue_command(argv: list[str]) -> None:
    from lightning_cqk.cli.glue_command import glue_command

    glue_command(argv)


def _glue_table_command(argv: list[str]) -> None:
    from lightning_cqk.cli.glue_command import glue_table_command

    glue_table_command(argv)


def _mc_eval_command(argv: list[str]) -> None:
    from lightning_cqk.downstream.multiple_choice import mc_eval_command

    mc_eval_command(argv)


def _generate_command(argv: list[str]) -> None:
    from lightning_cqk.inference.generate_command import generate_command

    generate_command(argv)


def _eval_command(argv: list[str]) -> None:
    from lightning_cqk.evaluation.command import eval_command

    eval_command(argv)


def _consolidate_command(argv: list[str]) -> None:
    from lightning_cqk.checkpoint.consolidate import consolidate_command

    consolidate_command(argv)


EXTRA_COMMANDS = {
    "prepare": _prepare_command,
    "attention": _attention_command,
    "check-backend": _check_backend_command,
    "new-study": _new_study_command,
    "sweep": _sweep_command,
    "report": _report_command,
    "claims-table": _claims_table_command,
    "units-table": _units_table_command,
    "study-data": _study_data_command,
    "glue": _glue_command,
    "glue-table": _glue_table_command,
    "mc-eval": _mc_eval_command,
    "generate": _generate_command,
    "eval": _eval_command,
    "consolidate": _consolidate_command,
}

USAGE = """usage: lightning_cqk {fit,validate,test,predict,prepare,attention,sweep,report,glue,glue-table,mc-eval,
                     generate,eval,consolidate,check-backend,new-study,claims-table,units-table,study-data} ...

  fit        train:                     lightning_cqk fit --config configs/quickstart.yaml
  validate   evaluate a checkpoint:     lightning_cqk validate --config <run>/config.yaml --ckpt_path <ckpt>
  test       test split evaluation
  predict    run predictions
  prepare    text -> token shards:      lightning_cqk prepare --source 'corpus/*.txt' --output_dir data/x
  attention  list attention backends and their options
  check-backend  the attention contract on any backend, as a table (exit 1 on a failure):
                  lightning_cqk check-backend NAME_OR_PACKAGE.MODULE:CLASS [--options JSON]
  new-study  a study spec of your backend vs standard: lightning_cqk new-study NAME --attention X --effect -2
  sweep      run an ablation study:     lightning_cqk sweep configs/ablations/coupling.yaml --profile cpu
  report     tables + figures of it:    lightning_cqk report runs/coupling-cpu
  claims-table  every committed study's claims in docs/results/README.md:
                  lightning_cqk claims-table --write docs/results/README.md
  units-table   bytes per GPT-2 token and per word of corpora: lightning_cqk units-table wiki=<file> --bpe-file <f>
  study-data    fetch the corpus study's text, checked:  lightning_cqk study-data ../shared/data
  glue       GLUE fine-tuning of a checkpoint, every task x seeds -> glue.json/glue.md beside it:
                  lightning_cqk glue --checkpoint <ckpt> [--tasks '[cola, rte]'] [--seeds '[1, 2]']
             one task, through Lightning's subcommands (GlueCLI; `fit --config` of a GLUE config is the same):
                  lightning_cqk glue fit --config configs/glue/sst2.yaml
  glue-table GLUE tables of several checkpoints side by side: lightning_cqk glue-table <ckpt|dir|glue.json>...
  mc-eval    zero/few-shot multiple choice (jsonl: context, choices, label):
                  lightning_cqk mc-eval --checkpoint <ckpt> --tasks '[arc.jsonl]' [--num_fewshot 5]
  generate   sample text from a checkpoint, streamed: lightning_cqk generate --checkpoint <ckpt> --prompt "..."
  eval       lm-evaluation-harness tasks: lightning_cqk eval --checkpoint <ckpt> --tasks hellaswag,arc_easy
  consolidate  one file from an FSDP2 checkpoint folder: lightning_cqk consolidate <run>/checkpoints/last.ckpt

A config whose model.class_path is in lightning_cqk.downstream (configs/glue/<task>.yaml) trains with the downstream
CLI:                                    lightning_cqk fit --config configs/glue/sst2.yaml --model.checkpoint <ckpt>

Every subcommand takes --help. Trainer subcommands also take --print_config. An error that says how to fix it
prints alone; --debug (or LIGHTNING_CQK_DEBUG=1) prints its traceback too.
"""


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (`lightning_cqk` and `python -m lightning_cqk`).

    From the shell, a user error prints alone and exits 1 (`cli/error_report.py`); from Python (`main([...])`) every
    exception propagates.
    """
    from_command_line = argv is None
    try:
        debug, argv = pop_debug(list(sys.argv[1:] if argv is None else argv))
    except EnvironmentValueError as err:  # a malformed LIGHTNING_CQK_DEBUG: one paragraph, before any command
        if not from_command_line:
            raise
        sys.exit(f"lightning_cqk: {err}")
    if from_command_line:
        sys.argv[1:] = argv  # LightningCLI reads sys.argv itself; `--debug` is ours
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return
    if not from_command_line:
        return _dispatch(argv, from_command_line)
    with user_errors_reported(argv[0], debug):
        _dispatch(argv, from_command_line)


def join_negative_values(argv: list[str]) -> list[str]:
    """`--flag -1e-3` as `--flag=-1e-3`: argparse reads a token that starts with '-' as an option unless it looks
    like a plain negative number (`-1`, `-0.5`), so `--model.optim.lr -1e-3` was "expected one argument"."""
    out: list[str] = []
    for arg in argv:
        previous = out[-1] if out else ""
        if previous.startswith("--") and "=" not in previous and arg.startswith("-") and _is_number(arg):
            out[-1] = f"{previous}={arg}"
        else:
            out.append(arg)
    return out


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _dispatch(argv: list[str], from_command_line: bool) -> None:
    if argv[0] in _JSONARGPARSE_COMMANDS:
        from lightning_cqk.cli import class_paths

        class_paths.install()  # before any parser reads a value: the allow-list of classes (cli/class_paths.py)
    if from_command_line:
        from lightning_cqk.cli import warnings as warning_filters

        warning_filters.install()
    if argv[0] in _TORCH_COMMANDS:
        import torch

        torch.set_float32_matmul_precision("high")
    downstream = argv[0] == "glue" and len(argv) > 1 and argv[1] in TRAINER_COMMANDS
    if downstream:  # `glue fit --config configs/glue/<task>.yaml ...`: one fine-tuning run, GlueCLI
        argv = argv[1:]
    elif argv[0] in EXTRA_COMMANDS:
        EXTRA_COMMANDS[argv[0]](argv[1:])
        return
    argv = join_negative_values(argv)
    from lightning_cqk.files.resources import (  # configs/... of the installed package
        ConfigNotFound,
        resolve_config_args,
    )

    try:
        argv = resolve_config_args(argv)
    except ConfigNotFound as err:
        sys.exit(f"lightning_cqk {argv[0]}: {err}")
    from lightning_cqk.files.strict_yaml import check_config_args

    # A key given twice in a --config file is refused, naming the line (files/strict_yaml.py); the files read there
    # also say whether this is GLUE fine-tuning (`fit --config configs/glue/<task>.yaml`, the `glue fit` command).
    documents = check_config_args(argv)
    if from_command_line:
        sys.argv[1:] = argv
    # From the shell, LightningCLI reads sys.argv itself (passing it again as `args` makes it warn).
    if downstream or names_downstream_model(documents, argv):
        from lightning_cqk.cli.glue import GlueCLI

        GlueCLI(args=None if from_command_line else argv)
        return
    from lightning_cqk.cli.trainer import CQKCLI

    CQKCLI(args=None if from_command_line else argv)


#: Where the downstream models live: a config whose `model.class_path` starts so is fine-tuned by `glue`'s GlueCLI.
DOWNSTREAM_PREFIX = "lightning_cqk.downstream"


def names_downstream_model(documents: list[Any], argv: list[str]) -> bool:
    """Whether the `--config` documents (as read by `check_config_args`) or a `--model` class path of a trainer
    command name a downstream model: then `fit ...` is `glue fit ...` (no file is read again)."""
    for i, arg in enumerate(argv):
        value = argv[i + 1] if arg == "--model" and i + 1 < len(argv) else None
        value = arg.split("=", 1)[1] if arg.startswith("--model=") else value
        if isinstance(value, str) and value.startswith(DOWNSTREAM_PREFIX):
            return True
    for document in documents:
        model = document.get("model") if isinstance(document, dict) else None
        class_path = model.get("class_path") if isinstance(model, dict) else None
        if isinstance(class_path, str) and class_path.startswith(DOWNSTREAM_PREFIX):
            return True
    return False


if __name__ == "__main__":
    main()
