"""`--trainer.strategy <ClassName>` resolved, and a checkpoint folder refused to a strategy that cannot read it: two
checks of a run's preflight, decided before Lightning builds anything.

`resolve_strategy` turns a bare class name of `lightning.pytorch.strategies` into its class path (`DDPStrategy`,
`FSDPStrategy`, ...), and `ModelParallelStrategy` into FSDP2 sharded over every process (`FSDP2Strategy`, which lives
with the command line at the class path users write: `lightning_cqk.cli.strategy.FSDP2Strategy`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning_cqk.errors import ConfigError

#: Where `FSDP2Strategy` lives (cli/strategy.py): the class path `--trainer.strategy ModelParallelStrategy` becomes,
#: as docs/scaling-out.md and every run's config.yaml write it.
FSDP2_CLASS_PATH = "lightning_cqk.cli.strategy.FSDP2Strategy"


def resolve_strategy(value: Any) -> Any:
    """A strategy given as a bare class name, as {class_path, init_args}; anything else unchanged."""
    if not isinstance(value, str) or "." in value:
        return value
    if value == "ModelParallelStrategy":
        return {"class_path": FSDP2_CLASS_PATH, "init_args": {}}
    import lightning.pytorch.strategies as strategies

    found = getattr(strategies, value, None)
    if isinstance(found, type) and value.endswith("Strategy"):
        return {"class_path": f"lightning.pytorch.strategies.{value}", "init_args": {}}
    return value


#: The class names whose checkpoints are distributed-checkpoint folders, and that alone can resume one.
SHARDED_STRATEGIES = ("FSDP2Strategy", "ModelParallelStrategy")
#: `--ckpt_path` words Lightning resolves itself (validate, test, predict): not paths.
CKPT_PATH_WORDS = ("best", "last", "hpc", "registry")


def refuse_folder_without_fsdp2(ckpt: Any, strategy: Any, command: str | None) -> None:
    """Before Lightning builds anything: refuse a `--ckpt_path` that is a URL (only local files are checked before
    loading), or an FSDP2 checkpoint folder given to any other strategy (Lightning would try to read the folder as a
    file: an IsADirectoryError traceback, after the model was built)."""
    if not ckpt or not isinstance(ckpt, (str, Path)):
        return
    text = str(ckpt)
    if "://" in text:
        raise ConfigError(
            f"--ckpt_path {text}: a URL. Checkpoints are read only from local files, which are checked (intact, plain "
            f"data) before anything of them is loaded. Download it first, e.g. curl -L -o downloaded.ckpt '{text}', "
            "then give --ckpt_path downloaded.ckpt."
        )
    if text in CKPT_PATH_WORDS:
        return
    if not Path(text).exists():
        raise ConfigError(f"--ckpt_path {text}: no such file or folder. Give the path of a checkpoint (a *.ckpt).")
    if not Path(text).is_dir():
        return
    name = strategy if isinstance(strategy, str) else getattr(strategy, "class_path", None) or type(strategy).__name__
    if str(name).rsplit(".", 1)[-1] in SHARDED_STRATEGIES:
        return
    raise ConfigError(
        f"--ckpt_path {text} is a distributed-checkpoint folder saved by FSDP2 (--trainer.strategy "
        f"ModelParallelStrategy), and this {command or 'command'} uses the strategy {name}: only FSDP2 reads its "
        "sharded weights and optimizer states. Resume it with the strategy it was saved with: add --trainer.strategy "
        "ModelParallelStrategy (on a machine without GPUs also --trainer.devices=1: FSDP2 over one CPU process). To "
        f"evaluate or fine-tune it without FSDP2, consolidate it into one file first: lightning_cqk consolidate {text} "
        "(weights and settings, no optimizer state: it cannot resume training)."
    )
