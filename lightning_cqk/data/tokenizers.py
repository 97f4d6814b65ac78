"""Tokenizers: text <-> token ids, chosen by name from a small registry.

Two tokenizers cover the project's needs:

* ``bytes``: UTF-8 bytes 0..255 plus an end-of-document id 256 (vocabulary 257). Needs nothing; the default for
  CPU experiments and tests.
* ``gpt2``: GPT-2's byte-level BPE through ``tiktoken`` (vocabulary 50,257, ``<|endoftext|>`` = 50256). Works
  offline from a local ``.tiktoken`` file (``bpe_file`` or the ``LIGHTNING_CQK_GPT2_BPE`` environment variable).

Every tokenizer has a ``fingerprint``: a sha256 of its exact vocabulary, stored in each prepared dataset's manifest
so a model is never trained on shards made with a different vocabulary. ``vocab_size_of`` answers from a class
constant, without files or network, so configs can size embeddings before any data exists.
"""

from __future__ import annotations

import base64
import hashlib
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from functools import cached_property
from pathlib import Path
from typing import ClassVar

import numpy as np

from lightning_cqk.environment import env_path
from lightning_cqk.errors import ConfigError, MissingInputError, UnavailableError

GPT2_BPE_ENV = "LIGHTNING_CQK_GPT2_BPE"
"""Environment variable naming a local GPT-2 ``.tiktoken`` file (used when ``bpe_file`` is not given)."""

# GPT-2's pre-tokenisation regex as published with the original GPT-2 encoder. Only a fallback: tiktoken's own
# (equivalent, faster) pattern is preferred so our ids match ``tiktoken.get_encoding("gpt2")`` by construction.
_GPT2_PATTERN_FALLBACK = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

# sha256 of GPT-2's vocabulary in the form ``Tokenizer.fingerprint`` hashes it (see ``_vocab_fingerprint``).
# Checked against any file given as ``bpe_file``, so a wrong vocabulary file fails loudly instead of silently
# producing different ids.
GPT2_FINGERPRINT = "5f8e4c51c2988ae06253100d3c078887082458a8010f0987532dd7baf27ee10d"


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest dtype that holds every id: uint16 up to 65,536 ids (half the disk of int32), else int32."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.int32)


class Tokenizer(ABC):
    """The interface every tokenizer implements.

    Class attributes ``name``, ``vocab_size`` and ``eos_id`` are constants, readable without an instance.
    """

    name: ClassVar[str]
    vocab_size: ClassVar[int]
    eos_id: ClassVar[int]
    known_fingerprint: ClassVar[str | None] = None
    """The ``fingerprint`` of the one vocabulary this tokenizer may have, when it is fixed: lets a manifest be
    checked without loading the vocabulary (None: the vocabulary must be loaded to check it)."""

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Encode text to token ids. No end-of-document id is added."""

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Encode several texts; subclasses override this when a batched path is faster."""
        return [self.encode(text) for text in texts]

    def encode_array(self, text: str) -> np.ndarray:
        """Encode to a 1-D array of ``token_dtype(vocab_size)`` (what ``prepare`` stores)."""
        return np.asarray(self.encode(text), dtype=token_dtype(self.vocab_size))

    @abstractmethod
    def decode(self, ids: Iterable[int]) -> str:
        """Decode token ids to text."""

    @property
    @abstractmethod
    def fingerprint(self) -> str:
        """A sha256 hex digest that identifies the exact vocabulary (same digest <=> same ids for any text)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, vocab_size={self.vocab_size}, eos_id={self.eos_id})"


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as tokens 0..255; 256 marks the end of a document.

    Args:
        bpe_file: Ignored; accepted so every tokenizer can be built by ``get_tokenizer`` with the same arguments.
    """

    name = "bytes"
    vocab_size = 257
    eos_id = 256
    known_fingerprint = hashlib.sha256(b"bytes-utf8-eos256-v1").hexdigest()

    def __init__(self, bpe_file: str | None = None) -> None:
        del bpe_file

    def encode(self, text: str) -> list[int]:
        """Encode text as its UTF-8 bytes."""
        return list(text.encode("utf-8"))

    def encode_array(self, text: str) -> np.ndarray:
        """UTF-8 bytes as a uint16 array without a Python list in between (``prepare``'s fast path)."""
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)

    def decode(self, ids: Iterable[int]) -> str:
        """Decode byte ids, skipping EOS; invalid UTF-8 (e.g. a cut multi-byte character) becomes U+FFFD."""
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i <= self.eos_id]
        if bad:
            raise ValueError(f"ids outside the bytes vocabulary 0..{self.eos_id}: {bad[:5]}")
        return bytes(i for i in ids if i != self.eos_id).decode("utf-8", errors="replace")

    @property
    def fingerprint(self) -> str:
        """A constant: the byte vocabulary never changes."""
        return self.known_fingerprint


class GPT2Tokenizer(Tokenizer):
    """GPT-2 byte-level BPE via ``tiktoken``; ids equal ``tiktoken.get_encoding("gpt2")``.

    Special-token text in the input (e.g. a literal ``<|endoftext|>`` in a web page) is encoded as ordinary text,
    never as EOS, so documents cannot forge document boundaries.

    Args:
        bpe_file: A local GPT-2 ``.tiktoken`` file (50,256 ranks). Defaults to ``$LIGHTNING_CQK_GPT2_BPE``; when
            neither is set, tiktoken downloads (or reads from its cache) the canonical GPT-2 files.
    """

    name = "gpt2"
    vocab_size = 50257
    eos_id = 50256
    known_fingerprint = GPT2_FINGERPRINT  # any other vocabulary file is refused when loaded

    def __init__(self, bpe_file: str | None = None) -> None:
        bpe_file = bpe_file or _env_bpe_file()
        self.bpe_file = str(bpe_file) if bpe_file else None
        self._encoding = _load_gpt2_encoding(self.bpe_file)
        if self.bpe_file is not None and self.fingerprint != GPT2_FINGERPRINT:
            raise ConfigError(
                f"{self.bpe_file} is not GPT-2's vocabulary (fingerprint {self.fingerprint[:12]}..., expected "
                f"{GPT2_FINGERPRINT[:12]}...). Give the GPT-2 .tiktoken file (50,256 ranks), e.g. whisper's "
                "assets/gpt2.tiktoken, which is byte-identical to tiktoken's r50k_base."
            )

    def encode(self, text: str) -> list[int]:
        """Encode with ``encode_ordinary``: special-token text is treated as plain text."""
        return self._encoding.encode_ordinary(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Encode several texts with tiktoken's threaded batch encoder."""
        return self._encoding.encode_ordinary_batch(list(texts))

    def decode(self, ids: Iterable[int]) -> str:
        """Decode ids; EOS is dropped and invalid UTF-8 becomes U+FFFD."""
        return self._encoding.decode([int(i) for i in ids if int(i) != self.eos_id], errors="replace")

    @cached_property
    def fingerprint(self) -> str:
        """sha256 of the mergeable ranks and special tokens (identical for the online and local-file paths)."""
        return _vocab_fingerprint(self._encoding)


TOKENIZERS: dict[str, type[Tokenizer]] = {"bytes": ByteTokenizer, "gpt2": GPT2Tokenizer}
"""Tokenizers by name, as accepted by ``--tokenizer`` everywhere."""

_CACHE: dict[tuple[str, str | None], Tokenizer] = {}


def get_tokenizer(name: str, bpe_file: str | None = None) -> Tokenizer:
    """Build a tokenizer by name.

    Args:
        name: A key of ``TOKENIZERS``.
        bpe_file: Local vocabulary file for BPE tokenizers (ignored by ``bytes``).

    Tokenizers are cached per process and per vocabulary file, since loading GPT-2's BPE takes a tenth of a second.

    Raises:
        ValueError: ``name`` is unknown (the message lists the choices).
    """
    cls = _tokenizer_class(name)
    if cls is GPT2Tokenizer:
        bpe_file = bpe_file or _env_bpe_file()
    key = (name, bpe_file)
    if key not in _CACHE:
        _CACHE[key] = cls(bpe_file=bpe_file)
    return _CACHE[key]


def vocab_size_of(name: str) -> int:
    """The vocabulary size of a named tokenizer, without loading any file or touching the network."""
    return _tokenizer_class(name).vocab_size


def eos_id_of(name: str) -> int:
    """The end-of-document id of a named tokenizer, without loading anything."""
    return _tokenizer_class(name).eos_id


def known_fingerprint(name: str) -> str | None:
    """The fixed vocabulary fingerprint of a named tokenizer (no I/O), or None when it has none."""
    return _tokenizer_class(name).known_fingerprint


def can_load_offline(name: str, bpe_file: str | None = None) -> bool:
    """Whether ``get_tokenizer(name, bpe_file)`` can work without network access."""
    if _tokenizer_class(name) is GPT2Tokenizer:
        path = bpe_file or _env_bpe_file()
        return bool(path) and Path(path).is_file()
    return True


def _env_bpe_file() -> str | None:
    """$LIGHTNING_CQK_GPT2_BPE (the GPT-2 vocabulary file), or None where unset."""
    path = env_path(GPT2_BPE_ENV)
    return None if path is None else str(path)


def _tokenizer_class(name: str) -> type[Tokenizer]:
    try:
        return TOKENIZERS[name]
    except KeyError:
        raise ConfigError(f"Unknown tokenizer {name!r}. Choices: {', '.join(sorted(TOKENIZERS))}.") from None


def _gpt2_pattern() -> str:
    """tiktoken's own GPT-2 regex when importable, so we follow tiktoken if it ever changes it."""
    try:
        from tiktoken_ext import openai_public

        return openai_public.r50k_pat_str
    except (ImportError, AttributeError):
        return _GPT2_PATTERN_FALLBACK


def _offline_help() -> str:
    return (
        "To work offline, give a local GPT-2 vocabulary file (gpt2.tiktoken): "
        f"`export {GPT2_BPE_ENV}=/path/to/gpt2.tiktoken` for every command, or per command "
        "`lightning_cqk fit ... --data.bpe_file /path/to/gpt2.tiktoken`, "
        "`lightning_cqk prepare ... --bpe_file /path/to/gpt2.tiktoken`, "
        "`lightning_cqk mc-eval ... --bpe_file /path/to/gpt2.tiktoken` (Python: bpe_file=...). "
        "Alternatively point tiktoken's own cache at pre-downloaded files with TIKTOKEN_CACHE_DIR."
    )


def _load_gpt2_encoding(bpe_file: str | None):  # -> tiktoken.Encoding (imported lazily)
    import tiktoken

    if bpe_file is None:
        try:
            return tiktoken.get_encoding("gpt2")
        except Exception as err:  # requests/OSError/hash errors all mean "could not fetch the vocabulary"
            raise UnavailableError(
                f"Could not load the GPT-2 vocabulary through tiktoken ({err}). {_offline_help()}"
            ) from err

    from tiktoken.load import load_tiktoken_bpe

    if not Path(bpe_file).is_file():
        raise MissingInputError(f"GPT-2 vocabulary file {bpe_file} does not exist. {_offline_help()}")
    ranks = load_tiktoken_bpe(bpe_file)
    if len(ranks) != GPT2Tokenizer.eos_id:
        raise ConfigError(f"{bpe_file} has {len(ranks)} ranks; GPT-2's .tiktoken file has {GPT2Tokenizer.eos_id}.")
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=_gpt2_pattern(),
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": GPT2Tokenizer.eos_id},
        explicit_n_vocab=GPT2Tokenizer.vocab_size,
    )


def _vocab_fingerprint(encoding) -> str:
    """Hash every id's bytes through tiktoken's public API, so it does not depend on how the file was read."""
    specials = {encoding.encode_single_token(s): s for s in encoding.special_tokens_set}
    digest = hashlib.sha256()
    for token_id in range(encoding.n_vocab):
        if token_id in specials:
            digest.update(b"special " + specials[token_id].encode("utf-8") + b" %d\n" % token_id)
        else:
            digest.update(base64.b64encode(encoding.decode_single_token_bytes(token_id)) + b" %d\n" % token_id)
    return digest.hexdigest()
