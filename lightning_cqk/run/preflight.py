"""Everything a trainer command decides before anything is built: `preflight(inputs) -> RunPlan`, an ordered list of
small checks, each a function of its own (tests/unit/run/test_preflight.py).

`CHECKS`, in order (the command line has already refused a class outside the allow-list, `cli/class_paths.py`, and a
`--config` file with a key given twice, `files/strict_yaml.py`; size presets are the parser's, `cli/presets.py`):

1. `check_attention_name`: a name that is no backend but a shipped recipe (`gqa`) points at its config file.
2. `check_run_names`: the logger's name and version make a safe directory name (`run/directory.py`).
3. `plan_run`: `fit` decides its run directory and checkpoint, checks the resume against `RESUME_POLICY`, keeps every
   output inside the run and locks the directory (rank zero; the other ranks of a launch take its plan:
   `run/launch_rank.py`); an evaluation takes the model's settings from its checkpoint.
4. `use_run_logger`: fit's TensorBoard logger is the framework's (no epoch chart).
5. `default_precision`: bf16-mixed on a bf16 GPU, fp32 elsewhere, unless set.
6. `check_strategy`: `--trainer.strategy ModelParallelStrategy` is FSDP2, and a checkpoint folder only FSDP2 reads
   is refused to any other strategy (`run/strategy_flag.py`).
7. `quiet_budget_warning`: a run whose length is a budget does not hear Lightning's "max_epochs was not set".
8. `place_evaluation_logs`: validate / test / predict log beside the run their checkpoint belongs to.
9. `check_outputs`: an evaluation's callbacks, loggers and profilers write inside its run directory.

Once the model, data and Trainer exist and before the first step, `check_memory` (`run/memory_check.py`) refuses a
configuration that will not fit in the device's memory. The checks get the command's settings through `Inputs`, so
that what only the parser can do (merge a checkpoint's settings, dump the resolved configuration) stays with the
command line.
"""

from __future__ import annotations

import atexit
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import Namespace

from lightning_cqk.errors import ConfigError
from lightning_cqk.model_config import size_label, upgrade_run_config
from lightning_cqk.run.directory import (
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
)
from lightning_cqk.run.launch_rank import detect_launch, publish_failure, publish_plan, receive_plan
from lightning_cqk.run.memory_check import check_memory
from lightning_cqk.run.outputs import refuse_outside_outputs
from lightning_cqk.run.strategy_flag import refuse_folder_without_fsdp2, resolve_strategy

#: A `budget:` that sets the run's length.
BUDGET_LIMITS = ("tokens", "flops", "wallclock", "match_to")


@dataclass
class Inputs:
    """What a trainer command gives its preflight: the subcommand, its command line, and the parser's two jobs."""

    subcommand: str | None
    argv: list[str]
    #: The subcommand's settings now (merging a checkpoint's settings replaces them).
    settings: Callable[[], Any]
    #: Take the model's settings from a checkpoint; returns {setting: (checkpoint's, this run's)} that differ.
    merge_checkpoint: Callable[[str], dict[str, tuple[Any, Any]]]
    #: The resolved configuration as the run records it (config.yaml).
    dump: Callable[[Any], str]


@dataclass
class RunPlan:
    """What preflight decided: for `fit`, the run directory (claimed on rank zero), the checkpoint it resumes from, the
    configuration it records and what a resume changes; nothing for an evaluation but its settings."""

    fit: FitPlan | None = None
    directory: RunDirectory | None = None
    config_text: str | None = None
    changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    apply_optimizer: bool = False
    follower: bool = False  # a rank other than zero: rank zero's plan, nothing claimed here


# ------------------------------------------------------------------------------------------------- the checks
def check_attention_name(inputs: Inputs, plan: RunPlan) -> None:
    name = inputs.settings().get("model.config.attention")
    if isinstance(name, str):
        check_backend_name(name)


def check_run_names(inputs: Inputs, plan: RunPlan) -> None:
    logger = inputs.settings().trainer.get("logger")
    if is_tensorboard(logger):  # before anything is created: a run directory never leaves save_dir
        check_run_name_part(logger.init_args.get("name"), "--trainer.logger.init_args.name")
        check_run_name_part(logger.init_args.get("version"), "--trainer.logger.init_args.version")


def plan_run(inputs: Inputs, plan: RunPlan) -> None:
    settings = inputs.settings()
    ckpt = settings.get("ckpt_path")
    if inputs.subcommand == "fit" and is_tensorboard(settings.trainer.get("logger")):
        plan_fit(inputs, plan)  # ResumeRefused / RunDirectoryInUse: `main` prints them without a traceback
    elif inputs.subcommand is not None and ckpt and Path(ckpt).exists():
        inputs.merge_checkpoint(ckpt)


def use_run_logger(inputs: Inputs, plan: RunPlan) -> None:
    trainer = inputs.settings().trainer
    if inputs.subcommand == "fit" and is_tensorboard(trainer.get("logger")):  # no epoch chart, the curves first
        trainer.logger.class_path = "lightning_cqk.callbacks.tensorboard.TensorBoardLogger"


def default_precision(inputs: Inputs, plan: RunPlan) -> None:
    trainer = inputs.settings().trainer
    if trainer.get("precision") is None:
        trainer.precision = auto_precision(trainer.get("accelerator"))


def check_strategy(inputs: Inputs, plan: RunPlan) -> None:
    settings = inputs.settings()
    trainer = settings.trainer
    strategy = resolve_strategy(trainer.get("strategy"))  # `--trainer.strategy ModelParallelStrategy` (FSDP2)
    if isinstance(strategy, dict):
        trainer.strategy = Namespace(class_path=strategy["class_path"], init_args=Namespace(**strategy["init_args"]))
    refuse_folder_without_fsdp2(settings.get("ckpt_path"), trainer.get("strategy"), inputs.subcommand)


def quiet_budget_warning(inputs: Inputs, plan: RunPlan) -> None:
    budget = inputs.settings().get("budget")
    if inputs.subcommand == "fit" and budget is not None and any(budget.get(k) is not None for k in BUDGET_LIMITS):
        # The budget sets max_steps once the Trainer exists: Lightning's "`max_epochs` was not set. Setting it
        # to 1000 epochs" (max_steps -1 at construction) does not describe this run, which stops at its budget.
        warnings.filterwarnings("ignore", message=r"`max_epochs` was not set\. Setting it to 1000 epochs")


def place_evaluation_logs(inputs: Inputs, plan: RunPlan) -> None:
    settings = inputs.settings()
    logger = settings.trainer.get("logger")
    if is_tensorboard(logger) and logger.init_args.get("version") is None:  # validate / test / predict
        owner = checkpoint_run(settings.get("ckpt_path"))
        if owner is not None:  # evaluate beside the training curves of the run the checkpoint belongs to
            args = logger.init_args
            args.save_dir, args.name, args.version = str(owner.parent.parent), owner.parent.name, owner.name
        else:
            logger.init_args.version = run_name(settings, logger.init_args, resuming=bool(settings.get("ckpt_path")))


def check_outputs(inputs: Inputs, plan: RunPlan) -> None:
    trainer = inputs.settings().trainer
    logger = trainer.get("logger")
    if not (inputs.subcommand == "fit" and is_tensorboard(logger)):  # a planned fit is checked in plan_fit
        refuse_outside_outputs(trainer, logger_run_dir(logger))


CHECKS: tuple[Callable[[Inputs, RunPlan], None], ...] = (
    check_attention_name,
    check_run_names,
    plan_run,
    use_run_logger,
    default_precision,
    check_strategy,
    quiet_budget_warning,
    place_evaluation_logs,
    check_outputs,
)


def preflight(inputs: Inputs) -> RunPlan:
    """Run `CHECKS` in order on a parsed trainer command; the first refusal stops it (module docstring)."""
    plan = RunPlan()
    for check in CHECKS:
        check(inputs, plan)
    return plan


def check_memory_before_fit(model: Any, datamodule: Any, trainer: Any, settings: Any) -> None:
    """Once the model, data and Trainer exist, before shards are prepared or a step is taken: refuse (or warn about,
    `--memory_check`) a run whose analytic memory estimate exceeds its device's memory (run/memory_check.py)."""
    resuming = bool(settings.get("ckpt_path"))  # the advice then names only what a resume may change
    check_memory(model, datamodule, trainer, settings.get("memory_check", "refuse"), resuming=resuming)


# ---------------------------------------------------------------------------------------- fit: the run directory
def plan_fit(inputs: Inputs, plan: RunPlan) -> None:
    """Decide the run directory and checkpoint (run/directory.py `resolve_fit`), check the resume, lock the
    directory: rank zero alone plans, checks and locks; the other ranks take its plan (run/launch_rank.py)."""
    args = inputs.settings().trainer.logger.init_args
    root = Path(args.get("save_dir") or "runs") / str(args.get("name") or "default")
    launch = detect_launch()
    if not launch.is_zero:
        return follow_plan(
            inputs, plan, receive_plan(launch, root, log=lambda m: print(m, file=sys.stderr, flush=True))
        )
    try:
        make_plan(inputs, plan, root)
    except BaseException as err:
        publish_failure(launch, root, f"{type(err).__name__}: {err}")  # the other ranks stop with this message
        raise
    shared = {
        "run_dir": str(plan.fit.run_dir),
        "ckpt_path": plan.fit.ckpt_path,
        "apply_optimizer": plan.apply_optimizer,
    }
    publish_plan(launch, root, shared)


def make_plan(inputs: Inputs, plan: RunPlan, root: Path) -> None:
    """Rank zero: resolve, check and lock the run."""
    config = inputs.settings()
    args = config.trainer.logger.init_args
    model_cfg = config.model.config
    base = base_run_name(model_cfg.attention, model_size(model_cfg), config.seed_everything)
    fit = plan.fit = resolve_fit(
        root, base, args.get("version"), config.get("ckpt_path"), config.get("on_unfinished"), inputs.argv
    )
    changes: dict[str, tuple[Any, Any]] = {}
    if fit.ckpt_path is not None:
        changes.update(inputs.merge_checkpoint(fit.ckpt_path))
        config = inputs.settings()
    args = config.trainer.logger.init_args
    args.save_dir, args.name, args.version = str(fit.run_dir.parent.parent), fit.run_dir.parent.name, fit.run_dir.name
    config.ckpt_path = fit.ckpt_path
    if config.trainer.get("precision") is None:
        config.trainer.precision = auto_precision(config.trainer.get("accelerator"))
    config_text = inputs.dump(config)
    previous = fit.previous_config
    if previous is not None:
        before = upgrade_run_config(yaml.safe_load(previous.read_text()) or {})  # older versions' field names
        changes.update(changed_settings(before, upgrade_run_config(yaml.safe_load(config_text))))
    allowed, refused = classify_changes(changes)
    if refused:
        raise ResumeRefused(resume_refusal(fit, refused, previous))
    if fit.auto_resumed and allowed:
        argv = inputs.argv
        raise ResumeRefused(
            f"{fit.run_dir} is an unfinished run of this name, and this command changes its settings "
            f"({describe_changes(allowed)}). To continue it with these changes: "
            f"{command_line(argv, drop=('--ckpt_path', '--on_unfinished'), add=('--ckpt_path', 'last'))}\n"
            "To start a new run beside it: "
            f"{command_line(argv, drop=('--on_unfinished',), add=('--on_unfinished', 'new'))}"
        )
    # Every callback, logger and profiler writes inside this run's directory (run/outputs.py), checked before
    # the directory is claimed or anything built.
    refuse_outside_outputs(config.trainer, fit.run_dir)
    for note in fit.notes:
        print(f"run: {note}", file=sys.stderr, flush=True)
    # One live process per run directory, checked before anything is built (run/lock.py).
    plan.directory = RunDirectory.claim(fit.run_dir)
    atexit.register(abandon_if_not_started, plan.directory)
    plan.config_text, plan.changes = config_text, allowed
    plan.apply_optimizer = any(k in OPTIMIZER_KEYS for k in allowed)


def follow_plan(inputs: Inputs, plan: RunPlan, shared: dict[str, Any]) -> None:
    """A rank other than zero: the run directory and checkpoint rank zero chose (the same model, the same state)."""
    ckpt = shared.get("ckpt_path") or None
    plan.fit = FitPlan(Path(shared["run_dir"]), ckpt, ckpt is not None)
    plan.follower = True
    if ckpt is not None:
        inputs.merge_checkpoint(ckpt)  # the same settings as rank zero's (checked there)
    config = inputs.settings()
    args = config.trainer.logger.init_args
    run_dir = plan.fit.run_dir
    args.save_dir, args.name, args.version = str(run_dir.parent.parent), run_dir.parent.name, run_dir.name
    config.ckpt_path = ckpt
    if config.trainer.get("precision") is None:
        config.trainer.precision = auto_precision(config.trainer.get("accelerator"))
    plan.config_text = inputs.dump(config)
    plan.apply_optimizer = bool(shared.get("apply_optimizer"))


def abandon_if_not_started(directory: RunDirectory) -> None:
    directory.abandon(log=lambda m: print(m, file=sys.stderr))


def resume_refusal(fit: FitPlan, refused: dict, previous: Path | None) -> str:
    """The one paragraph (and the policy table) refusing a resume that changes what a resume cannot change."""
    keys = ", ".join(refused)
    flags = " ".join(f"--{k}" for k in refused)
    where = f"its last attempt's configuration, {previous}" if previous else f"the checkpoint {fit.ckpt_path}"
    fix = (
        f"To resume it as it was: lightning_cqk fit --config {previous} --ckpt_path last"
        if previous
        else f"To resume it as it was, drop {flags} (and any config file setting them): the checkpoint's values "
        "are used"
    )
    return (
        f"Resuming {fit.run_dir} with settings that a resume cannot change ({describe_changes(refused)}; "
        f"compared with {where}). A resumed run must stay the same experiment: {keys} would not be (or could "
        f"not be) applied to the restored state. {fix}. To train with the new settings, start a new run: drop "
        "--ckpt_path (with --on_unfinished new when an unfinished run of this name exists).\n" + policy_table()
    )


# --------------------------------------------------------------------------------------------------- helpers
def check_backend_name(name: str) -> None:
    """A ConfigError for a name that is no registered backend, pointing at the recipe of that name when one ships
    (`gqa` is configs/attention/gqa.yaml, standard attention with n_kv_groups set)."""
    from lightning_cqk import attention

    try:
        attention.get_attention(name)  # a built-in, an installed plugin or a module:Class path
    except ConfigError:
        hint = recipe_hint(name)
        if hint is None:
            raise  # the registry's own message: did-you-mean, the list, how plugins are found
        raise ConfigError(f"Unknown attention backend {name!r}: {hint}") from None


def recipe_hint(name: str) -> str | None:
    """When `configs/attention/<name>.yaml` exists (here or shipped): what it sets, and how to use it; else None."""
    import yaml

    from lightning_cqk.files.resources import ConfigNotFound, find_config

    recipe = f"configs/attention/{name}.yaml"
    try:
        loaded = yaml.safe_load(find_config(recipe).read_text()) or {}
    except (ConfigNotFound, OSError, yaml.YAMLError):
        return None
    config = ((loaded.get("model") or {}).get("config") or {}) if isinstance(loaded, dict) else {}
    backend = config.get("attention", "standard")
    return (
        f"{name} is a recipe, not a backend: {recipe} sets attention: {backend} with its options. Use it as a "
        f"config file after your main one, e.g. lightning_cqk fit --config configs/quickstart.yaml --config {recipe} "
        f"(lightning_cqk attention {backend} lists the options it sets)."
    )


def is_tensorboard(logger: Any) -> bool:
    class_path = getattr(logger, "class_path", None) if logger is not None else None
    return class_path is not None and class_path.rsplit(".", 1)[-1] == "TensorBoardLogger"


def logger_run_dir(logger: Any) -> Path | None:
    """The run directory of a command whose logger is the run's TensorBoard logger (save_dir/name/version), or None."""
    if not is_tensorboard(logger) or logger.init_args.get("version") is None:
        return None
    args = logger.init_args
    return Path(args.get("save_dir") or "runs") / str(args.get("name") or "default") / str(args.get("version"))


def auto_precision(accelerator: Any) -> str:
    """bf16-mixed where a bf16-capable GPU will be used, fp32 otherwise."""
    import torch

    wants_gpu = accelerator in (None, "auto", "gpu", "cuda")
    if wants_gpu and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "bf16-mixed"
    return "32-true"


def model_size(model_cfg: Any) -> str:
    """The size part of a run name: the preset, plus any shape field set against it (`size_label`)."""
    shape = {key: model_cfg.get(key) for key in ("n_layer", "n_head", "n_embd", "mlp_hidden")}
    return size_label(model_cfg.preset, **shape)


def run_name(config: Any, logger_args: Any, resuming: bool) -> str:
    """validate / test / predict: the newest run directory of this name when a checkpoint is given, else a new one.
    (`fit` decides with `resolve_fit`.)"""
    model_cfg = config.model.config
    base = base_run_name(model_cfg.attention, model_size(model_cfg), config.seed_everything)
    root = Path(logger_args.get("save_dir") or "runs") / str(logger_args.get("name") or "default")
    existing = numbered_dirs(root, base)
    if resuming and existing:
        return existing[-1].name
    return next_free_name(root, base)
