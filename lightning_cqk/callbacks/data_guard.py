"""DataFolderGuard: a run stops, and says why, when the token shards it reads change under it (issue 25 class 2).

The DataModule records each data folder's fingerprint when it sets up (``integrity.shard_fingerprint``, under its
shared hold: ``data/folder_lock.py``). This callback (added by ``lightning_cqk fit``) compares it with the folder as it
is now

    before every validation     ``files`` (inode, size, mtime of the manifest, indexes and chunks): a validation on
                                other data than the run trained on would be a silently wrong number
    before every checkpoint     the same: a checkpoint never records training on changed data as the run's own
    on resume                   ``content`` of the shards the checkpoint was trained on (saved in the checkpoint)
                                against the shards now: a rebuild with other text, tokenizer or chunking is refused;
                                an identical rebuild (same content, new files) is accepted with a note

and stops the run with ``DataFolderChanged`` when they differ: ``run.json`` records the attempt as failed with that
message, and ``summary.json`` gets ``data_changed`` (the folder, the step, what differs) and ``finished: false``.
The lock makes this rare (``prepare`` refuses to rebuild a folder a live run reads); the check covers what the lock
cannot: file systems that do not carry locks between hosts, copies by hand, older versions of this package.
``s3://`` data dirs are not fingerprinted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from lightning_cqk.data.integrity import shard_fingerprint
from lightning_cqk.errors import UserError
from lightning_cqk.files.atomic import write_json_atomically


class DataFolderChanged(UserError, RuntimeError):
    """The shards a run reads changed under it (or since the checkpoint it resumes from)."""


class DataFolderGuard(L.Callback):
    """Stop a run whose shards changed (module docstring); keeps the shards' fingerprints in its checkpoints."""

    def __init__(self) -> None:
        self.restored: dict[str, dict[str, str]] | None = None  # from the checkpoint this run resumes from
        self._trainer: L.Trainer | None = None

    @property
    def state_key(self) -> str:
        return "DataFolderGuard"

    @staticmethod
    def started_with(trainer: L.Trainer) -> dict[str, dict[str, str]]:
        """{data_dir: fingerprint} recorded by the DataModule at setup ({} for a DataModule without them)."""
        return dict(getattr(getattr(trainer, "datamodule", None), "fingerprints", None) or {})

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.restored:
            return
        now = self.started_with(trainer)
        for folder, before in self.restored.items():
            current = now.get(folder)
            if current is None or not before.get("content") or not current.get("content"):
                continue
            if current["content"] != before["content"]:
                self._stop(
                    trainer,
                    folder,
                    f"on resume at step {trainer.global_step}: the checkpoint was trained on other shards than "
                    f"{folder} holds now (it was rebuilt with other text, settings or chunking since)",
                    "A resumed run must read the data it was trained on. Resume it on a copy of the original shards, "
                    "or start a new run on the new ones (drop --ckpt_path; --on_unfinished new)",
                )
            if current.get("files") != before.get("files"):
                rank_zero_info(f"data: {folder} was rebuilt since the checkpoint, with identical content; resuming.")

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        self._check(trainer, f"before the validation at step {trainer.global_step}", agree=True)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        self._check(trainer, f"before saving the checkpoint of step {trainer.global_step}", agree=False)

    def _check(self, trainer: L.Trainer, when: str, agree: bool) -> None:
        changed = [f for f, fp in self.started_with(trainer).items() if fp and shard_fingerprint(f) != fp]
        if agree and trainer.world_size > 1:  # one rank's view decides for all: no rank goes on alone
            if trainer.strategy.reduce_boolean_decision(bool(changed), all=False) and not changed:
                changed = list(self.started_with(trainer))
        if changed:
            self._stop(
                trainer,
                ", ".join(changed),
                f"{when}: its manifest, indexes or chunk files are not the ones this run set up with (rebuilt, "
                "replaced or copied over while the run read them)",
                "The steps since then may have trained on other data; the last checkpoint written before this point "
                "stands. Rebuild the data into its own folder and start a new run on it; never prepare into a "
                "data_dir that a run reads (prepare refuses where the file system carries locks)",
            )

    def _stop(self, trainer: L.Trainer, folder: str, what: str, fix: str) -> None:
        message = f"The token shards at {folder} changed under this run, {what}. {fix}."
        if trainer.is_global_zero and trainer.logger is not None and trainer.logger.log_dir:
            path = Path(trainer.logger.log_dir) / "summary.json"
            try:
                summary = json.loads(path.read_text()) if path.is_file() else {}
            except (OSError, ValueError):
                summary = {}
            summary.update(finished=False, data_changed={"folder": folder, "step": trainer.global_step, "why": message})
            write_json_atomically(path, summary)
        raise DataFolderChanged(message)

    # ---------------------------------------------------------------------------------------- resume
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._trainer = trainer

    def state_dict(self) -> dict[str, Any]:
        trainer = getattr(self, "_trainer", None)
        return {"fingerprints": self.started_with(trainer) if trainer is not None else dict(self.restored or {})}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.restored = dict(state_dict.get("fingerprints") or {})
