"""Tokenizers, found by name: `bytes` (needs nothing) and `gpt2` (tiktoken's GPT-2 BPE, online or from a file).

Every tokenizer has `name`, `vocab_size`, `eos_id`, `encode(text) -> list[int]` (no EOS added), `decode(ids)` and a
`fingerprint`: a sha256 of the exact vocabulary, recorded in every shard manifest so that shards made with another
vocabulary are refused instead of silently mis-read.
"""

from __future__ import annotations

import hashlib
import os
from functools import cached_property
from pathlib import Path
from typing import ClassVar

import numpy as np

GPT2_BPE_ENV = "LIGHTNING_CQK_GPT2_BPE"


class ByteTokenizer:
    """UTF-8 bytes 0..255 plus EOS = 256 (vocabulary 257). Works everywhere, with nothing to download."""

    name: ClassVar[str] = "bytes"
    vocab_size: ClassVar[int] = 257
    eos_id: ClassVar[int] = 256

    def __init__(self, bpe_file: str | None = None) -> None:
        del bpe_file  # accepted for a uniform constructor; bytes need no vocabulary file

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(b"bytes-utf8-eos256-v1").hexdigest()

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_array(self, text: str) -> np.ndarray:
        """Token ids as a uint16 array (fast path used by `prepare`)."""
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class GPT2Tokenizer:
    """GPT-2 BPE through tiktoken (vocabulary 50,257; EOS = `<|endoftext|>` = 50256).

    Offline: pass `bpe_file` (a `.tiktoken` rank file, e.g. `gpt2.tiktoken`) or set `LIGHTNING_CQK_GPT2_BPE`.
    Online: tiktoken downloads and caches the vocabulary itself (`TIKTOKEN_CACHE_DIR` controls where).
    Text that looks like a special token is encoded as ordinary text, never as EOS.
    """

    name: ClassVar[str] = "gpt2"
    vocab_size: ClassVar[int] = 50257
    eos_id: ClassVar[int] = 50256

    def __init__(self, bpe_file: str | None = None) -> None:
        self.bpe_file = bpe_file or os.environ.get(GPT2_BPE_ENV) or None

    @cached_property
    def encoding(self):  # tiktoken.Encoding, loaded on first use
        import tiktoken

        if self.bpe_file:
            return _gpt2_from_file(self.bpe_file)
        try:
            return tiktoken.get_encoding("gpt2")
        except Exception as err:
            raise RuntimeError(
                "Could not load the GPT-2 BPE through tiktoken (no network?). Give the vocabulary file instead: "
                f"`--data.bpe_file path/to/gpt2.tiktoken` (or `bpe_file=` in Python), or set {GPT2_BPE_ENV}="
                "path/to/gpt2.tiktoken; tiktoken's own cache (TIKTOKEN_CACHE_DIR) also works. "
                f"Original error: {type(err).__name__}: {err}"
            ) from err

    @cached_property
    def fingerprint(self) -> str:
        enc = self.encoding
        h = hashlib.sha256()
        for token, rank in sorted(enc._mergeable_ranks.items(), key=lambda kv: kv[1]):
            h.update(rank.to_bytes(4, "little") + token)
        for token, rank in sorted(enc._special_tokens.items()):
            h.update(rank.to_bytes(4, "little") + token.encode())
        return h.hexdigest()

    def encode(self, text: str) -> list[int]:
        return self.encoding.encode_ordinary(text)

    def encode_array(self, text: str) -> np.ndarray:
        return np.asarray(self.encoding.encode_ordinary(text), dtype=np.uint16)

    def decode(self, ids: list[int]) -> str:
        return self.encoding.decode(list(ids), errors="replace")


def _gpt2_from_file(path: str):
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe
    from tiktoken_ext.openai_public import r50k_pat_str

    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(
            f"GPT-2 BPE file {file} does not exist. Give a `.tiktoken` rank file (50,256 lines `base64 rank`), "
            f"e.g. the one tiktoken caches, via `bpe_file` or {GPT2_BPE_ENV}."
        )
    ranks = load_tiktoken_bpe(str(file))
    if len(ranks) != 50256:
        raise ValueError(f"{file} has {len(ranks)} ranks; the GPT-2 BPE has 50,256 (plus <|endoftext|> = 50256).")
    return tiktoken.Encoding(
        name="gpt2", pat_str=r50k_pat_str, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 50256}
    )


TOKENIZERS: dict[str, type] = {cls.name: cls for cls in (ByteTokenizer, GPT2Tokenizer)}

_CACHE: dict[tuple[str, str | None], object] = {}


def _tokenizer_class(name: str) -> type:
    try:
        return TOKENIZERS[name]
    except KeyError:
        raise ValueError(f"Unknown tokenizer {name!r}. Choices: {', '.join(sorted(TOKENIZERS))}.") from None


def get_tokenizer(name: str, bpe_file: str | None = None):
    """The tokenizer registered under `name` (cached per process)."""
    key = (name, bpe_file)
    if key not in _CACHE:
        _CACHE[key] = _tokenizer_class(name)(bpe_file)
    return _CACHE[key]


def vocab_size_of(name: str) -> int:
    """Vocabulary size of a tokenizer, without loading any file."""
    return _tokenizer_class(name).vocab_size


def eos_id_of(name: str) -> int:
    """EOS id of a tokenizer, without loading any file."""
    return _tokenizer_class(name).eos_id
