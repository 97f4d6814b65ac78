"""Tokenizers: byte round trip, GPT-2 ids equal tiktoken's canonical ``get_encoding("gpt2")``, offline errors."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest
import tiktoken

from lightning_cqk.data.tokenizers import (
    GPT2_BPE_ENV,
    GPT2_FINGERPRINT,
    TOKENIZERS,
    ByteTokenizer,
    GPT2Tokenizer,
    _vocab_fingerprint,
    can_load_offline,
    get_tokenizer,
    vocab_size_of,
)

# The two files tiktoken's own gpt2 definition downloads, with the sha256 it checks them against.
_VOCAB_BPE_URL = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe"
_ENCODER_JSON_URL = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json"
_VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
_ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"


def test_bytes_round_trip_and_constants():
    tok = get_tokenizer("bytes")
    text = "Attention, naïve café — 注意力 🚀\r\nline two\x00"
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8")) and max(ids) < 256
    assert tok.decode(ids) == text
    assert tok.decode([tok.eos_id, *ids, tok.eos_id]) == text, "EOS is not text"
    assert (tok.name, tok.vocab_size, tok.eos_id) == ("bytes", 257, 256)
    assert tok.encode_array(text).tolist() == ids and tok.encode_array(text).dtype.name == "uint16"
    assert tok.decode(list("€".encode())[:2]) == "\ufffd", "a cut multi-byte character decodes with replacement"
    with pytest.raises(ValueError, match="outside"):
        tok.decode([257])
    assert tok.fingerprint == hashlib.sha256(b"bytes-utf8-eos256-v1").hexdigest()


def test_registry_and_sizes_need_no_file_or_network(monkeypatch):
    def no_io(*args, **kwargs):
        raise AssertionError("vocab_size_of must not load a vocabulary")

    monkeypatch.setattr(tiktoken, "get_encoding", no_io)
    monkeypatch.setattr("tiktoken.load.read_file", no_io)
    assert set(TOKENIZERS) == {"bytes", "gpt2"}
    assert vocab_size_of("bytes") == 257 and vocab_size_of("gpt2") == 50257
    with pytest.raises(ValueError, match="Choices: bytes, gpt2"):
        get_tokenizer("sentencepiece")
    with pytest.raises(ValueError, match="Choices: bytes, gpt2"):
        vocab_size_of("sentencepiece")


def _canonical_gpt2(bpe_dir: Path, cache: Path, monkeypatch) -> tiktoken.Encoding:
    """``tiktoken.get_encoding("gpt2")`` itself, offline: its two files rebuilt byte-exactly in its cache.

    The shared folder has the Hugging Face copies of OpenAI's files (``merges.txt`` = ``vocab.bpe`` with another
    header line, ``vocab.json`` = ``encoder.json`` written compactly). We restore the originals and require
    tiktoken's own sha256s, so the reference is the real GPT-2 vocabulary, read by tiktoken's data-gym loader: a
    path independent of the ``.tiktoken`` file our tokenizer reads.
    """
    merges = (bpe_dir / "merges.txt").read_text(encoding="utf-8").split("\n")
    vocab_bpe = ("\n".join(["#version: 0.2", *merges[1:]]).rstrip("\n") + "\n").encode("utf-8")
    encoder_json = json.dumps(json.loads((bpe_dir / "vocab.json").read_text(encoding="utf-8"))).encode("utf-8")
    for data, expected in ((vocab_bpe, _VOCAB_BPE_SHA256), (encoder_json, _ENCODER_JSON_SHA256)):
        if hashlib.sha256(data).hexdigest() != expected:
            pytest.skip("cannot rebuild OpenAI's original GPT-2 files byte-exactly from the shared HF-format copies")
    for url, data in ((_VOCAB_BPE_URL, vocab_bpe), (_ENCODER_JSON_URL, encoder_json)):
        (cache / hashlib.sha1(url.encode()).hexdigest()).write_bytes(data)  # tiktoken's cache naming
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))

    def no_network(url):
        raise AssertionError(f"test tried to download {url}")

    monkeypatch.setattr("tiktoken.load.read_file", no_network)
    monkeypatch.setattr("tiktoken.registry.ENCODINGS", {})  # neither reuse nor leak a cached Encoding
    return tiktoken.get_encoding("gpt2")


def test_gpt2_ids_equal_canonical_tiktoken(gpt2_bpe_dir, wikitext_lines, tmp_path, monkeypatch):
    ours = GPT2Tokenizer(bpe_file=str(gpt2_bpe_dir / "gpt2.tiktoken"))
    reference = _canonical_gpt2(gpt2_bpe_dir, tmp_path, monkeypatch)
    tricky = ["<|endoftext|>", " <|endoftext|> x", "don't  stop\t\n\n  ", "1234567 3.14", "🚀 émigré 注意力", " " * 9]
    tricky += ["a   b\n\n\n  c", "    def f(x):\n        return x  # two  spaces", "tab\t\tsep\r\nCRLF"]
    # Whole multi-line documents as well as single lines: runs of spaces and newlines are where regexes differ.
    documents = ["\n".join(wikitext_lines[i : i + 10]) for i in range(0, 400, 10)]
    lines = wikitext_lines[:1500] + documents + tricky
    n_tokens = 0
    for line in lines:
        ids = ours.encode(line)
        assert ids == reference.encode_ordinary(line), line
        assert ours.decode(ids) == line
        n_tokens += len(ids)
    assert n_tokens > 50_000, "enough real text was compared"
    assert ours.encode_batch(lines[:20]) == [reference.encode_ordinary(line) for line in lines[:20]]
    assert ours.encode("<|endoftext|>") != [ours.eos_id], "special-token text is ordinary text, never EOS"
    assert (ours.vocab_size, ours.eos_id) == (reference.n_vocab, reference.eot_token) == (50257, 50256)
    assert ours.fingerprint == _vocab_fingerprint(reference) == GPT2_FINGERPRINT, "same vocabulary, same digest"


def test_gpt2_without_file_or_network_says_how_to_fix(monkeypatch):
    def offline(name):
        raise ConnectionError("network is unreachable")

    monkeypatch.delenv(GPT2_BPE_ENV, raising=False)
    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    with pytest.raises(RuntimeError) as err:
        get_tokenizer("gpt2")
    message = str(err.value)
    assert "bpe_file" in message and GPT2_BPE_ENV in message and "TIKTOKEN_CACHE_DIR" in message
    assert not can_load_offline("gpt2") and can_load_offline("bytes")


def test_gpt2_missing_or_wrong_file(gpt2_bpe_dir, tmp_path, monkeypatch):
    missing = tmp_path / "nope.tiktoken"
    with pytest.raises(FileNotFoundError, match=f"{missing}.*{GPT2_BPE_ENV}"):
        GPT2Tokenizer(bpe_file=str(missing))
    # Same size and format, two ranks swapped: the fingerprint check refuses it.
    lines = (gpt2_bpe_dir / "gpt2.tiktoken").read_text().splitlines()
    (t0, _), (t1, _) = lines[300].split(), lines[301].split()
    lines[300], lines[301] = f"{t1} 300", f"{t0} 301"
    wrong = tmp_path / "wrong.tiktoken"
    wrong.write_text("\n".join(lines) + "\n")
    assert base64.b64decode(t0) != base64.b64decode(t1)
    with pytest.raises(ValueError, match="not GPT-2's vocabulary"):
        GPT2Tokenizer(bpe_file=str(wrong))


def test_gpt2_file_from_environment(gpt2_bpe_dir, monkeypatch):
    monkeypatch.setenv(GPT2_BPE_ENV, str(gpt2_bpe_dir / "gpt2.tiktoken"))
    assert can_load_offline("gpt2")
    tok = get_tokenizer("gpt2")
    assert tok.encode(" hello world") == [23748, 995]
    assert tok.decode([23748, 995, tok.eos_id]) == " hello world"
    assert tok.encode_array(" hello world").dtype.name == "uint16"


def test_byte_tokenizer_ignores_bpe_file():
    assert ByteTokenizer(bpe_file="ignored").encode("a") == [97]
