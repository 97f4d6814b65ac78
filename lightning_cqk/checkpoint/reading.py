"""Reading checkpoint files: whether one is intact, and loading one without running code from it.

Every `torch.load` of the package goes through `load_checkpoint`: `generate`, `eval`, `glue`, `mc-eval` and the
downstream `--model.checkpoint` (`inference/pretrained.py`), `fit`/`validate`/`test`/`predict --ckpt_path`
(`AtomicCheckpointIO`, and the settings `cli/trainer.py` reads first) and the NaN guard's rollback. A checkpoint may
come from elsewhere (a colleague, a download), and a pickle can run any code while it loads, so:

* **weights_only.** Files are read with `torch.load(weights_only=True)`: tensors, plain Python values (dict, list,
  tuple, str, numbers, None) and the few types torch allows by default. `lightning_cqk fit` writes nothing else
  (checked on real checkpoints by `tests/e2e/reliability/test_untrusted_checkpoints.py`: the RNG states are stored as
  plain lists, the model's settings as dicts). `TRUSTED_GLOBALS` adds the one kind of object a run configured from
  Python may leave in its hyper-parameters: `pathlib` paths, whose construction runs no code.
* **Refused, by name.** A file holding any other pickled object (a class instance, `os.system`, ...) is refused
  before anything of it is loaded: `UntrustedCheckpointError` names the file and the objects, says why, and how to
  proceed with a file one trusts (copy its weights and settings into a plain file once).
* **Intact.** The zip CRCs are checked first (`checkpoint_problem`; `torch.load` does not, so damaged tensor bytes
  would load silently); a truncated or damaged file is `CorruptCheckpointError`, "truncated or corrupt", with the
  newest intact checkpoint beside it: the one with the highest step (`checkpoint_step`), never the most recently
  modified (a copy or restore changes modification times).

**Distributed-checkpoint folders.** FSDP2 (`--trainer.strategy ModelParallelStrategy`) saves a checkpoint as a folder of
the same name (`last.ckpt/`, `step=00000100.ckpt/`): torch.distributed.checkpoint's shards and their index `.metadata`
(written last, once every shard is complete), and Lightning's `meta.pt`, a `torch.save` file with the rest of the state
(step, loops, callbacks, hyper-parameters; rank 0 writes it after the shards). Every function here takes such a folder
where it takes a file: a folder is intact when its index reads back safely, every shard file it names is there with its
bytes, and its meta.pt is intact (`checkpoint_problem`, `folder_problem`: the index read by a restricted unpickler; an
index that asks for code is refused, never passed over), its step is meta.pt's, and `load_checkpoint` returns meta.pt's
content (the sharded weights and optimizer states are the strategy's to load, through `checkpoint_folder`;
`atomic_files.replace_folder` puts a folder written under a temporary name in place). A folder is never loaded where
weights are needed (`generate`, `eval`, `glue`): `refuse_checkpoint_folder` names the command that consolidates it into
one file first (`CONSOLIDATE`); the NaN guard's rollback finds no weights in one and does not roll back to it.

Standard library only at import (torch is imported when a file is loaded): `run/directory.py` and the light command line
use `checkpoint_problem`.
"""

from __future__ import annotations

import os
import pathlib
import pickle
import re
import zipfile
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from lightning_cqk.errors import ConfigError

#: Objects other than tensors and plain values that a checkpoint of this framework may hold, allowed by
#: `torch.serialization.safe_globals` while loading. Constructing them runs no code of the file.
TRUSTED_GLOBALS: tuple[type, ...] = (
    pathlib.PosixPath,
    pathlib.WindowsPath,
    pathlib.PurePosixPath,
    pathlib.PureWindowsPath,
)


#: Inside a distributed-checkpoint folder: Lightning's `torch.save` file of everything but the sharded tensors
#: (`lightning.fabric.utilities.load._METADATA_FILENAME`), and torch.distributed.checkpoint's index of the shards.
META_NAME = "meta.pt"
SHARD_INDEX_NAME = ".metadata"
#: How to turn a distributed-checkpoint folder into one file that `generate`, `eval` and `--model.checkpoint` load.
CONSOLIDATE = "lightning_cqk consolidate {path}"


class CorruptCheckpointError(ConfigError):
    """A checkpoint file that cannot be read: truncated (a crash while writing), damaged, or not a checkpoint."""


class UntrustedCheckpointError(ConfigError):
    """A checkpoint holding a pickled object that is not plain data: loading it could run code from the file."""


# --------------------------------------------------------------------------------------------------- intact?
def state_file(path: str | Path) -> Path:
    """The `torch.save` file that holds a checkpoint's step and settings: the file itself, or a folder's meta.pt."""
    path = Path(path)
    return path / META_NAME if path.is_dir() else path


def checkpoint_problem(path: str | Path) -> str | None:
    """What is wrong with a `torch.save` checkpoint file (a zip archive), or None when it reads back intact.

    Checks the zip structure and every member's CRC: a truncated file has no central directory, a damaged one fails
    a CRC. A file that is not a zip at all, or a zip without the ``<name>/data.pkl`` that ``torch.save`` writes, is
    named as not a checkpoint. (A legacy non-zip ``torch.save`` file, a pickle, is left to ``torch.load``.) Reads
    the whole file once. A distributed-checkpoint folder is intact when its shard index `.metadata` (written once
    every shard is complete) reads back safely, every shard it names is there (`folder_problem`) and its `meta.pt`
    is intact. An index that asks for code raises `UntrustedCheckpointError`.
    """
    path = Path(path)
    if path.is_dir():
        for name in (SHARD_INDEX_NAME, META_NAME):
            if not (path / name).is_file():
                return (
                    f"a distributed-checkpoint folder without its {name} (its save was cut short, or it is not a "
                    "checkpoint)"
                )
        problem = checkpoint_problem(path / META_NAME)
        if problem is not None:
            return f"its {META_NAME} is damaged: {problem}"
        return folder_problem(path)
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


# ----------------------------------------------------------------------------- a folder's index, read safely
_METADATA = "torch.distributed.checkpoint.metadata"
#: The globals an index written by torch.distributed.checkpoint is made of: (module, name). Dtypes are added by
#: `_IndexUnpickler` (any `torch.<name>` that is a `torch.dtype`).
INDEX_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    {
        (_METADATA, "Metadata"),
        (_METADATA, "MetadataIndex"),
        (_METADATA, "StorageMeta"),
        (_METADATA, "TensorProperties"),
        (_METADATA, "TensorStorageMetadata"),
        (_METADATA, "BytesStorageMetadata"),
        (_METADATA, "ChunkStorageMetadata"),
        (_METADATA, "_MEM_FORMAT_ENCODING"),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch.serialization", "_get_layout"),  # a layout from its name ("torch.strided"): a dictionary look-up
        ("torch", "Size"),
        ("collections", "OrderedDict"),
        ("pathlib", "PosixPath"),
        ("pathlib", "WindowsPath"),
        ("pathlib", "PurePosixPath"),
        ("pathlib", "PureWindowsPath"),
    }
)


class _IndexUnpickler(pickle.Unpickler):
    """Resolves only `INDEX_GLOBALS` and torch dtypes; names every other global it meets instead of importing it."""

    def __init__(self, stream: Any, path: Path) -> None:
        super().__init__(stream)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        import torch

        if (module, name) in INDEX_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UntrustedCheckpointError(
            f"Checkpoint folder {self.path.parent} has an index ({self.path.name}) that asks for {module}.{name}, "
            "which a distributed-checkpoint index never holds: unpickling it could run code from the file, so the "
            "folder is refused. Do not use a folder you cannot vouch for; ask its owner for the run's config.yaml and "
            "train it again, or for a consolidated checkpoint file (lightning_cqk consolidate), which is read safely."
        )


def _index_or_problem(folder: Path) -> tuple[Any, str | None]:
    """(the index, None), or (None, what is wrong with it); an index asking for code raises (`_IndexUnpickler`)."""
    from torch.distributed.checkpoint.metadata import Metadata

    path = folder / SHARD_INDEX_NAME
    try:
        with path.open("rb") as stream:
            index = _IndexUnpickler(stream, path).load()
    except UntrustedCheckpointError:
        raise
    except (OSError, EOFError, pickle.UnpicklingError, ValueError, TypeError, KeyError, AttributeError) as err:
        return None, f"its index {SHARD_INDEX_NAME} does not read back ({type(err).__name__}: {err})"
    if not isinstance(index, Metadata) or not isinstance(index.storage_data, dict):
        return None, f"its {SHARD_INDEX_NAME} is not a distributed-checkpoint index (it holds {type(index).__name__})"
    return index, None


def read_index(folder: str | Path) -> Any:
    """The folder's index (`torch.distributed.checkpoint.metadata.Metadata`), unpickled with `_IndexUnpickler`.

    Raises:
        UntrustedCheckpointError: the index names a global outside `INDEX_GLOBALS`.
        CorruptCheckpointError: it is missing, cut short, not a pickle, or not an index.
    """
    folder = Path(folder)
    index, problem = _index_or_problem(folder)
    if problem is not None:
        raise CorruptCheckpointError(corrupt_checkpoint_message(folder, problem))
    return index


def shard_problems(folder: str | Path, index: Any) -> list[str]:
    """The files `index` names that are not inside `folder`, missing, or shorter than the bytes it reads from them."""
    folder = Path(folder)
    needed: dict[str, int] = {}
    for info in index.storage_data.values():
        name = str(getattr(info, "relative_path", ""))
        end = int(getattr(info, "offset", 0) or 0) + int(getattr(info, "length", 0) or 0)
        needed[name] = max(needed.get(name, 0), end)
    problems = []
    for name, end in sorted(needed.items()):
        parts = PurePosixPath(name).parts
        if not name or PurePosixPath(name).is_absolute() or ".." in parts or "\\" in name:
            problems.append(f"{name!r} (not a file name inside the folder)")
            continue
        path = folder / name
        if not path.is_file():
            problems.append(f"{name} (missing)" if not path.is_symlink() else f"{name} (a dangling link)")
        elif path.stat().st_size < end:
            problems.append(f"{name} ({path.stat().st_size} bytes, the index reads up to byte {end}: cut short)")
    return problems


def folder_problem(folder: str | Path) -> str | None:
    """What is wrong with a distributed-checkpoint folder's index and shards, or None (the index read safely).

    Raises `UntrustedCheckpointError` for an index that asks for code (never a mere "problem": a resume must not
    quietly pass over a planted folder for an older one, it must say so).
    """
    index, problem = _index_or_problem(Path(folder))
    if problem is not None:
        return problem
    problems = shard_problems(folder, index)
    if problems:
        return f"the shard files its index names are not all there: {', '.join(problems)}"
    return None


# ------------------------------------------------------------------------------------------------- which step?
STEP_IN_NAME = re.compile(r"step=(\d+)")


def step_in_name(path: str | Path) -> int | None:
    """The optimizer step a checkpoint's name states (``step=00000016.ckpt``, ``best-step=16.ckpt``), else None."""
    match = STEP_IN_NAME.search(Path(path).name)
    return int(match.group(1)) if match else None


def saved_step(path: str | Path) -> int | None:
    """The ``global_step`` a checkpoint file holds, or None when it cannot be read as plain data.

    Only the file's pickle is read (its tensors are memory-mapped, not loaded), with `weights_only` and the zip CRCs
    left to the caller: this answers "which step", not "is it intact".
    """
    import torch

    path = state_file(path)
    try:
        with torch.serialization.safe_globals(list(TRUSTED_GLOBALS)):
            checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except Exception:  # noqa: BLE001 - unreadable, untrusted or not a checkpoint: its step is unknown
        return None
    step = checkpoint.get("global_step") if isinstance(checkpoint, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def checkpoint_step(path: str | Path, siblings: Sequence[Path] = ()) -> int | None:
    """The optimizer step of a checkpoint file, never its modification time (a copy or restore changes that).

    From its name (``step=<N>``); for a file without one (``last.ckpt``) from the sibling it is a hard link of
    (`RunCheckpoint` links last.ckpt to the periodic file it just wrote); else read from the file (`saved_step`).
    """
    path = Path(path)
    named = step_in_name(path)
    if named is not None:
        return named
    for sibling in siblings:
        sibling_step = step_in_name(sibling)
        if sibling_step is not None and sibling != path and same_checkpoint(path, sibling):
            return sibling_step
    return saved_step(path)


def same_checkpoint(a: Path, b: Path) -> bool:
    """Whether two checkpoints are one (hard links of one file; for folders, of one meta.pt)."""
    try:
        return os.path.samefile(state_file(a), state_file(b))
    except OSError:
        return False


def newest_intact_checkpoint(folder: str | Path, exclude: str | Path | None = None) -> Path | None:
    """The `*.ckpt` in `folder` (other than `exclude`) with the highest optimizer step that reads back intact.

    Ranked by step (`checkpoint_step`), never by modification time: after a `cp -r`, an rsync without `-t` or a
    restore from a backup the times say nothing about which file is newest. Files whose step cannot be told come
    last; files of one step by name, so the choice never depends on the order of the directory listing.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return None
    skip = Path(exclude).resolve() if exclude is not None else None
    candidates = [p for p in folder.glob("*.ckpt") if p.exists() and p.resolve() != skip]
    ranked = sorted(candidates, key=lambda p: _step_rank(p, candidates), reverse=True)
    return next((p for p in ranked if checkpoint_problem(p) is None), None)


def _step_rank(path: Path, siblings: Sequence[Path]) -> tuple[int, int, str]:
    """Sort key, highest first: a known step before an unknown one, then the step, then the name."""
    step = checkpoint_step(path, siblings)
    return (step is not None, step if step is not None else -1, path.name)


def corrupt_checkpoint_message(path: str | Path, problem: str) -> str:
    """The error for an unreadable checkpoint: which file, what is wrong, and the newest good one to use instead."""
    good = newest_intact_checkpoint(Path(path).parent, exclude=path)
    fix = (
        f"The newest intact checkpoint beside it is {good}: use that one (to resume: `--ckpt_path {good}`), or "
        "delete the broken file."
        if good is not None
        else "There is no intact checkpoint beside it: use another checkpoint (to resume a run: start it again "
        "without --ckpt_path, or point --ckpt_path at a copy from elsewhere)."
    )
    return (
        f"Checkpoint {path} cannot be loaded: {problem}. The file is truncated or corrupt (or not a checkpoint). {fix}"
    )


# ----------------------------------------------------------------------------------------------- trusted?
def untrusted_message(path: str | Path, objects: list[str] | str) -> str:
    """The refusal of a checkpoint that holds pickled objects other than plain data."""
    what = ", ".join(sorted(objects)) if isinstance(objects, list) else objects
    plain = Path(path).with_name(Path(path).stem + ".plain.ckpt")
    keys = "('state_dict', 'hyper_parameters', 'datamodule_hyper_parameters', 'tokens_seen')"
    return (
        f"Checkpoint {path} holds pickled objects that are not plain data ({what}): loading it could run code from "
        "the file, so it is refused (checkpoints are read with torch.load(weights_only=True); `lightning_cqk fit` "
        "writes only tensors and plain values). Do not use a file you cannot vouch for. If you trust it, copy its "
        f"weights and settings into a plain file once and give that one (it cannot resume training: no optimizer "
        f"state): python -c \"import torch; c = torch.load('{path}', weights_only=False); "
        f"torch.save({{k: c[k] for k in {keys} if k in c}}, '{plain}')\""
    )


def untrusted_objects(path: str | Path) -> list[str]:
    """The pickled globals of a zip checkpoint that neither torch nor `TRUSTED_GLOBALS` allow (read, not run)."""
    import torch

    with torch.serialization.safe_globals(list(TRUSTED_GLOBALS)):
        return sorted(torch.serialization.get_unsafe_globals_in_checkpoint(str(path)))


def check_checkpoint(path: str | Path) -> None:
    """Refuse a checkpoint that is truncated, corrupt or holds untrusted objects, without loading its tensors.

    For a caller that must fail before another library gets to the file (e.g. before jsonargparse instantiates a
    model whose constructor loads it, and would bury the message in its own).
    """
    path = Path(path)
    problem = checkpoint_problem(path)
    if problem is not None:
        raise CorruptCheckpointError(corrupt_checkpoint_message(path, problem))
    path = state_file(path)
    if zipfile.is_zipfile(path):
        objects = untrusted_objects(path)
        if objects:
            raise UntrustedCheckpointError(untrusted_message(path, objects))
    else:  # a legacy (non-zip) torch.save file: only loading it tells
        load_checkpoint(path, verify=False)


# ----------------------------------------------------------------------------------------------------- load
def load_checkpoint(path: str | Path, map_location: Any = "cpu", verify: bool = True) -> Any:
    """`torch.load(path, weights_only=True)` with `TRUSTED_GLOBALS` allowed, and clear errors (module docstring).

    Args:
        path: a local checkpoint file, or a distributed-checkpoint folder (its meta.pt is loaded: the run's state
            without the sharded weights and optimizer states).
        map_location: as for `torch.load` (default: the CPU).
        verify: check the zip CRCs first (one extra sequential read, about a second per GB).

    Raises:
        FileNotFoundError: no such file.
        CorruptCheckpointError: truncated, damaged or not a checkpoint ("truncated or corrupt").
        UntrustedCheckpointError: it holds pickled objects other than tensors and plain values.
    """
    import torch

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"Checkpoint {path} does not exist.")
    if verify or path.is_dir():
        problem = checkpoint_problem(path)
        if problem is not None:
            raise CorruptCheckpointError(corrupt_checkpoint_message(path, problem))
    path = state_file(path)
    try:
        with torch.serialization.safe_globals(list(TRUSTED_GLOBALS)):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        if "weights only" in str(err).lower() or "weights_only" in str(err):
            objects = untrusted_objects(path) if zipfile.is_zipfile(path) else []
            raise UntrustedCheckpointError(untrusted_message(path, objects or _first_line(err))) from err
        raise CorruptCheckpointError(corrupt_checkpoint_message(path, f"it does not unpickle ({err})")) from err
    except EOFError as err:  # a legacy (non-zip) file cut short
        raise CorruptCheckpointError(corrupt_checkpoint_message(path, "it ends early (EOFError)")) from err
    except (RuntimeError, ValueError) as err:  # a damaged archive, unless the file is intact (e.g. CUDA tensors here)
        problem = checkpoint_problem(path)
        if problem is None:
            raise
        raise CorruptCheckpointError(corrupt_checkpoint_message(path, problem)) from err


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    useful = [line for line in lines if "global" in line.lower()] or lines
    return useful[0][:300] if useful else type(err).__name__


def refuse_checkpoint_folder(path: str | Path) -> None:
    """For a command that needs the weights in one file: refuse a distributed-checkpoint folder with the command that
    consolidates it (its weights are sharded over the processes that saved it)."""
    if Path(path).is_dir():
        raise ConfigError(
            f"Checkpoint {path} is a distributed-checkpoint folder (saved by FSDP2, --trainer.strategy "
            "ModelParallelStrategy): its weights are sharded, and this command needs them in one file. Consolidate "
            f"it once: {CONSOLIDATE.format(path=path)} (writes {path}.consolidated: weights and settings), then give "
            "that file."
        )
