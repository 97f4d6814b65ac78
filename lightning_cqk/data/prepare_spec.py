"""``PrepareSpec``: what one ``prepare`` is asked to build, as one typed object.

``prepare`` (the ``lightning_cqk prepare`` command, whose flags are its keyword arguments) builds one from its
arguments; the DataModules build one from their ``data.*`` arguments (a mixture: one per component). The spec then
travels unchanged through the orchestration (``prepare.py``) down to the request that a finished folder is compared
with (``request.build_request``); a named corpus, once resolved, gives a copy with its plain files
(``dataclasses.replace``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PrepareSpec:
    """The options of one prepare (text -> token shards); each field as the argument of ``prepare`` it comes from.

    Attributes:
        source: text file, directory, glob, list of them, or ``builtin:<name>``; None: download ``corpus``.
        output_dir: the folder that receives ``train/``, ``val/`` and ``manifest.json`` (or an ``s3://`` prefix).
        tokenizer: ``bytes`` or ``gpt2``.
        bpe_file: local GPT-2 ``.tiktoken`` file for offline use.
        val_fraction: share of documents (by a hash of their text) that go to validation.
        val_source: separate validation text; then all of ``source`` is train.
        text_field: JSON field that holds the text in JSON-lines files.
        documents: what one document is in plain-text files: ``file``, ``paragraph`` or ``line``.
        num_workers: processes that tokenize in parallel (the DataModules' ``prepare_workers``).
        chunk_bytes: size of a litdata chunk, e.g. ``64MB``.
        overwrite: rebuild even when finished shards exist.
        corpus: a named corpus (``corpora.CORPORA``), or None for plain text.
        max_documents: with a corpus download, at most this many rows of each online split.
        other_files: with a corpus whose files name their splits, what to do with files that name none.
        val_overlap: ``drop`` or ``keep`` training documents equal to a validation document.
    """

    source: str | list[str] | None
    output_dir: str
    tokenizer: str = "bytes"
    bpe_file: str | None = None
    val_fraction: float = 0.05
    val_source: str | list[str] | None = None
    text_field: str = "text"
    documents: str = "file"
    num_workers: int = 1
    chunk_bytes: str = "64MB"
    overwrite: bool = False
    corpus: str | None = None
    max_documents: int | None = None
    other_files: str = "refuse"
    val_overlap: str = "drop"
