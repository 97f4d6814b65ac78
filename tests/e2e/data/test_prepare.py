"""prepare -> shards -> stream: every token written is read back in order, splits are disjoint, counts match."""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import multiprocessing
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from lightning_cqk.data import Manifest, PrepareSpec, iter_documents, prepare, prepare_shards
from lightning_cqk.data.prepare import in_val

EOS = 256


def expected_splits(source: str, val_fraction: float) -> dict[str, list]:
    docs = list(iter_documents(source))
    return {
        "val": [d for d in docs if in_val(d.text, val_fraction)],
        "train": [d for d in docs if not in_val(d.text, val_fraction)],
    }


def stream_of(docs) -> list[int]:
    out: list[int] = []
    for d in docs:
        out += [*d.text.encode("utf-8"), EOS]
    return out


def split_documents(tokens: np.ndarray) -> list[bytes]:
    """The documents of a token stream (EOS-separated), as UTF-8 bytes."""
    ends = np.flatnonzero(tokens == EOS)
    assert len(ends) and ends[-1] == len(tokens) - 1, "the stream ends with EOS"
    return [bytes(piece[:-1].astype(np.uint8)) for piece in np.split(tokens, ends + 1)[:-1]]


def test_round_trip_every_token_in_order(corpus: Path, prepared: Path, read_stream):
    from litdata import StreamingDataset, TokensLoader

    manifest = Manifest.load(prepared)
    expected = expected_splits(str(corpus), 0.25)
    assert expected["val"] and expected["train"]
    assert not {d.text for d in expected["val"]} & {d.text for d in expected["train"]}
    assert manifest.dtype == "uint16" and manifest.split_rule.startswith("int(blake2b")
    for split, docs in expected.items():
        stream = stream_of(docs)
        read = read_stream(prepared / split)
        assert read.dtype == np.uint16 and read.tolist() == stream, f"{split}: every token, in order"
        stats = manifest.splits[split]
        assert (stats.documents, stats.tokens) == (len(docs), len(stream))
        assert stats.bytes == sum(len(d.text.encode("utf-8")) for d in docs)
        assert stats.replaced_bytes == sum(d.replaced for d in docs)
        # Windows as training reads them: per chunk, the tail that does not fill a window is dropped.
        window = 7
        ds = StreamingDataset(str(prepared / split), item_loader=TokensLoader(block_size=window), shuffle=False)
        index = json.loads((prepared / split / "index.json").read_text())
        assert len(index["chunks"]) == 1 and len(ds) == len(stream) // window
        assert np.concatenate([np.asarray(w) for w in ds]).tolist() == stream[: len(ds) * window]
    assert manifest.splits["train"].replaced_bytes + manifest.splits["val"].replaced_bytes == 3
    assert manifest.bytes_per_token("val") == pytest.approx(
        manifest.splits["val"].bytes / manifest.splits["val"].tokens
    )
    files = {Path(f["path"]).name for f in manifest.files}
    assert "a.jsonl" in files and "broken.md" in files and "notes.csv" not in files


def test_two_workers_write_the_same_stream(corpus: Path, prepared: Path, read_stream, tmp_path: Path):
    method = multiprocessing.get_start_method(allow_none=True)
    parallel = prepare(str(corpus), str(tmp_path / "two"), val_fraction=0.25, num_workers=2)
    assert multiprocessing.get_start_method(allow_none=True) == method, "litdata's global setting is restored"
    assert "DATA_OPTIMIZER_CACHE_FOLDER" not in os.environ
    assert parallel.splits == Manifest.load(prepared).splits
    chunks = [c["filename"] for c in json.loads((tmp_path / "two" / "train" / "index.json").read_text())["chunks"]]
    assert {name.split("-")[1] for name in chunks} == {"0", "1"}, "both workers wrote chunks"
    for split in ("train", "val"):
        one, two = read_stream(prepared / split), read_stream(tmp_path / "two" / split)
        assert Counter(split_documents(one)) == Counter(split_documents(two)), "same multiset of documents"
        assert one.tolist() == two.tolist(), "and, since litdata keeps the units in order, the same stream"


def test_the_spec_carries_prepares_arguments(corpus: Path, prepared: Path, tmp_path: Path):
    """Issue 33: one PrepareSpec carries prepare's options (its fields are prepare's arguments, the flags of
    `lightning_cqk prepare`, with the same defaults), and prepare_shards of a spec builds what prepare builds."""
    flags = {name: p.default for name, p in inspect.signature(prepare).parameters.items()}
    fields = {f.name: f.default for f in dataclasses.fields(PrepareSpec)}
    assert list(flags) == list(fields), "the same options, in the same order"
    assert {k: v for k, v in flags.items() if v is not inspect.Parameter.empty} == {
        k: v for k, v in fields.items() if v is not dataclasses.MISSING
    }, "and the same defaults"
    spec = PrepareSpec(source=str(corpus), output_dir=str(tmp_path / "spec"), val_fraction=0.25)
    manifest = prepare_shards(spec)
    assert manifest.splits == Manifest.load(prepared).splits
    for split in ("train", "val"):
        built = sorted((tmp_path / "spec" / split).glob("*.bin"))
        assert [p.read_bytes() for p in built] == [prepared.joinpath(split, p.name).read_bytes() for p in built]


def test_reuse_mismatch_overwrite_and_interrupted(corpus: Path, tmp_path: Path, capsys, gpt2_bpe_dir: Path):
    out = tmp_path / "out"
    prepare(str(corpus), str(out), val_fraction=0.25)
    manifest_file, chunk = out / "manifest.json", next((out / "train").glob("*.bin"))
    stamps = (manifest_file.stat().st_mtime_ns, chunk.stat().st_mtime_ns)
    capsys.readouterr()
    prepare(str(corpus), str(out), val_fraction=0.25)
    assert "reusing" in capsys.readouterr().out
    assert (manifest_file.stat().st_mtime_ns, chunk.stat().st_mtime_ns) == stamps, "nothing rewritten"

    with pytest.raises(ValueError, match="tokenizer: prepared 'bytes', asked 'gpt2'.*overwrite=True"):
        prepare(str(corpus), str(out), tokenizer="gpt2", bpe_file=str(gpt2_bpe_dir / "gpt2.tiktoken"))
    with pytest.raises(ValueError, match="documents_mode: prepared 'file', asked 'line'"):
        prepare(str(corpus), str(out), val_fraction=0.25, documents="line")
    assert manifest_file.stat().st_mtime_ns == stamps[0]

    bpe_file = str(gpt2_bpe_dir / "gpt2.tiktoken")
    gpt2 = prepare(str(corpus), str(out), tokenizer="gpt2", bpe_file=bpe_file, val_fraction=0.25, overwrite=True)
    assert gpt2.tokenizer == "gpt2" and gpt2.vocab_size == 50257 and gpt2.dtype == "uint16"
    with pytest.raises(ValueError, match="val split would be empty"):
        prepare(str(corpus), str(out), val_fraction=1e-9, overwrite=True)
    assert Manifest.load(out).tokenizer == "gpt2", "a failed rebuild leaves the finished shards as they were"
    assert not list(out.glob(".prepare-*")) and sorted(p.name for p in out.iterdir()) == [
        "manifest.json",
        "train",
        "val",
    ]

    # A crash after the shards but before the manifest: the directory is rebuilt, never trusted.
    manifest_file.unlink()
    (out / "train" / "garbage.bin").write_bytes(b"\x00" * 10)
    rebuilt = prepare(str(corpus), str(out), val_fraction=0.25)
    assert rebuilt.tokenizer == "bytes" and not (out / "train" / "garbage.bin").exists()
    assert "did not finish" in capsys.readouterr().out


def test_worker_errors_surface_with_their_type(tmp_path: Path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(4):
        (src / f"ok{i}.jsonl").write_text(json.dumps({"text": f"fine {i}"}) + "\n")
    (src / "bad.jsonl").write_text('{"text": "ok"}\n{"body": "no text field"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2 has no 'text' field"):
        prepare(str(src), str(tmp_path / "out"), num_workers=2)
    assert not Manifest.exists(tmp_path / "out")
    assert multiprocessing.active_children() == [], "no worker left behind"


def test_split_errors_and_explicit_val_source(tmp_path: Path):
    one = tmp_path / "one.txt"
    one.write_text("a single document")
    with pytest.raises(ValueError, match="val split would be empty: none of the 1 documents.*val_source"):
        prepare(str(one), str(tmp_path / "o1"), val_fraction=0.01)
    with pytest.raises(ValueError, match="val_fraction=0 leaves"):
        prepare(str(one), str(tmp_path / "o2"), val_fraction=0.0)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        prepare(str(tmp_path / "missing.txt"), str(tmp_path / "o3"))
    book = tmp_path / "book.txt"
    book.write_text("\n\n".join(f"Paragraph {i} " + "words " * 10 for i in range(20)))
    held_out = tmp_path / "held.txt"
    held_out.write_text("validation text " * 20)
    m = prepare(str(book), str(tmp_path / "o4"), documents="paragraph", val_source=str(held_out))
    assert (m.splits["train"].documents, m.splits["val"].documents) == (20, 1)
    assert m.splits["val"].tokens == len("validation text " * 20) + 1 and m.split_rule.startswith("source -> train")
    with pytest.raises(ValueError, match="both source and val_source"):
        prepare(str(tmp_path), str(tmp_path / "o5"), val_source=str(held_out))
    assert not any(Manifest.exists(tmp_path / f"o{i}") for i in (1, 2, 3, 5))


def test_split_rule_is_the_documented_hash():
    for text in ("", "a", "naïve café", "x" * 1000, "<|endoftext|>"):
        value = int(hashlib.blake2b(text.encode("utf-8")).hexdigest()[:15], 16) / 16**15
        for fraction in (0.0, 0.05, 0.5, 0.99):
            assert in_val(text, fraction) == (value < fraction)
