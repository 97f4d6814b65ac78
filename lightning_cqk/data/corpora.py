"""Named corpora of the papers: where their text comes from, in which format, and how it is split.

``corpus`` names one of ``CORPORA`` (``wikitext103``, ``wikitext2``, ``pubmed``, ``openwebtext``, ``c4``,
``slimpajama``); ``text`` is any local text with no format of its own. Each corpus has

* an **offline source**: a local file, folder or glob in the corpus's own format (``data.source``), read with the
  corpus's document rule: WikiText ``wiki.{train,valid,test}.raw`` (an article per `` = Title = `` heading);
  PubMed as JSON lines, PubTator (``pmid|t|``/``pmid|a|`` blocks) or plain blank-line separated abstracts; web text
  (OpenWebText, C4, SlimPajama) as JSON lines with a ``text`` field;
* an **online source** (a Hugging Face ``datasets`` name), downloaded into ``<output_dir>/raw/`` when no offline
  source is given. ``datasets`` is not a dependency of this package (the ``data`` extra installs it); it is imported
  only then. A download that cannot happen (``datasets`` missing, the machine offline or set offline, the Hub
  refusing) fails at once in one paragraph: the corpus, the reason, and this command again with ``--data.source
  PATH`` (``prepare``: ``--source PATH``) for a local copy (``DownloadUnavailable``).

**Splits.** The corpus's own splits are kept where the files carry them: a file whose name says train
(``train``, ``training``) goes to train, one that says validation (``valid``, ``validation``, ``dev``,
``development``) to val; test files are left out (the shards have train and val only; the test split stays unseen
for a final evaluation). Files that name no split beside named ones are ambiguous (more training text? another
corpus in the same folder?), so ``other_files`` says what to do with them: ``refuse`` (the default: stop and show
what each file holds), ``train`` (add them to train), ``hash`` (ignore the file names: every non-test file is split
by the document hash of ``prepare``) or ``leave_out``. Documentation files (README, LICENSE, SOURCE, ...) are never
read as text. Without both a train and a validation file, all files are split by the document hash.

Nothing is left out silently: every file left out is counted (documents and bytes) and printed by ``prepare`` as
one block, and recorded in the manifest's ``left_out`` (issue 13, class 9).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from lightning_cqk.data.sources import WorkUnit, iter_unit_documents, list_source_files
from lightning_cqk.errors import ConfigError, MissingInputError, UnavailableError
from lightning_cqk.files.atomic import write_json_atomically

OTHER_FILES = ("refuse", "train", "hash", "leave_out")
"""What ``resolve_corpus`` does with files that name no split beside files that do (see the module docstring)."""
_DOCUMENTATION = {"readme", "license", "licence", "copying", "notice", "source", "changelog", "citation", "authors"}
DOCUMENTATION = "documentation (README, LICENSE, SOURCE, ...)"
_COUNT_LIMIT = 256 << 20  # left-out files larger than this are not read to count their documents


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
class LeftOut:
    """A file of the source that the shards do not hold: why, and how much it holds.

    Attributes:
        path: the file.
        reason: why it is left out, in words.
        documents: its documents under the corpus's rule (None: not counted, or not readable in that format).
        bytes: its size.
        unreadable: why it could not be read in the corpus's format, when it could not.
    """

    path: str
    reason: str
    documents: int | None
    bytes: int
    unreadable: str | None = None

    def describe(self) -> str:
        """``path (N documents, X MB)``."""
        if self.unreadable:
            docs = f"not readable in this corpus's format: {self.unreadable}"
        else:
            docs = f"{self.documents:,} documents" if self.documents is not None else "documents not counted"
        return f"{self.path} ({docs}; {self.bytes / 1e6:.2f} MB)"


@dataclass(frozen=True)
class ResolvedCorpus:
    """What ``prepare`` reads for a corpus: sources (``val_source`` None: hash split) and the document rule.

    Attributes:
        name: the corpus.
        source, val_source: the files for train (or for the hash split) and for val.
        documents, text_field: the corpus's document rule and JSON field.
        left_out: every file of the source that is not read, with the reason and its size.
        rule: how the splits were decided, in words.
    """

    source: list[str]
    val_source: list[str] | None
    documents: str
    text_field: str
    left_out: tuple[LeftOut, ...] = ()
    name: str = ""
    rule: str = ""

    @property
    def held_out(self) -> list[str]:
        """The left-out corpus files (test splits and files that name no split), not documentation."""
        return [e.path for e in self.left_out if not e.reason.startswith(DOCUMENTATION)]

    def left_out_entries(self) -> list[dict]:
        """``left_out`` in the manifest's form."""
        return [
            {
                "path": e.path,
                "reason": e.reason + (f" (unreadable: {e.unreadable})" if e.unreadable else ""),
                "documents": e.documents,
                "bytes": e.bytes,
            }
            for e in self.left_out
        ]

    def summary(self) -> str:
        """What is read and what is left out, for ``prepare``'s output (one block, every left-out file counted)."""
        n_train, n_val = len(self.source), len(self.val_source or [])
        lines = [f"prepare: corpus {self.name!r}: {self.rule} ({n_train + n_val} file(s) read)."]
        docs = [e for e in self.left_out if e.reason.startswith(DOCUMENTATION)]
        data = [e for e in self.left_out if not e.reason.startswith(DOCUMENTATION)]
        if docs:
            lines.append(f"prepare: {DOCUMENTATION}, not read: {', '.join(Path(e.path).name for e in docs)}.")
        if data:
            counted = sum(e.documents or 0 for e in data)
            lines.append(
                f"prepare: LEFT OUT of corpus {self.name!r}: {len(data)} file(s), {counted:,} documents counted in "
                f"them, {sum(e.bytes for e in data) / 1e6:.2f} MB:"
            )
            lines += [f"prepare:   {e.reason}: {e.describe()}" for e in data]
        return "\n".join(lines)


def get_corpus(name: str) -> Corpus:
    """The corpus called ``name``; a ValueError lists the known ones."""
    if name not in CORPORA:
        raise ConfigError(f"Unknown corpus {name!r}. {corpus_options()}")
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
    name: str,
    source: str | list[str] | None,
    download_dir: str | Path | None = None,
    max_documents: int | None = None,
    other_files: str = "refuse",
    overwrite: bool = False,
    count_documents: bool = True,
) -> ResolvedCorpus:
    """The files to prepare for corpus ``name``, from ``source`` or (when None) downloaded into ``download_dir``.

    Args:
        other_files: what to do with files that name no split beside files that do (``OTHER_FILES``).
        overwrite: a finished download made with another ``max_documents`` is downloaded again (else refused).
        count_documents: read the left-out files to count their documents (False: only a refusal counts them).

    Raises:
        FileNotFoundError: no offline source and no online one (or no ``download_dir``); the message names the
            options.
        ValueError: files that name no split beside named ones, with ``other_files="refuse"``: the message lists
            every file with its documents and the choices.
    """
    corpus = get_corpus(name)
    if source is None:
        if corpus.hf_name is None or download_dir is None:
            raise MissingInputError(
                f"Corpus {name!r} needs a local source (fit: --data.source PATH; prepare: --source PATH): "
                f"{corpus.description}.\n" + corpus_options()
            )
        source = [str(p) for p in download_corpus(corpus, download_dir, max_documents, overwrite)]
    try:
        files = list_source_files(source)
    except (FileNotFoundError, ValueError) as err:
        raise MissingInputError(
            f"Corpus {name!r}: {err}\nExpected {corpus.description}, or no source to download "
            f"{corpus.hf_name or '(no online source)'}.\n" + corpus_options()
        ) from None
    if other_files not in OTHER_FILES:
        raise ConfigError(f"other_files={other_files!r} is not one of {', '.join(map(repr, OTHER_FILES))}.")
    left_out: list[LeftOut] = []
    by_split: dict[str | None, list[str]] = {}
    for path in files:
        if _is_documentation(path):
            left_out.append(LeftOut(str(path), DOCUMENTATION, None, path.stat().st_size))
        elif path.suffix.lower() not in corpus.suffixes:
            reason = f"not a {'/'.join(corpus.suffixes)} file of the {name!r} format"
            left_out.append(LeftOut(str(path), reason, None, path.stat().st_size))
        else:
            by_split.setdefault(split_of(path), []).append(str(path))
    if not by_split:
        raise MissingInputError(
            f"Corpus {name!r}: {source!r} holds no {'/'.join(corpus.suffixes)} files. Expected "
            f"{corpus.description}.\n" + corpus_options()
        )

    def count(paths: list[str], reason: str) -> list[LeftOut]:
        return [_left_out(corpus, p, reason, count_documents) for p in paths]

    train, val, test, other = (by_split.get(k, []) for k in ("train", "val", "test", None))
    if not (train and val):
        everything = train + val + test + other
        rule = "no train and validation file pair: every file is split by document hash"
        if test:
            rule += f" (test-named files included: {', '.join(Path(p).name for p in test)})"
        return ResolvedCorpus(everything, None, corpus.documents, corpus.text_field, tuple(left_out), name, rule)
    left_out += count(test, "test split (kept unseen)")
    if other and other_files == "refuse":
        unnamed = [_left_out(corpus, p, "names no split") for p in other]
        tests = [_left_out(corpus, e.path, e.reason) if e.reason.startswith("test") else e for e in left_out]
        tests = [e for e in tests if e.reason.startswith("test")]
        named = [_left_out(corpus, p, "train") for p in train] + [_left_out(corpus, p, "val") for p in val]
        biggest = max(unnamed, key=lambda e: (e.documents or 0, e.bytes))
        raise ConfigError(
            f"Corpus {name!r} at {source!r}: some files name their split, but {len(unnamed)} file(s) name none and "
            "would be left out.\n"
            + "".join(f"  {e.reason}: {e.describe()}\n" for e in named + unnamed + tests)
            + "Say what to do with the files that name no split: other_files=train (add them to train), hash (ignore "
            "the file names; split every non-test file by document hash) or leave_out (prepare: --other_files "
            "train|hash|leave_out; fit: --data.other_files ...); or point the source at the files you mean, e.g. "
            f"{biggest.path}."
        )
    if other_files == "hash":
        rule = "other_files=hash: file-name splits ignored, every non-test file split by document hash"
        return ResolvedCorpus(
            train + val + other, None, corpus.documents, corpus.text_field, tuple(left_out), name, rule
        )
    if other_files == "train":
        train = train + other
    else:
        left_out += count(other, "names no split (other_files=leave_out)")
    rule = f"the files' own splits: train {len(train)} file(s), val {len(val)} file(s)"
    return ResolvedCorpus(train, val, corpus.documents, corpus.text_field, tuple(left_out), name, rule)


def _is_documentation(path: Path) -> bool:
    """README, LICENSE, SOURCE.md and the like: about the corpus, not part of it."""
    return path.name.split(".")[0].lower() in _DOCUMENTATION


def _left_out(corpus: Corpus, path: str, reason: str, count: bool = True) -> LeftOut:
    """A file with its document count under the corpus's rule (None when too large to read, unreadable, or not
    ``count``)."""
    size = Path(path).stat().st_size
    if size > _COUNT_LIMIT or not count:
        return LeftOut(path, reason, None, size)
    try:
        documents = sum(1 for _ in iter_unit_documents(WorkUnit(path), corpus.text_field, corpus.documents))
    except ValueError as err:
        return LeftOut(path, reason, None, size, unreadable=str(err))
    return LeftOut(path, reason, documents, size)


def download_corpus(
    corpus: Corpus, dest: str | Path, max_documents: int | None = None, overwrite: bool = False
) -> list[Path]:
    """Download a corpus's online splits into ``dest`` in its own offline format; reuses a finished download.

    Rows are streamed (``streaming=True``), so ``max_documents`` can take the head of a corpus too large to fetch
    whole. A split is written to a temporary name and renamed when complete.
    """
    try:
        import datasets
    except ImportError:
        raise DownloadUnavailable(
            corpus, "the Hugging Face `datasets` package is not installed (`pip install 'datasets>=2.19'`)"
        ) from None
    refusal = hub_unreachable()
    if refusal is not None:
        raise DownloadUnavailable(corpus, refusal)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    record = dest / ".download.json"  # what was asked for: a finished download is reused only for the same ask
    asked = {"hf_name": corpus.hf_name, "hf_config": corpus.hf_config, "max_documents": max_documents}
    paths = [
        dest / (f"wiki.{stem}.raw" if corpus.raw_format == "wikitext" else f"{stem}.jsonl")
        for _, stem in corpus.hf_splits
    ]
    if record.is_file() and json.loads(record.read_text()) != asked and overwrite:
        for path in paths:  # files this function wrote (named by the record's corpus), never anything else
            path.unlink(missing_ok=True)
        record.unlink()
    if record.is_file():
        done = json.loads(record.read_text())
        if done != asked:
            raise ConfigError(
                f"{dest} holds a download of {done} but {asked} is asked now; it would be reused as it is. Use "
                f"another data_dir (the download goes to <data_dir>/raw), or ask for max_documents="
                f"{done.get('max_documents')}, or rebuild with overwrite=True (prepare: --overwrite true), "
                "which downloads again."
            )
    else:
        write_json_atomically(record, asked)
    written = []
    for hf_split, stem in corpus.hf_splits:
        path = dest / (f"wiki.{stem}.raw" if corpus.raw_format == "wikitext" else f"{stem}.jsonl")
        if not path.exists():
            tmp = path.with_name(path.name + ".part")
            try:
                rows = datasets.load_dataset(corpus.hf_name, corpus.hf_config, split=hf_split, streaming=True)
                with tmp.open("w", encoding="utf-8") as f:
                    for i, row in enumerate(rows):
                        if max_documents is not None and i >= max_documents:
                            break
                        text = row[corpus.hf_text_field]
                        f.write(text if corpus.raw_format == "wikitext" else json.dumps({"text": text}) + "\n")
            except network_errors() as err:
                tmp.unlink(missing_ok=True)
                raise DownloadUnavailable(corpus, download_failure(err, corpus.hf_name)) from err
            tmp.replace(path)
        written.append(path)
    return written


# ------------------------------------------------------------------------------------------ when it cannot download
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
_PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")
HUB_PROBE_SECONDS = 5.0


class DownloadUnavailable(UnavailableError):
    """A named corpus that cannot be downloaded here; the message is one paragraph: which corpus, why, and the
    command that uses a local copy instead."""

    def __init__(self, corpus: Corpus, reason: str) -> None:
        self.corpus, self.reason = corpus, reason
        super().__init__(
            f"corpus {corpus.name!r} cannot be downloaded from the Hugging Face Hub ({corpus.hf_name}): {reason}. "
            f"Give it a local copy instead, {corpus.description}: {local_source_command()} (PATH: a file, folder "
            "or glob; `lightning_cqk prepare --help` lists the formats)."
        )


def hub_unreachable() -> str | None:
    """Why the Hub cannot be reached from here, or None: set offline, or its host refuses a TCP connection within
    `HUB_PROBE_SECONDS` (probed unless a proxy is configured; `datasets` would retry for minutes instead)."""
    for name in OFFLINE_VARIABLES:
        if os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off"):
            return f"this machine is set offline ({name}={os.environ[name]})"
    if any(os.environ.get(name) for name in _PROXY_VARIABLES):
        return None
    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = endpoint.hostname or "huggingface.co", endpoint.port or (80 if endpoint.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=HUB_PROBE_SECONDS).close()
    except OSError as err:
        return f"{host}:{port} cannot be reached from this machine (offline? {err.strerror or err})"
    return None


def network_errors() -> tuple[type[BaseException], ...]:
    """The exceptions a failed download raises: OSError (ConnectionError, requests' errors, the Hub's HTTP errors,
    `datasets`' DatasetNotFoundError) and the HTTP clients' own bases (httpx, httpx2), when installed."""
    found: list[type[BaseException]] = [OSError]
    for module in ("httpx", "httpx2"):
        try:
            found.append(__import__(module).HTTPError)
        except (ImportError, AttributeError):
            pass
    return tuple(found)


def download_failure(err: BaseException, hf_name: str | None) -> str:
    """The reason a download failed, in words: the Hub refused (an HTTP 401/403/404, a gated or missing dataset) or
    the connection failed."""
    text = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
    refused = re.search(r"\b(401|403|404|429)\b|gated|not found|doesn't exist|does not exist|unauthori", text, re.I)
    if refused or "NotFound" in type(err).__name__:
        return f"the Hub refused {hf_name} ({text[:300]})"
    return f"the download failed ({text[:300]})"


def local_source_command(argv: list[str] | None = None) -> str:
    """This command line again with `--data.source PATH` (`prepare`: `--source PATH`) in place of any source it
    gave; outside the command line, both forms."""
    argv = list(sys.argv if argv is None else argv)
    command = argv[1] if len(argv) > 1 else ""
    if command in ("fit", "validate", "test", "predict"):
        flags = ("--data.source", "--data.init_args.source")
    elif command == "prepare":
        flags = ("--source",)
    else:
        return "`lightning_cqk fit ... --data.source PATH` (`lightning_cqk prepare ... --source PATH`)"
    kept, skip = [], False
    for arg in argv[2:]:
        if skip:
            skip = False
            continue
        if arg.split("=", 1)[0] in flags:
            skip = "=" not in arg
            continue
        kept.append(arg)
    return "`" + shlex.join(["lightning_cqk", command, *kept, flags[0]]) + " PATH`"
