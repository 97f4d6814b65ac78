"""The printed report of a finished ``prepare``: what was written, how fast, and what was replaced or left out."""

from __future__ import annotations

from pathlib import Path

from lightning_cqk.data.manifest import MANIFEST_NAME, Manifest


def print_report(out: Path, manifest: Manifest, seconds: float, tokenize_seconds: float, num_workers: int) -> None:
    """Print what a build wrote into ``out`` (its manifest), its speed over ``tokenize_seconds`` of ``seconds`` in
    all with ``num_workers`` workers, and every replacement and left-out group, each naming where the first one is."""
    train, val = manifest.splits["train"], manifest.splits["val"]
    text_mb = (train.bytes + val.bytes) / 1e6
    tokens = train.tokens + val.tokens
    print(
        f"prepare: wrote {out}: train {train.documents:,} docs / {train.tokens:,} tokens, val {val.documents:,} docs "
        f"/ {val.tokens:,} tokens, {text_mb:.2f} MB of text."
    )
    # Reading, splitting, tokenizing and writing; gathering a built-in corpus (parsing sources) is reported apart.
    print(
        f"prepare: tokenized at {text_mb / tokenize_seconds:.2f} MB/s, {tokens / tokenize_seconds:,.0f} tokens/s "
        f"({tokenize_seconds:.1f} s, {num_workers} worker{'s' if num_workers > 1 else ''}); "
        f"{seconds:.1f} s in all."
    )
    replaced = train.replaced_bytes + val.replaced_bytes
    surrogates = train.replaced_surrogates + val.replaced_surrogates
    first = val.first_replaced or train.first_replaced
    if replaced:
        print(f"prepare: {replaced:,} bytes that were not UTF-8 were replaced with U+FFFD (first in {first}).")
    if surrogates:
        print(
            f"prepare: {surrogates:,} lone surrogate escapes in JSON text (\\ud800-\\udfff without a pair: not a "
            f"character) were replaced with U+FFFD (first in {first})."
        )
    blank = train.skipped_blank + val.skipped_blank
    if blank:
        first = val.first_skipped or train.first_skipped
        print(
            f"prepare: LEFT OUT: {blank:,} records or files with blank or null text (first: {first}); check text_field "
            f"if that is more than expected ({train.documents + val.documents:,} documents were used)."
        )
    if train.dropped_val_copies:
        print(
            f"prepare: {train.dropped_val_copies:,} training documents are identical to validation documents and were "
            f"left out of train (first: {train.first_val_copy}); val_overlap='keep' keeps them."
        )
    data = [e for e in manifest.left_out if not e["reason"].startswith("documentation")]
    if data:
        docs = sum(e.get("documents") or 0 for e in data)
        print(
            f"prepare: LEFT OUT: {len(data)} file(s) or group(s) of the source, {docs:,} documents counted in them "
            f"({sum(e['bytes'] for e in data) / 1e6:.2f} MB), beside {train.documents + val.documents:,} documents "
            f"used; each is listed in {out / MANIFEST_NAME} (left_out) with the reason."
        )
