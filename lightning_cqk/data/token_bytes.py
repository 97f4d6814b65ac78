"""How many bytes of text each token id stands for: the denominator of bits per byte, counted per scored token.

`val/bpb` divides the summed validation NLL (in bits) by the UTF-8 bytes of exactly the target tokens that were
scored, so it is right under `limit_val_batches` (a prefix of the val split, whose bytes per token differ from the
split's average by up to a few percent with GPT-2 BPE) and with litdata dropping each chunk's tail. The bytes of a
token are those of its text: `bytes` 1 for ids 0..255; GPT-2 byte-level BPE the length of
`decode_single_token_bytes(id)`; the end-of-document token 0 (it stands for no text, as `prepare` counts bytes: the
UTF-8 length of each document's text). Summed over a whole split this equals the manifest's byte count.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from lightning_cqk.data.tokenizers import ByteTokenizer, GPT2Tokenizer, can_load_offline, get_tokenizer


def token_byte_lengths(tokenizer: str, bpe_file: str | None = None) -> np.ndarray | None:
    """UTF-8 bytes of text per token id (int64, one entry per id of the vocabulary; EOS 0).

    None when the vocabulary cannot be loaded without network (GPT-2 without `bpe_file` or
    `$LIGHTNING_CQK_GPT2_BPE`): then the bytes of the scored tokens are unknown.
    """
    if not can_load_offline(tokenizer, bpe_file):
        return None
    return _lengths(tokenizer, bpe_file).copy()


@lru_cache(maxsize=8)
def _lengths(tokenizer: str, bpe_file: str | None) -> np.ndarray:
    tok = get_tokenizer(tokenizer, bpe_file)
    if isinstance(tok, ByteTokenizer):
        lengths = np.ones(tok.vocab_size, dtype=np.int64)
    elif isinstance(tok, GPT2Tokenizer):
        encoding = tok._encoding
        lengths = np.zeros(tok.vocab_size, dtype=np.int64)
        for token_id in range(tok.eos_id):
            lengths[token_id] = len(encoding.decode_single_token_bytes(token_id))
    else:  # a tokenizer added later: decode each id on its own (the text of one token)
        lengths = np.array([len(tok.decode([i]).encode("utf-8")) for i in range(tok.vocab_size)], dtype=np.int64)
    lengths[tok.eos_id] = 0
    return lengths
