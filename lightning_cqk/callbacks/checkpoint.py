"""Checkpoints a crashed run can always resume from: atomic files, step/time triggers, retention, RNG state.

`AtomicCheckpointIO` (installed by the CLI on every trainer whose strategy uses plain `torch.save`) writes each
checkpoint to a hidden temporary file in the target folder, fsyncs it, renames it over the target with `os.replace`
(atomic on POSIX) and fsyncs the folder. A crash, SIGKILL or full disk while writing leaves the previous file
intact and at most a `.<name>.<pid>.tmp` leftover, which `RunCheckpoint` removes at the next start. (Lightning's own
`TorchCheckpointIO` also writes through a temporary file, but first serialises the whole checkpoint into memory and
never fsyncs, so a power loss can still leave a renamed but empty file.) Loading a file that is truncated or
corrupt raises `CorruptCheckpointError`, naming the file and the newest intact checkpoint beside it; the zip CRCs are
checked before loading (`verify`), because `torch.load` would load damaged tensor bytes silently.

`RunCheckpoint` is a `ModelCheckpoint` for long runs:
    every_n_steps / every_minutes   save `step=00001000.ckpt` every N optimizer steps and/or every T minutes
                                    (whichever comes first; the time decision is rank zero's, broadcast)
    last.ckpt                       after every save and when training ends; a hard link to the periodic file
                                    just written (no second write), a full atomic write where links are impossible
    keep_last / keep_every_n_steps  retention: the newest `keep_last` periodic files are kept, plus every file whose
                                    step is a multiple of `keep_every_n_steps` (milestones); last.ckpt always.
                                    Retention deletes only files in this run's own checkpoint folder: the list
                                    of periodic files restored from a checkpoint keeps an entry only when that file
                                    is in this folder (a `cp -a` copy of a run keeps managing its own copies by name;
                                    a run resumed from another run's last.ckpt never deletes that run's files)
    after validation                when a validation is due at the step of a periodic save, the save waits until
                                    that validation has finished (`on_validation_end`), so a checkpoint never stands
                                    before a validation it skipped: a run killed during a validation resumes from
                                    the checkpoint before it, retrains those steps and validates again (Lightning
                                    restores a checkpoint written before a due validation as "validation done")
    RNG state                       the torch/numpy/Python (and CUDA) generators are saved and restored, so a resumed
                                    run draws the same random numbers as the uninterrupted one
    save_on_sigterm                 SIGTERM (preemption, scancel, timeout) and a first Ctrl-C save at the end of the
                                    batch in progress, then the process exits (`lightning_cqk fit`: status 143 /
                                    130, with the command that resumes); SIGKILL loses the steps since the last save
`BestCheckpoint` keeps the best validation so far (`monitor`, default val/loss), saved right after the validation
that scored it (Lightning's step-triggered ModelCheckpoint saves the weights of step k under the score of an earlier
validation), and never keeps a non-finite score (a diverged model) as best.

File names never get Lightning's `-v1` suffix: a periodic file left by a killed run (written after the checkpoint
the run resumes from) is overwritten when the resumed run reaches that step again.

`lightning_cqk fit ... --ckpt_path last` resumes from the run directory's `checkpoints/last.ckpt` (Lightning looks for
`last*.ckpt` in every ModelCheckpoint's folder); with no checkpoint yet it starts afresh, so the same command line can
be used for the first launch and every restart. Tested by `tests/reliability/test_resume_sigkill.py` (a subprocess
is SIGKILLed mid-run and restarted) and `tests/reliability/test_checkpoint.py`.
"""

from __future__ import annotations

import math
import os
import re
import time
import zipfile
from pathlib import Path
from typing import Any

import lightning as L
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol
from lightning.fabric.utilities.seed import _collect_rng_states, _set_rng_states
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lightning_cqk.errors import ConfigError

TMP_PATTERN = re.compile(r"^\..+\.\d+\.tmp$")


class CorruptCheckpointError(ConfigError):
    """A checkpoint file that cannot be read: truncated (a crash while writing) or damaged."""


def checkpoint_problem(path: str | Path) -> str | None:
    """What is wrong with a `torch.save` checkpoint file (a zip archive), or None when it reads back intact.

    Checks the zip structure and every member's CRC: a truncated file has no central directory, a damaged one fails
    a CRC. A file that is not a zip at all, or a zip without the ``<name>/data.pkl`` that ``torch.save`` writes, is
    named as not a checkpoint. (A legacy non-zip ``torch.save`` file, a pickle, is left to ``torch.load``.) Reads
    the whole file once.
    """
    path = Path(path)
    try:
        if path.stat().st_size == 0:
            return "the file is empty"
        with path.open("rb") as f:
            head = f.read(4)
        if head[:1] != b"\x80" and head != b"PK\x03\x04":  # neither a pickle nor a zip archive
            return (
                f"it is not a checkpoint: a checkpoint is the zip archive torch.save writes, and this file starts "
                f"with {head!r}"
            )
        if head[:1] == b"\x80":
            return None
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            if not any(n == "data.pkl" or n.endswith("/data.pkl") for n in names):
                shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
                return (
                    f"it is a zip archive but not a checkpoint: torch.save writes <name>/data.pkl, and this archive "
                    f"holds {shown or 'nothing'}"
                )
            bad = archive.testzip()
    except zipfile.BadZipFile as err:
        return f"not a complete checkpoint archive ({err}); it was probably cut short while being written"
    except (OSError, EOFError, ValueError) as err:
        return f"unreadable ({type(err).__name__}: {err})"
    return None if bad is None else f"member {bad!r} fails its CRC check (the file is damaged)"


def newest_intact_checkpoint(folder: str | Path, exclude: str | Path | None = None) -> Path | None:
    """The most recently modified `*.ckpt` in `folder` (other than `exclude`) that reads back intact."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    skip = Path(exclude).resolve() if exclude is not None else None
    candidates = [p for p in folder.glob("*.ckpt") if p.is_file() and p.resolve() != skip]
    for candidate in sorted(candidates, key=lambda p: p.stat().st_mtime, reverse=True):
        if checkpoint_problem(candidate) is None:
            return candidate
    return None


def corrupt_checkpoint_message(path: str | Path, problem: str) -> str:
    """The error for an unreadable checkpoint: which file, what is wrong, and the newest good one to use instead."""
    good = newest_intact_checkpoint(Path(path).parent, exclude=path)
    fix = (
        f"The newest intact checkpoint beside it is {good}: resume with `--ckpt_path {good}`, or delete the broken "
        "file."
        if good is not None
        else "There is no intact checkpoint beside it: start the run again without --ckpt_path (or point --ckpt_path "
        "at a copy from elsewhere)."
    )
    return f"Checkpoint {path} cannot be loaded: {problem}. {fix}"


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # e.g. Windows: directories cannot be opened; the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class AtomicCheckpointIO(TorchCheckpointIO):
    """`torch.save` to a temporary file + fsync + `os.replace`; clear errors for truncated or corrupt files.

    Remote paths (`s3://...`) use Lightning's own transaction-based save. See the module docstring.

    Args:
        verify: before loading a local checkpoint, check every member's CRC (one extra sequential read of the file,
            about a second per GB): `torch.load` itself does not, so damaged tensor bytes would load silently.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None or not _is_local_file_protocol(str(path)):
            return super().save_checkpoint(checkpoint, path, storage_options)
        import torch

        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
            _fsync_dir(target.parent)
        finally:
            tmp.unlink(missing_ok=True)
        return None

    def __init__(self, verify: bool = True) -> None:
        super().__init__()
        self.verify = verify

    def load_checkpoint(self, path: Any, map_location: Any = lambda storage, loc: storage, weights_only: Any = None):
        # torch.load does not check the zip CRCs: damaged tensor bytes would load silently as wrong weights.
        if self.verify and _is_local_file_protocol(str(path)) and Path(path).is_file():
            problem = checkpoint_problem(path)
            if problem is not None:
                raise CorruptCheckpointError(corrupt_checkpoint_message(path, problem))
        try:
            return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        except (FileNotFoundError, PermissionError, MemoryError):
            raise
        except Exception as err:
            problem = checkpoint_problem(path) if _is_local_file_protocol(str(path)) else None
            if problem is None:  # an intact file that fails for another reason: keep the original error
                raise
            raise CorruptCheckpointError(corrupt_checkpoint_message(path, problem)) from err


def link_or_copy_atomically(source: Path, target: Path) -> bool:
    """Make `target` a hard link to `source`, replacing it atomically; False when hard links are impossible."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.unlink(missing_ok=True)
        os.link(source, tmp)
        os.replace(tmp, target)
    except OSError:
        tmp.unlink(missing_ok=True)
        return False
    _fsync_dir(target.parent)
    return True


class RunCheckpoint(ModelCheckpoint):
    """Periodic checkpoints (steps and/or minutes) with retention, `last.ckpt` and RNG state (module docstring).

    Args:
        every_n_steps: save every this many optimizer steps (None: no step trigger).
        every_minutes: also save when this many wall-clock minutes have passed since the last save or the start of
            training (validation included; None: off).
        keep_last: how many periodic files to keep, newest first (None: all). last.ckpt is always kept.
        keep_every_n_steps: never delete the periodic files of steps that are multiples of this (None: none).
        dirpath: where to write (None: `<run directory>/checkpoints`).
        filename: name pattern of the periodic files (Lightning's format; `{step}` is the optimizer step).
        restore_rng: save the random generators' states and restore them on resume.
        save_on_sigterm: save when the process gets SIGTERM (preemption), at the end of the batch in progress.
        save_weights_only: save only the weights (a run cannot resume from such files).
    """

    def __init__(
        self,
        every_n_steps: int | None = 1000,
        every_minutes: float | None = None,
        keep_last: int | None = 3,
        keep_every_n_steps: int | None = None,
        dirpath: str | None = None,
        filename: str = "step={step:08d}",
        restore_rng: bool = True,
        save_on_sigterm: bool = True,
        save_weights_only: bool = False,
    ) -> None:
        if every_n_steps is None and every_minutes is None:
            raise ValueError(
                "RunCheckpoint needs a trigger: set every_n_steps (e.g. 1000) and/or every_minutes (e.g. 30)."
            )
        for name, value in {"every_n_steps": every_n_steps, "keep_every_n_steps": keep_every_n_steps}.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"RunCheckpoint.{name} must be a positive integer or null, got {value!r}.")
        if every_minutes is not None and not every_minutes > 0:
            raise ValueError(f"RunCheckpoint.every_minutes must be positive or null, got {every_minutes!r}.")
        if keep_last is not None and (isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1):
            raise ValueError(
                f"RunCheckpoint.keep_last must be a positive integer (or null to keep every file), got {keep_last!r}; "
                "last.ckpt is kept regardless."
            )
        super().__init__(
            dirpath=dirpath,
            filename=filename,
            monitor=None,
            save_last=True,
            save_top_k=-1,
            save_weights_only=save_weights_only,
            auto_insert_metric_name=False,
            every_n_train_steps=None,
            train_time_interval=None,
            every_n_epochs=0,  # no epoch trigger: streaming runs are counted in steps
            enable_version_counter=False,
        )
        self.every_n_steps = every_n_steps
        self.every_minutes = every_minutes
        self.keep_last = keep_last
        self.keep_every_n_steps = keep_every_n_steps
        self.restore_rng = restore_rng
        self.save_on_sigterm = save_on_sigterm
        self.periodic: list[tuple[int, str]] = []  # (step, path) of the periodic files this run keeps
        self._deferred: int | None = None  # a save due at this step, waiting for the step's validation

    @property
    def state_key(self) -> str:
        return self._generate_state_key(every_n_steps=self.every_n_steps, every_minutes=self.every_minutes)

    # ------------------------------------------------------------------------------------------- hooks
    def _ModelCheckpoint__warn_if_dir_not_empty(self, dirpath: Any) -> None:
        return  # a resumed run writes into its own non-empty folder by design; fresh runs get fresh folders

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if trainer.is_global_zero and self.dirpath and _is_local_file_protocol(str(self.dirpath)):
            folder = Path(self.dirpath)
            if folder.is_dir():  # leftovers of a save that was killed (the run lock rules out a live writer)
                for leftover in folder.iterdir():
                    if TMP_PATTERN.match(leftover.name):
                        leftover.unlink(missing_ok=True)
                        rank_zero_info(f"RunCheckpoint: removed {leftover}, left by an interrupted save.")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any, **kwargs: Any) -> None:
        if self._should_skip_saving_checkpoint(trainer):
            return
        if self._deferred is not None and self._deferred != trainer.global_step:
            self._deferred = None  # the validation it waited for did not run: save now rather than not at all
            self.save_now(trainer)
            return
        due = self.every_n_steps is not None and trainer.global_step % self.every_n_steps == 0
        if self.every_minutes is not None:
            now = time.monotonic()
            timed = self._last_time_checked is not None and now - self._last_time_checked >= 60 * self.every_minutes
            due = bool(trainer.strategy.broadcast(due or timed))  # rank zero's clock decides for every rank
        if due and _validation_due(trainer):
            self._deferred = trainer.global_step  # saved in on_validation_end, once the validation is done
        elif due:
            self.save_now(trainer)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        """On SIGTERM (preemption, `scancel`, `kill`, `timeout`) or a first Ctrl-C (which `RunSession` turns into the
        same clean stop), save before exiting: Lightning raises `SIGTERMException` only at a batch boundary, where
        the state is as consistent as at any periodic save."""
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        if not (self.save_on_sigterm and isinstance(exception, SIGTERMException)):
            return
        if self._last_global_step_saved == trainer.global_step:
            return  # saved at this very step already
        if trainer.validating or trainer.sanity_checking:
            rank_zero_info(
                f"RunCheckpoint: stopped during validation at step {trainer.global_step}, not at a training boundary; "
                f"the last checkpoint ({self.last_model_path or 'none yet'}) stands."
            )
            return
        self.save_now(trainer)
        rank_zero_info(
            f"RunCheckpoint: stop signal received; saved step {trainer.global_step} to {self.last_model_path}."
        )

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Write a save that was due at this step, now that the step's validation has completed."""
        if self._deferred is None or trainer.sanity_checking or trainer.state.fn != "fit":
            return  # saving is driven by steps and time only (ModelCheckpoint would also save after validation)
        if self._deferred == trainer.global_step:
            self._deferred = None
            self.save_now(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        return

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The final state always lands in last.ckpt (and in a periodic file when a trigger falls on it)."""
        if self._deferred is not None and not trainer.sanity_checking:  # its validation did not happen after all
            self._deferred = None
            if self._last_global_step_saved != trainer.global_step:
                self.save_now(trainer)
        if self._last_global_step_saved != trainer.global_step and not trainer.sanity_checking:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def save_now(self, trainer: L.Trainer) -> None:
        """Write the periodic file of this step, point last.ckpt at it and apply the retention policy."""
        candidates = self._monitor_candidates(trainer)
        self.last_model_path = self.format_checkpoint_name(candidates, self.CHECKPOINT_NAME_LAST)  # saved in state
        path = self.format_checkpoint_name(candidates)
        self.periodic = [(s, p) for s, p in self.periodic if p != path] + [(trainer.global_step, path)]
        self.best_model_path = path
        self._save_checkpoint(trainer, path)
        self._last_time_checked = time.monotonic()
        self._save_last_checkpoint(trainer, candidates)
        self._apply_retention(trainer)

    def _save_last_checkpoint(self, trainer: L.Trainer, monitor_candidates: dict[str, Any]) -> None:
        path = self.format_checkpoint_name(monitor_candidates, self.CHECKPOINT_NAME_LAST)
        self.last_model_path = path
        just_saved = self._last_checkpoint_saved if self._last_global_step_saved == trainer.global_step else ""
        if just_saved and just_saved != path and _is_local_file_protocol(str(path)):
            linked = link_or_copy_atomically(Path(just_saved), Path(path)) if trainer.is_global_zero else True
            if trainer.strategy.broadcast(linked):
                trainer.strategy.barrier()
                return
        self._save_checkpoint(trainer, path)

    def _apply_retention(self, trainer: L.Trainer) -> None:
        if self.keep_last is None:
            return
        ordered = sorted(self.periodic)
        keep = {p for _, p in ordered[-self.keep_last :]}
        resumed_from = str(Path(trainer.ckpt_path).resolve()) if trainer.ckpt_path else None
        for step, path in ordered:
            milestone = self.keep_every_n_steps is not None and step % self.keep_every_n_steps == 0
            if path in keep or milestone or str(Path(path).resolve()) == resumed_from:
                continue
            if not self._owns(path):  # never delete what is not in this run's checkpoint folder
                self.periodic.remove((step, path))
                continue
            trainer.strategy.remove_checkpoint(path)
            self.periodic.remove((step, path))

    # ---------------------------------------------------------------------------------------- resume
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["periodic"] = [list(item) for item in self.periodic]
        if self.restore_rng:
            rng = _collect_rng_states(include_cuda=True)
            if "numpy" in rng:  # plain Python values: checkpoints must load with torch.load(weights_only=True)
                kind, keys, pos, has_gauss, cached = rng["numpy"]
                rng["numpy"] = [str(kind), keys.tolist(), int(pos), int(has_gauss), float(cached)]
            state["rng"] = rng
        return state

    def _owns(self, path: str) -> bool:
        """Whether `path` lies directly in this callback's checkpoint folder."""
        if not self.dirpath:
            return False
        if not _is_local_file_protocol(str(self.dirpath)):
            return str(path).rsplit("/", 1)[0] == str(self.dirpath).rstrip("/")
        return Path(path).resolve().parent == Path(self.dirpath).resolve()

    def _own_periodic(self, saved: list[Any]) -> list[tuple[int, str]]:
        """The restored periodic list, restricted to files of this run's folder (by name for a copied run)."""
        own: list[tuple[int, str]] = []
        for step, path in saved:
            if self._owns(str(path)):
                own.append((int(step), str(path)))
            elif self.dirpath and _is_local_file_protocol(str(self.dirpath)):
                mine = Path(self.dirpath) / Path(str(path)).name  # a copy of the run: its own file of that name
                if mine.is_file():
                    own.append((int(step), str(mine)))
        return own

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self.periodic = self._own_periodic(state_dict.get("periodic", []))
        if self.restore_rng and state_dict.get("rng") is not None:
            rng = dict(state_dict["rng"])
            import torch

            if not torch.cuda.is_available() or len(rng.get("torch.cuda", [])) != torch.cuda.device_count():
                rng.pop("torch.cuda", None)  # saved on another machine: keep this one's CUDA generators
            if "numpy" in rng:
                import numpy as np

                kind, keys, pos, has_gauss, cached = rng["numpy"]
                rng["numpy"] = (kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached)
            _set_rng_states(rng)


def _validation_due(trainer: L.Trainer) -> bool:
    """Whether the fit loop will validate right after this training batch (Lightning's own decision)."""
    loop = trainer.fit_loop.epoch_loop
    try:
        return bool(loop._should_check_val_fx(getattr(trainer.fit_loop, "_data_fetcher", None)))
    except Exception:  # another loop implementation: save at once, as before
        return False


class BestCheckpoint(ModelCheckpoint):
    """The best `save_top_k` checkpoints by a validation metric, saved right after that validation (module docstring).

    A validation with a non-finite score or any non-finite `val/` metric (NaN/Inf; val/ppl overflows once val/loss
    exceeds ~88.7 nats: a diverged model) is never kept, with a warning naming the step; so when every validation so
    far is non-finite there is no best file.

    Args:
        monitor: the metric (logged in validation), default val/loss.
        mode: "min" or "max".
        save_top_k: how many best files to keep.
        filename: name pattern (Lightning's format; `{step}` is the optimizer step).
        dirpath: where to write (None: `<run directory>/checkpoints`).
        save_weights_only: save only the weights.
    """

    def __init__(
        self,
        monitor: str = "val/loss",
        mode: str = "min",
        save_top_k: int = 1,
        filename: str = "best-{step}",
        dirpath: str | None = None,
        save_weights_only: bool = False,
    ) -> None:
        super().__init__(
            dirpath=dirpath,
            filename=filename,
            monitor=monitor,
            mode=mode,
            save_top_k=save_top_k,
            save_last=False,
            save_weights_only=save_weights_only,
            every_n_epochs=1,  # with streaming data one epoch is the whole run: this means every validation
            save_on_train_epoch_end=False,
            enable_version_counter=False,
        )

    @property
    def state_key(self) -> str:
        return self._generate_state_key(monitor=self.monitor, mode=self.mode, best=True)

    def _ModelCheckpoint__warn_if_dir_not_empty(self, dirpath: Any) -> None:
        return  # shares the run's checkpoint folder with RunCheckpoint by design

    def check_monitor_top_k(self, trainer: L.Trainer, current: Any = None) -> bool:
        bad = nonfinite_validation_metrics(trainer.callback_metrics)
        if current is not None and not math.isfinite(float(current)):
            bad = {self.monitor: float(current), **bad}
        if bad:
            detail = ", ".join(f"{k} {v}" for k, v in bad.items())
            rank_zero_warn(
                f"BestCheckpoint: step {trainer.global_step}: {detail} (non-finite: the model diverged); not kept as "
                "best."
            )
            return False
        return super().check_monitor_top_k(trainer, current)


def nonfinite_validation_metrics(metrics: Any) -> dict[str, float]:
    """The `val/...` metrics that are NaN or Inf: a diverged model (val/ppl overflows once val/loss > ~88.7 nats)."""
    values = {k: float(v) for k, v in metrics.items() if str(k).startswith("val/")}
    return {k: v for k, v in values.items() if not math.isfinite(v)}
