"""Named corpora of the papers: where their text comes from, in which format, and how it is split.

``corpus`` names one of ``CORPORA`` (``wikitext103``, ``wikitext2``, ``pubmed``, ``openwebtext``, ``c4``,
``slimpajama``); ``text`` is any local text with no format of its own. Each corpus has

* an **offline source**: a local file, folder or glob in the corpus's own format (``data.source``), read with the
  corpus's document rule: WikiText ``wiki.{train,valid,test}.raw`` (an article per `` = Title = `` heading);
  PubMed as JSON lines, PubTator (``pmid|t|``/``pmid|a|`` blocks) or plain blank-line separated abstracts; web text
  (OpenWebText, C4, SlimPajama) as JSON lines with a ``text`` field;
* an **online source** (a Hugging Face ``datasets`` name), downloaded into ``<output_dir>/raw/`` when no offline
  source is given. ``datasets`` is not a dependency of this package; it is imported only then.

**Splits.** The corpus's own splits are kept where the files carry them: a file whose name says train
(``train``, ``training``) goes to train, one that says validation (``valid``, ``validation``, ``dev``,
``development``) to val; test files, and files that name no split, are left out (the shards have train and val
only).
Without both a train and a validation file, all files are split by the document hash of ``prepare``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from lightning_cqk.data.sources import list_source_files


@dataclass(frozen=True)
class Corpus:
    """A named corpus: how its local files are read and where it lives online.

    Attributes:
        name: the name used in configs (``data.corpus``).
        description: one line for error messages and listings.
        documents: the plain-text document rule (``sources.DOCUMENT_MODES``); JSON lines are always one per line.
        text_field: the JSON field that holds the text.
        hf_name: Hugging Face dataset (``datasets.load_dataset`` path); None: no online source.
        hf_config: its configuration name.
        hf_text_field: the text column of the online dataset.
        hf_splits: online split -> our file stem (``train``, ``valid``, ``test``).
        raw_format: how downloaded rows are stored: ``jsonl`` (one record each) or ``wikitext`` (rows are lines of
            ``wiki.<split>.raw``).
        suffixes: the file suffixes of the corpus's format; other files in a source folder (a README, SOURCE.md)
            are skipped.
    """

    name: str
    description: str
    documents: str
    text_field: str = "text"
    hf_name: str | None = None
    hf_config: str | None = None
    hf_text_field: str = "text"
    hf_splits: tuple[tuple[str, str], ...] = (("train", "train"),)
    raw_format: str = "jsonl"
    suffixes: tuple[str, ...] = (".jsonl", ".json")


_WIKI_SPLITS = (("train", "train"), ("validation", "valid"), ("test", "test"))
CORPORA: dict[str, Corpus] = {
    c.name: c
    for c in (
        Corpus(
            "wikitext103",
            "WikiText-103 raw: a folder with wiki.{train,valid,test}.raw",
            "wikitext",
            hf_name="Salesforce/wikitext",
            hf_config="wikitext-103-raw-v1",
            hf_splits=_WIKI_SPLITS,
            raw_format="wikitext",
            suffixes=(".raw",),
        ),
        Corpus(
            "wikitext2",
            "WikiText-2 raw: a folder with wiki.{train,valid,test}.raw",
            "wikitext",
            hf_name="Salesforce/wikitext",
            hf_config="wikitext-2-raw-v1",
            hf_splits=_WIKI_SPLITS,
            raw_format="wikitext",
            suffixes=(".raw",),
        ),
        Corpus(
            "pubmed",
            "PubMed abstracts: JSON lines ('text'), PubTator files, or plain text (one abstract per paragraph)",
            "pubtator",
            hf_name="ccdv/pubmed-summarization",
            hf_text_field="abstract",
            hf_splits=(("train", "train"), ("validation", "valid"), ("test", "test")),
            suffixes=(".jsonl", ".json", ".txt"),
        ),
        Corpus(
            "openwebtext",
            "OpenWebText: JSON lines with a 'text' field",
            "file",
            hf_name="Skylion007/openwebtext",
        ),
        Corpus(
            "c4",
            "C4 (English): JSON lines with a 'text' field",
            "file",
            hf_name="allenai/c4",
            hf_config="en",
            hf_splits=(("train", "train"), ("validation", "valid")),
        ),
        Corpus(
            "slimpajama",
            "SlimPajama: JSON lines with a 'text' field",
            "file",
            hf_name="cerebras/SlimPajama-627B",
            hf_splits=(("train", "train"), ("validation", "valid"), ("test", "test")),
        ),
        Corpus(
            "text",
            "any local text (files, folders or globs; see `lightning_cqk prepare --help`)",
            "file",
            suffixes=(".txt", ".md", ".raw", ".text", ".jsonl", ".json"),
        ),
    )
}

_SPLIT_WORDS = {
    "train": ("train", "training", "trainingset"),
    "val": ("valid", "validation", "dev", "development", "developmentset", "val"),
    "test": ("test", "testset"),
}


@dataclass(frozen=True)
class ResolvedCorpus:
    """What ``prepare`` reads for a corpus: sources (``val_source`` None: hash split) and the document rule."""

    source: list[str]
    val_source: list[str] | None
    documents: str
    text_field: str
    held_out: list[str]


def get_corpus(name: str) -> Corpus:
    """The corpus called ``name``; a ValueError lists the known ones."""
    if name not in CORPORA:
        raise ValueError(f"Unknown corpus {name!r}. {corpus_options()}")
    return CORPORA[name]


def corpus_options() -> str:
    """Every corpus with its offline format and online source, for error messages."""
    lines = [
        f"  {c.name:<12} {c.description}; online: {c.hf_name or 'none'}{f' ({c.hf_config})' if c.hf_config else ''}"
        for c in CORPORA.values()
    ]
    return "Known corpora (data.corpus), with their offline source format (data.source) and online source:\n" + (
        "\n".join(lines)
    )


def split_of(path: str | Path) -> str | None:
    """The split a file name names (``train``, ``val`` or ``test``), or None."""
    words = set(re.split(r"[^a-z]+", Path(path).name.lower()))
    for split, names in _SPLIT_WORDS.items():
        if words & set(names):
            return split
    return None


def resolve_corpus(
    name: str, source: str | list[str] | None, download_dir: str | Path | None = None, max_documents: int | None = None
) -> ResolvedCorpus:
    """The files to prepare for corpus ``name``, from ``source`` or (when None) downloaded into ``download_dir``.

    Raises:
        FileNotFoundError: no offline source and no online one (or no ``download_dir``); the message names the
            options.
    """
    corpus = get_corpus(name)
    if source is None:
        if corpus.hf_name is None or download_dir is None:
            raise FileNotFoundError(
                f"Corpus {name!r} needs a local source (data.source / --source): {corpus.description}.\n"
                + corpus_options()
            )
        source = [str(p) for p in download_corpus(corpus, download_dir, max_documents)]
    try:
        files = list_source_files(source)
    except (FileNotFoundError, ValueError) as err:
        raise FileNotFoundError(
            f"Corpus {name!r}: {err}\nExpected {corpus.description}, or no source to download "
            f"{corpus.hf_name or '(no online source)'}.\n" + corpus_options()
        ) from None
    files = [p for p in files if p.suffix.lower() in corpus.suffixes]
    if not files:
        raise FileNotFoundError(
            f"Corpus {name!r}: {source!r} holds no {'/'.join(corpus.suffixes)} files. Expected "
            f"{corpus.description}.\n" + corpus_options()
        )
    by_split: dict[str | None, list[str]] = {}
    for path in files:
        by_split.setdefault(split_of(path), []).append(str(path))
    if by_split.get("train") and by_split.get("val"):
        held_out = by_split.get("test", []) + by_split.get(None, [])  # test, and files that name no split
        return ResolvedCorpus(by_split["train"], by_split["val"], corpus.documents, corpus.text_field, held_out)
    everything = [str(p) for p in files]
    return ResolvedCorpus(everything, None, corpus.documents, corpus.text_field, [])


def download_corpus(corpus: Corpus, dest: str | Path, max_documents: int | None = None) -> list[Path]:
    """Download a corpus's online splits into ``dest`` in its own offline format; reuses a finished download.

    Rows are streamed (``streaming=True``), so ``max_documents`` can take the head of a corpus too large to fetch
    whole. A split is written to a temporary name and renamed when complete.
    """
    try:
        import datasets
    except ImportError:
        raise ImportError(
            f"Downloading corpus {corpus.name!r} ({corpus.hf_name}) needs the Hugging Face `datasets` package "
            "(`pip install datasets`), or give a local copy as data.source / --source.\n" + corpus_options()
        ) from None
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for hf_split, stem in corpus.hf_splits:
        path = dest / (f"wiki.{stem}.raw" if corpus.raw_format == "wikitext" else f"{stem}.jsonl")
        if not path.exists():
            rows = datasets.load_dataset(corpus.hf_name, corpus.hf_config, split=hf_split, streaming=True)
            tmp = path.with_name(path.name + ".part")
            with tmp.open("w", encoding="utf-8") as f:
                for i, row in enumerate(rows):
                    if max_documents is not None and i >= max_documents:
                        break
                    text = row[corpus.hf_text_field]
                    f.write(text if corpus.raw_format == "wikitext" else json.dumps({"text": text}) + "\n")
            tmp.replace(path)
        written.append(path)
    return written
