"""What a prepare is asked to build, and whether a finished shard directory holds exactly that.

A finished directory (one with ``manifest.json``) is reused only when the request matches its manifest: the same
tokenizer (name and vocabulary fingerprint), the same files (path, split and size; built-in corpora by Python
version), the same split rule, ``val_fraction`` (hash split only), document rule and JSON field, and the same corpus.
``prepare`` and the DataModules both run this comparison, so a ``data.source`` that differs from what the shards were
made from is refused with both named, never silently replaced by the old shards (issue 13, class 7a).

The vocabulary fingerprint is compared without loading the vocabulary where the tokenizer's fingerprint is a known
constant (``bytes``, ``gpt2``); a tokenizer without one must be loadable here (``--data.bpe_file``), else the run is
refused.

**What a rebuild may delete.** Only what this framework wrote: ``manifest.json`` and the split folders ``train/``,
``val/`` when they hold litdata's ``index.json`` (a finished split) or nothing. A ``train/`` or ``val/`` holding
anything else (a user's own text, say) is never deleted: ``prepare`` refuses and names it.
"""

from __future__ import annotations

import json
import platform
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_cqk.data.builtin import builtin_name, stdlib_root
from lightning_cqk.data.manifest import Manifest
from lightning_cqk.data.prepare_spec import PrepareSpec
from lightning_cqk.data.sources import as_source_list, list_source_files
from lightning_cqk.data.tokenizers import can_load_offline, get_tokenizer, known_fingerprint
from lightning_cqk.errors import ConfigError

SPLIT_RULE = "int(blake2b(utf8(text)).hexdigest()[:15], 16) / 16**15 < val_fraction -> val"
VAL_SOURCE_RULE = "source -> train, val_source -> val"
VAL_OVERLAP = ("drop", "keep")
_LITDATA_FILE = re.compile(r"^(index\.json|chunk-\d+-\d+\.bin|\d+-index\.json)$")


@dataclass(frozen=True)
class SourceFile:
    """A file to read and which split its documents may go to (``hash``, ``train`` or ``val``)."""

    path: Path
    split: str
    builtin: str | None = None


@dataclass
class Request:
    """What a prepare is asked for, in the terms the manifest records.

    Attributes:
        tokenizer, tokenizer_fingerprint, sources, val_sources, val_fraction, split_rule, documents_mode,
            text_field, corpus: as in ``Manifest``.
        files: ``[path, split, size]`` of every file (size: the Python version for a built-in corpus); None when
            the source cannot be listed here (then ``sources`` are compared by name, unless they are None too: a
            corpus downloaded when preparing, whose files only the shards know).
        train_files, val_files: the resolved files (empty when ``files`` is None).
    """

    tokenizer: str
    tokenizer_fingerprint: str
    sources: list[str] | None
    val_sources: list[str] | None
    val_fraction: float
    split_rule: str | None
    documents_mode: str
    text_field: str
    corpus: str | None
    files: list[list] | None
    val_overlap: str = "drop"
    train_files: list[SourceFile] = field(default_factory=list)
    val_files: list[SourceFile] = field(default_factory=list)


def fingerprint_of(tokenizer: str, bpe_file: str | None, data_dir: Any = None) -> str:
    """The vocabulary fingerprint of a tokenizer: its known constant, else from the vocabulary (which must load).

    Raises:
        ValueError: no known constant and the vocabulary is not at hand; the message says how to provide it.
    """
    known = known_fingerprint(tokenizer)
    if known is not None:
        return known
    if not can_load_offline(tokenizer, bpe_file):
        where = f"the shards at {data_dir}" if data_dir is not None else "the shards"
        raise ConfigError(
            f"Cannot verify that {where} were made with tokenizer {tokenizer!r}: its vocabulary is not at hand and "
            "has no built-in fingerprint. Make it available with --data.bpe_file PATH (prepare: --bpe_file PATH), "
            "or set the environment variable LIGHTNING_CQK_GPT2_BPE=PATH."
        )
    return get_tokenizer(tokenizer, bpe_file).fingerprint


def resolve(sources: list[str], split: str) -> list[SourceFile]:
    """Every file of ``sources`` (built-in corpora as one entry each), tagged with ``split``."""
    files: list[SourceFile] = []
    for spec in sources:
        name = builtin_name(spec)
        if name is not None:
            files.append(SourceFile(Path(spec), split, builtin=name))
        else:
            files.extend(SourceFile(p.resolve(), split) for p in list_source_files(spec))
    return files


def signature(files: list[SourceFile]) -> list[list]:
    """What must match for a finished directory to be reused: each file's path, split and size (or Python)."""
    return [[str(f.path), f.split, platform.python_version() if f.builtin else f.path.stat().st_size] for f in files]


def file_entries(files: list[SourceFile]) -> list[dict]:
    """The manifest's ``files`` entries."""
    entries = []
    for f, (path, split, size) in zip(files, signature(files)):
        entry: dict[str, Any] = {"path": path, "split": split}
        if f.builtin:
            entry.update(python=size, stdlib=str(stdlib_root()))
        else:
            entry["bytes"] = size
        entries.append(entry)
    return entries


def check_disjoint(train: list[SourceFile], val: list[SourceFile]) -> None:
    """Refuse a file that is in both source and val_source."""
    shared = {f.path for f in train} & {f.path for f in val}
    if shared:
        raise ConfigError(
            f"{len(shared)} file(s) are in both source and val_source (e.g. {sorted(shared)[0]}); their documents "
            "would be in both splits. Make the two sources disjoint."
        )


def build_request(spec: PrepareSpec, fingerprint: str, listable: bool = True) -> Request:
    """The request for ``spec.source`` (and ``spec.val_source``) with the spec's settings and the tokenizer's
    ``fingerprint``; ``listable=False`` leaves ``files`` None (not read here).

    ``spec.source`` None (a corpus to download) leaves ``sources`` and ``files`` None: only the settings are compared.
    A named corpus is compared by what it resolves to: pass the spec with its plain files in place (``prepare.py``,
    ``datamodule.py``).
    """
    source = spec.source
    sources = as_source_list(source) if source is not None else None
    listable = listable and sources is not None
    val_sources = as_source_list(spec.val_source) if spec.val_source is not None else None
    train_files = val_files = []
    files = None
    if listable:
        train_files = resolve(sources, "train" if val_sources is not None else "hash")
        val_files = resolve(val_sources, "val") if val_sources is not None else []
        check_disjoint(train_files, val_files)
        files = signature(train_files + val_files)
    return Request(
        tokenizer=spec.tokenizer,
        tokenizer_fingerprint=fingerprint,
        sources=sources,
        val_sources=val_sources,
        val_fraction=spec.val_fraction,
        split_rule=None if source is None else SPLIT_RULE if val_sources is None else VAL_SOURCE_RULE,
        documents_mode=spec.documents,
        text_field=spec.text_field,
        corpus=spec.corpus,
        files=files,
        val_overlap=spec.val_overlap,
        train_files=train_files,
        val_files=val_files,
    )


def differences(manifest: Manifest, request: Request) -> list[str]:
    """What differs between a finished directory's manifest and a request, one phrase each (empty: reusable)."""
    out: list[str] = []
    if manifest.tokenizer != request.tokenizer:
        out.append(f"tokenizer: prepared {manifest.tokenizer!r}, asked {request.tokenizer!r}")
    elif manifest.tokenizer_fingerprint != request.tokenizer_fingerprint:
        out.append(
            f"tokenizer_fingerprint: prepared {manifest.tokenizer_fingerprint[:12]}, asked "
            f"{request.tokenizer_fingerprint[:12]} (another {request.tokenizer!r} vocabulary)"
        )
    if manifest.corpus is not None and manifest.corpus != request.corpus:
        out.append(f"corpus: prepared {manifest.corpus!r}, asked {request.corpus!r}")
    if request.split_rule is None:
        pass  # a corpus to download: its files (and so its split rule) are known to the shards only
    elif manifest.split_rule != request.split_rule:
        out.append(f"split_rule: prepared {manifest.split_rule!r}, asked {request.split_rule!r}")
    elif request.val_sources is None and manifest.val_fraction != request.val_fraction:
        out.append(f"val_fraction: prepared {manifest.val_fraction}, asked {request.val_fraction}")
    if manifest.split_rule == VAL_SOURCE_RULE == request.split_rule and manifest.val_overlap != request.val_overlap:
        out.append(f"val_overlap: prepared {manifest.val_overlap!r}, asked {request.val_overlap!r}")
    for key in ("documents_mode", "text_field"):
        if getattr(manifest, key) != getattr(request, key):
            out.append(f"{key}: prepared {getattr(manifest, key)!r}, asked {getattr(request, key)!r}")
    if request.files is None:
        if request.sources is None:
            return out
        if (manifest.sources, manifest.val_sources) != (request.sources, request.val_sources):
            out.append(f"sources: prepared {_short(manifest.sources)}, asked {_short(request.sources)}")
        return out
    prepared = {
        f.get("path"): [f.get("split"), f.get("python") if "python" in f else f.get("bytes")] for f in manifest.files
    }
    asked = {path: [split, size] for path, split, size in request.files}
    missing = [p for p in prepared if p not in asked]
    added = [p for p in asked if p not in prepared]
    changed = [p for p in asked if p in prepared and asked[p] != prepared[p]]
    if missing or added or changed:
        parts = []
        if added:
            parts.append(f"{len(added)} file(s) not in the shards (e.g. {added[0]})")
        if missing:
            parts.append(f"{len(missing)} file(s) in the shards but not asked for (e.g. {missing[0]})")
        if changed:
            p = changed[0]
            parts.append(
                f"{len(changed)} file(s) changed since (e.g. {p}: split/size prepared {prepared[p]}, now {asked[p]})"
            )
        out.append("files: " + "; ".join(parts))
    return out


def _short(value: object, limit: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe(manifest: Manifest) -> str:
    """What a finished directory was made from, in a few words."""
    what = f"corpus {manifest.corpus!r} from " if manifest.corpus else ""
    sources = manifest.sources + (manifest.val_sources or [])
    shown = ", ".join(sources[:3]) + (f" (+{len(sources) - 3} more)" if len(sources) > 3 else "")
    return f"{what}{shown} with tokenizer {manifest.tokenizer!r} ({len(manifest.files)} file(s))"


def prepare_command(output_dir: Any, source: Any, **settings: Any) -> str:
    """A ``lightning_cqk prepare`` command line that rebuilds ``output_dir`` with these settings, ready to paste.

    ``settings`` are ``prepare``'s keyword arguments; None values are left out, lists are given as JSON.
    """
    parts = ["lightning_cqk", "prepare"]
    for key, value in {"source": source, "output_dir": output_dir, **settings}.items():
        if value is None:
            continue
        if isinstance(value, (list, tuple)):
            value = json.dumps([str(v) for v in value])
        elif isinstance(value, bool):
            value = "true" if value else "false"
        parts += [f"--{key}", shlex.quote(str(value))]
    return " ".join(parts)


def free_dir_beside(data_dir: Any, stem: str) -> str:
    """A directory name beside ``data_dir`` that does not exist yet: ``<parent>/<stem>``, ``<stem>-2``, ...

    For an ``s3://`` prefix, the sibling prefix ``<parent>/<stem>`` (not checked).
    """
    if "://" in str(data_dir):
        return f"{str(data_dir).rstrip('/').rsplit('/', 1)[0]}/{stem}"
    parent = Path(str(data_dir)).expanduser().parent
    candidate = parent / stem
    n = 2
    while candidate.exists():
        candidate = parent / f"{stem}-{n}"
        n += 1
    return str(candidate)


def owned_split_dir(path: Path) -> bool:
    """Whether a ``train/`` or ``val/`` folder is this framework's to delete: absent, empty, or a litdata split."""
    if not path.exists():
        return True
    if not path.is_dir():
        return False
    try:
        data = json.loads((path / "index.json").read_text())
        if isinstance(data, dict) and "chunks" in data and "config" in data:
            return True
    except (OSError, ValueError):
        pass
    # No readable index (a damaged split): ours only if it holds nothing but litdata's files.
    return all(p.is_file() and _LITDATA_FILE.match(p.name) for p in path.iterdir())
