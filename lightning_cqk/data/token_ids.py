"""Token-id files: the fixed token sequence t_s of the `fixed_seq_qk` attention backend, read here, not in model code.

A source is `builtin:python_docs` (the UTF-8 bytes of the built-in corpus as `builtin.py` gathers it, documents
joined by blank lines), a `.npy` integer array (read with numpy, any shape, flattened in C order) or a `.txt` of
integers separated by spaces or commas. `load_token_ids(source, length)` returns the first `length` ids as an int64
CPU tensor. Imports torch and numpy only (model code may call it to build its buffers).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch

from lightning_cqk.data.builtin import BUILTIN_CORPORA, BUILTIN_PREFIX
from lightning_cqk.errors import ConfigError

BUILTIN_TOKENS = "builtin:python_docs"


def load_token_ids(source: str, length: int) -> torch.Tensor:
    """The first `length` token ids of `source` as an int64 tensor (length,) on the CPU.

    Args:
        source: "builtin:<corpus>", or the path of a `.npy` integer array or a `.txt` of integers.
        length: how many ids are needed.

    Raises:
        ConfigError (a ValueError): unknown source, unreadable file, non-integer data, or fewer than `length` ids.
    """
    return _load_token_ids(str(source), int(length)).clone()


@functools.lru_cache(maxsize=8)
def _load_token_ids(source: str, length: int) -> torch.Tensor:
    # Made on the CPU explicitly: a model built under `torch.device("meta")` must not cache (or compare) meta tensors.
    if source.startswith(BUILTIN_PREFIX):
        ids = _builtin_bytes(source, length)
    else:
        ids = _file_ids(source)
    if ids.size < length:
        raise ConfigError(
            f"token source {source!r} holds {ids.size} ids, fewer than the {length} the fixed sequence needs; "
            "give a longer file or lower the option `length`."
        )
    return torch.from_numpy(ids[:length].astype(np.int64)).to(device="cpu")


def _builtin_bytes(source: str, length: int) -> np.ndarray:
    """The first `length` UTF-8 bytes of a built-in corpus (its documents joined by blank lines)."""
    name = source[len(BUILTIN_PREFIX) :]
    if name not in BUILTIN_CORPORA:
        raise ConfigError(f"Unknown built-in token source {source!r}; the built-in one is {BUILTIN_TOKENS!r}.")
    data = bytearray()
    for doc in BUILTIN_CORPORA[name]():
        data += (b"\n\n" if data else b"") + doc.text.encode("utf-8")
        if len(data) >= length:
            break
    return np.frombuffer(bytes(data[:length]), dtype=np.uint8)


def _file_ids(source: str) -> np.ndarray:
    path = Path(source).expanduser()
    if not path.is_file():
        raise ConfigError(f"token_file {source!r} does not exist (give a .npy or .txt of ids, or {BUILTIN_TOKENS!r}).")
    if path.suffix == ".npy":
        try:
            ids = np.load(path, allow_pickle=False)
        except ValueError as err:
            raise ConfigError(f"token_file {source!r} is not a readable .npy array ({err}).") from None
        if not np.issubdtype(ids.dtype, np.integer):
            raise ConfigError(f"{path}: expected an integer array, got dtype {ids.dtype}.")
        return np.ascontiguousarray(ids).reshape(-1)
    if path.suffix == ".txt":
        try:
            return np.array([int(t) for t in path.read_text().replace(",", " ").split()], dtype=np.int64)
        except ValueError as err:
            raise ConfigError(
                f"token_file {source!r}: expected integers separated by spaces or commas ({err})."
            ) from None
    raise ConfigError(f"token_file {source!r}: unsupported suffix {path.suffix!r}; use .npy or .txt.")
