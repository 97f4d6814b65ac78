"""Checkpoints a crashed run can always resume from: atomic files, step/time triggers, retention, RNG state.

`AtomicCheckpointIO` (installed by the CLI on every trainer whose strategy uses plain `torch.save`) writes each
checkpoint to a hidden temporary file in the target folder, fsyncs it, renames it over the target with `os.replace`
(atomic on POSIX) and fsyncs the folder. A crash, SIGKILL or full disk while writing leaves the previous file
intact and at most a `.<name>.<pid>.tmp` leftover, which `RunCheckpoint` removes at the next start. (Lightning's own
`TorchCheckpointIO` also writes through a temporary file, but first serialises the whole checkpoint into memory and
never fsyncs, so a power loss can still leave a renamed but empty file.) Loading goes through
`lightning_cqk.checkpoint.reading.load_checkpoint`: weights_only=True (a checkpoint holding other pickled objects is
refused, `UntrustedCheckpointError`), and a truncated or corrupt file raises `CorruptCheckpointError`, naming the file
and the newest intact checkpoint beside it; the zip CRCs are checked before loading (`verify`), because `torch.load`
would load damaged tensor bytes silently.

`RunCheckpoint` is a `ModelCheckpoint` for long runs:
    every_n_steps / every_minutes   save `step=00001000.ckpt` every N optimizer steps and/or every T minutes
                                    (whichever comes first), decided at optimizer-step boundaries only; with
                                    several processes the time decision is rank zero's, broadcast on logging steps
                                    (every `log_every_n_steps`: no collective on the other steps)
    last.ckpt                       after every save and when training ends; a hard link to the periodic file
                                    just written (no second write), a full atomic write where links are impossible
                                    (FSDP2's distributed-checkpoint folders: a folder of hard links to its files)
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

Every checkpoint holds the state after *every* callback of its step (issue 25 class 4): a periodic save at a
validation step first lets the checkpoint callbacks that Lightning runs after `RunCheckpoint` (BestCheckpoint) record
that validation, so `last.ckpt` knows the new best. A resumed `BestCheckpoint` keeps tracking its files when the run
directory was copied (`cp -a`: the restored paths are mapped to the copy's own files of the same name, never to the
original's), and at the start of training it settles best files that its restored state does not list (orphans):
one from a step at or before the resumed step is tracked again with the score it recorded (then the `save_top_k`
best are kept and the rest of this folder's best files pruned); one from a later step (a killed or abandoned
continuation that this run replaces) is pruned.

File names never get Lightning's `-v1` suffix. A resume starts from the intact checkpoint of the highest step
(`run_dir.resumable_checkpoint`: a periodic file written just before a kill outranks the last.ckpt not yet pointed at
it), so periodic files of later steps than the one resumed exist only after a resume from an earlier file; they are
deleted when training starts (a continuation this run replaces), so a crash of this run never resumes that one.

`lightning_cqk fit ... --ckpt_path last` resumes from the run directory's `checkpoints/last.ckpt` (Lightning looks for
`last*.ckpt` in every ModelCheckpoint's folder); with no checkpoint yet it starts afresh, so the same command line can
be used for the first launch and every restart. Tested by `tests/e2e/reliability/test_resume_sigkill.py` (a subprocess
is SIGKILLed mid-run and restarted) and `tests/e2e/reliability/test_checkpoint.py`.
"""

from __future__ import annotations

import errno
import math
import os
import re
import time
from pathlib import Path
from typing import Any

import lightning as L
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol
from lightning.fabric.utilities.seed import _collect_rng_states, _set_rng_states
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lightning_cqk.callbacks.final_validation import validation_due
from lightning_cqk.checkpoint.reading import checkpoint_problem, load_checkpoint, state_file, step_in_name
from lightning_cqk.errors import StorageFullError, storage_full_errno
from lightning_cqk.files.atomic import fsync_path, link_folder, remove_path

TMP_PATTERN = re.compile(r"^\..+\.\d+\.tmp$")


def storage_full_message(code: int, target: Path) -> str:
    """What a checkpoint write that ran out of space (or past a file-size limit) says, recorded in run.json."""
    return (
        f"{os.strerror(code)} (errno {code}, {errno.errorcode.get(code, '?')}) while writing checkpoint {target}. "
        f"Nothing was replaced: the checkpoints already in {target.parent} are intact and the partial file was "
        f"removed. Free space on that disk (`df -h {target.parent}`), then run the same command with --ckpt_path last "
        "to resume from the newest checkpoint."
    )


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
            fsync_path(target.parent)
        except (OSError, RuntimeError) as err:  # torch.save: a RuntimeError "enforce fail" whose context is the OSError
            code = storage_full_errno(err)
            if code is None:
                raise
            raise StorageFullError(code, str(target), storage_full_message(code, target)) from err
        finally:
            tmp.unlink(missing_ok=True)
        return None

    def __init__(self, verify: bool = True) -> None:
        super().__init__()
        self.verify = verify

    def load_checkpoint(self, path: Any, map_location: Any = lambda storage, loc: storage, weights_only: Any = None):
        """`checkpoint_files.load_checkpoint` for a local file: weights_only=True whatever `weights_only` says (a
        file may come from elsewhere), the zip CRCs checked first (`verify`), clear errors for truncated, corrupt or
        untrusted files. Remote files: Lightning's loader, weights_only=True as well."""
        if _is_local_file_protocol(str(path)) and Path(path).is_file():
            return load_checkpoint(path, map_location=map_location, verify=self.verify)
        return super().load_checkpoint(path, map_location=map_location, weights_only=True)


def link_or_copy_atomically(source: Path, target: Path) -> bool:
    """Make `target` a hard link to `source`, replacing it atomically; False when hard links are impossible.

    A distributed-checkpoint folder (FSDP2) becomes a folder of hard links to its files (`link_folder`).
    """
    if source.is_dir():
        try:
            link_folder(source, target)
        except OSError:
            return False
        return True
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.unlink(missing_ok=True)
        os.link(source, tmp)
        os.replace(tmp, target)
    except OSError:
        tmp.unlink(missing_ok=True)
        return False
    fsync_path(target.parent)
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
        self._decided_step: int | None = None  # the optimizer step whose save was last decided

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
                        remove_path(leftover)  # a file, or a distributed-checkpoint folder (FSDP2)
                        rank_zero_info(f"RunCheckpoint: removed {leftover}, left by an interrupted save.")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Delete this folder's periodic files of steps after the resumed one: a continuation this run replaces.

        A resume starts from the checkpoint of the highest step (`run_dir.resumable_checkpoint`), so such files
        exist only after a resume from an earlier file (`--ckpt_path .../step=00000008.ckpt`). Left in place, they
        would outrank this run's own checkpoints when it is resumed after a crash.
        """
        super().on_train_start(trainer, pl_module)  # starts the clock of every_minutes
        if not trainer.is_global_zero or not self.dirpath or not _is_local_file_protocol(str(self.dirpath)):
            return
        pattern = re.sub(r"\{[^}]*\}", "*", self.filename or "") + self.FILE_EXTENSION
        if pattern.startswith("*") or not Path(self.dirpath).is_dir():
            return  # no prefix of its own: its files cannot be told from the other callbacks' files
        for path in sorted(Path(self.dirpath).glob(pattern)):
            step = step_in_name(path)
            if step is not None and step > trainer.global_step and path.exists():
                remove_path(path)
                self.periodic = [(s, p) for s, p in self.periodic if Path(p).name != path.name]
                rank_zero_info(
                    f"RunCheckpoint: deleted {path} (step {step}), left by a continuation after the resumed step "
                    f"{trainer.global_step} that this run replaces."
                )

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any, **kwargs: Any) -> None:
        if self._should_skip_saving_checkpoint(trainer):
            return
        if self._deferred is not None and self._deferred != trainer.global_step:
            self._deferred = None  # the validation it waited for did not run: save now rather than not at all
            self.save_now(trainer)
            return
        if trainer.global_step == self._decided_step:
            return  # an accumulation micro-batch: saves are decided at optimizer-step boundaries only
        self._decided_step = trainer.global_step
        due = self.every_n_steps is not None and trainer.global_step % self.every_n_steps == 0
        if self.every_minutes is not None:
            now = time.monotonic()
            timed = self._last_time_checked is not None and now - self._last_time_checked >= 60 * self.every_minutes
            if trainer.world_size == 1:
                due = due or timed
            elif trainer.global_step % max(1, int(trainer.log_every_n_steps or 1)) == 0:
                due = bool(trainer.strategy.broadcast(due or timed))  # rank zero's clock decides, on log steps
        if due and validation_due(trainer):
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
            self._settle_later_checkpoints(trainer, pl_module)
            self.save_now(trainer)

    def _settle_later_checkpoints(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Let the checkpoint callbacks Lightning runs after this one record this validation before it is saved.

        Lightning runs checkpoint callbacks last (in their order), so every other callback has seen the validation;
        a BestCheckpoint listed after this one would update its best only after this save, which would then restore
        the previous best on resume. Their hook is idempotent per step (the later regular call does nothing).
        """
        callbacks = list(trainer.callbacks)
        for callback in callbacks[callbacks.index(self) + 1 :] if self in callbacks else []:
            if isinstance(callback, ModelCheckpoint) and not isinstance(callback, RunCheckpoint):
                callback.on_validation_end(trainer, pl_module)

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
                if mine.exists():
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

        self._scored_step: int | None = None  # the step whose validation this callback has recorded

    @property
    def state_key(self) -> str:
        return self._generate_state_key(monitor=self.monitor, mode=self.mode, best=True)

    def _ModelCheckpoint__warn_if_dir_not_empty(self, dirpath: Any) -> None:
        return  # shares the run's checkpoint folder with RunCheckpoint by design

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            if self._scored_step == trainer.global_step:
                return  # recorded already (RunCheckpoint asked first, to save the state after it)
            self._scored_step = trainer.global_step
        super().on_validation_end(trainer, pl_module)

    # ---------------------------------------------------------------------------------------- resume
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore; in a copied run directory, the paths are this folder's own files of the same names."""
        saved = state_dict.get("dirpath", self.dirpath)
        local = self.dirpath is not None and _is_local_file_protocol(str(self.dirpath))
        if saved == self.dirpath or not local:
            return super().load_state_dict(state_dict)
        folder = Path(self.dirpath)

        def mine(path: Any) -> str:
            own = folder / Path(str(path)).name if path else None
            return str(own) if own is not None and own.exists() else ""

        state = dict(state_dict, dirpath=self.dirpath)
        state["best_k_models"] = {mine(p): v for p, v in state_dict.get("best_k_models", {}).items() if mine(p)}
        state["best_model_path"] = mine(state_dict.get("best_model_path"))
        state["kth_best_model_path"] = mine(state_dict.get("kth_best_model_path"))
        state["last_model_path"] = mine(state_dict.get("last_model_path"))
        if not state["best_k_models"]:
            state.update(best_model_score=None, kth_value=self.kth_value, best_model_path="", kth_best_model_path="")
        super().load_state_dict(state)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Settle this folder's best files that the restored state does not list (module docstring)."""
        if not self.dirpath or not _is_local_file_protocol(str(self.dirpath)) or not Path(self.dirpath).is_dir():
            return
        tracked = {str(Path(p).resolve()) for p in self.best_k_models}
        pattern = re.sub(r"\{[^}]*\}", "*", self.filename or "") + self.FILE_EXTENSION
        if pattern.startswith("*"):
            return  # no prefix of its own: its files cannot be told from the other callbacks' files
        orphans = [p for p in sorted(Path(self.dirpath).glob(pattern)) if str(p.resolve()) not in tracked]
        for path in orphans:
            step, score = _recorded_score(path, self.state_key)
            if step is None or step > trainer.global_step or score is None or not math.isfinite(score):
                why = f"from step {step}, after the resumed step {trainer.global_step}" if step is not None else ""
                if trainer.is_global_zero:
                    remove_path(path)
                rank_zero_info(
                    f"BestCheckpoint: pruned {path}, a best file this run does not track ({why or 'no score'})."
                )
                continue
            import torch

            self.best_k_models[str(path)] = torch.tensor(score)
            rank_zero_info(f"BestCheckpoint: tracking {path} again ({self.monitor} {score:.6g} at step {step}).")
        if orphans:
            self._keep_top_k(trainer)

    def _keep_top_k(self, trainer: L.Trainer) -> None:
        ordered = sorted(self.best_k_models.items(), key=lambda kv: float(kv[1]), reverse=self.mode == "max")
        k = len(ordered) if self.save_top_k < 0 else self.save_top_k
        for path, _ in ordered[k:]:
            if trainer.is_global_zero and Path(path).resolve().parent == Path(self.dirpath).resolve():
                remove_path(path)
        kept = ordered[:k]
        self.best_k_models = dict(kept)
        if kept:
            self.best_model_path, self.best_model_score = kept[0]
            self.kth_best_model_path, self.kth_value = kept[-1]

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


def _recorded_score(path: Path, state_key: str) -> tuple[int | None, float | None]:
    """(step, score) a best file recorded for itself (its own BestCheckpoint state), or (None, None) if unreadable."""
    import torch

    if checkpoint_problem(path) is not None:
        return None, None
    try:
        checkpoint = torch.load(state_file(path), map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - an unreadable file is pruned, not tracked
        return None, None
    state = (checkpoint.get("callbacks") or {}).get(state_key) or {}
    scores = {Path(str(p)).name: v for p, v in (state.get("best_k_models") or {}).items()}
    score = scores.get(path.name, state.get("current_score"))
    return int(checkpoint.get("global_step", -1)), None if score is None else float(score)


def nonfinite_validation_metrics(metrics: Any) -> dict[str, float]:
    """The `val/...` metrics that are NaN or Inf: a diverged model (val/ppl overflows once val/loss > ~88.7 nats)."""
    values = {k: float(v) for k, v in metrics.items() if str(k).startswith("val/")}
    return {k: v for k, v in values.items() if not math.isfinite(v)}
