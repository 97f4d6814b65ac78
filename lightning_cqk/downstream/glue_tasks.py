"""The nine GLUE tasks: what each one is, and how to read its examples from disk or from the Hugging Face hub.

No Lightning and no torch here: a task's data is a list of ``Example`` per split, read by ``load_task``.

Where the files come from, tried in this order for each task (``source: auto``):

1. **The official GLUE layout**, ``<data_dir>/<Folder>/train.tsv`` and ``dev.tsv`` (MNLI: ``dev_matched.tsv`` and
   ``dev_mismatched.tsv``), as written by GLUE's ``download_glue_data.py``. Columns are found by their header names
   (CoLA has no header: source, label, annotation, sentence). Label strings (``entailment``, ...) and numeric labels
   (Hugging Face exports) are both accepted.
2. **The original releases** the GLUE files were made from: CoLA 1.1 raw (``in_domain_train.tsv``; dev =
   ``in_domain_dev.tsv`` + ``out_of_domain_dev.tsv``, exactly GLUE's dev), SST-2 of Kim (2014)
   (``stsa.binary.{train,dev}``; the sentence-level train, 6,920 sentences, not GLUE's 67k phrases; the dev set is
   GLUE's), MRPC (``msr_paraphrase_train.txt``; dev = GLUE's ``dev_ids.tsv`` when present, else a held-out part of
   train, see below) and the STS Benchmark (``sts-{train,dev}.csv``).
3. **The Hugging Face hub** (``nyu-mll/glue``) through the optional ``datasets`` package, only when no local file was
   found and ``datasets`` is installed (online).

``source: files`` or ``source: hf`` forces one of them.

**Held-out dev.** A task with a training split but no labelled dev split evaluates on a held-out part of train: every
example whose ``sha1(text_a + TAB + text_b)`` falls in the first ``heldout_fraction`` (default 10%) of the hash range.
The rule is independent of file order and the same on every machine; the held-out examples are removed from train.
For MRPC from the original release without ``dev_ids.tsv`` this gives ~408 pairs, GLUE's dev size, but not GLUE's
pairs. GLUE's test splits are unlabelled and never used.
"""

from __future__ import annotations

import csv
import hashlib
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # MNLI/QQP parse trees exceed csv's 128 KiB default


@dataclass(frozen=True)
class Example:
    """One labelled example: a sentence (``text_b`` None) or a sentence pair; ``label`` is an int id or a float."""

    text_a: str
    text_b: str | None
    label: int | float
    uid: str = ""


@dataclass(frozen=True)
class GlueTask:
    """A GLUE task's definition.

    Attributes:
        name: lower-case key (``cola``, ``sst2``, ``mrpc``, ``stsb``, ``qqp``, ``mnli``, ``qnli``, ``rte``, ``wnli``).
        folder: its folder in the GLUE layout (``CoLA``, ``SST-2``, ...).
        num_labels: classes; 1 means regression (STS-B).
        metrics: the official metrics (``mcc``, ``acc``, ``f1``, ``pearson``, ``spearman``), in reporting order.
        eval_splits: evaluation split names; the official dev file of each is ``dev_<name>.tsv`` for MNLI and
            ``dev.tsv`` otherwise.
        text_columns: header names of the text columns in the official TSV (one or two).
        label_column: header name of the label column.
        label_names: the label strings of the official files, in id order (None: numeric labels).
        hf_config: the ``nyu-mll/glue`` configuration name.
        hf_columns: the text columns in the Hugging Face dataset.
    """

    name: str
    folder: str
    num_labels: int
    metrics: tuple[str, ...]
    eval_splits: tuple[str, ...]
    text_columns: tuple[str, ...]
    label_column: str
    label_names: tuple[str, ...] | None
    hf_config: str
    hf_columns: tuple[str, ...]

    @property
    def is_regression(self) -> bool:
        return self.num_labels == 1

    @property
    def is_pair(self) -> bool:
        return len(self.text_columns) == 2

    def dev_file(self, split: str) -> str:
        return "dev.tsv" if self.eval_splits == ("dev",) else f"dev_{split}.tsv"

    def hf_split(self, split: str) -> str:
        return "validation" if self.eval_splits == ("dev",) else f"validation_{split}"


_NLI2 = ("entailment", "not_entailment")
GLUE_TASKS: dict[str, GlueTask] = {
    t.name: t
    for t in (
        GlueTask("cola", "CoLA", 2, ("mcc",), ("dev",), ("sentence",), "label", None, "cola", ("sentence",)),
        GlueTask("sst2", "SST-2", 2, ("acc",), ("dev",), ("sentence",), "label", None, "sst2", ("sentence",)),
        GlueTask(
            "mrpc",
            "MRPC",
            2,
            ("f1", "acc"),
            ("dev",),
            ("#1 String", "#2 String"),
            "Quality",
            None,
            "mrpc",
            ("sentence1", "sentence2"),
        ),
        GlueTask(
            "stsb",
            "STS-B",
            1,
            ("pearson", "spearman"),
            ("dev",),
            ("sentence1", "sentence2"),
            "score",
            None,
            "stsb",
            ("sentence1", "sentence2"),
        ),
        GlueTask(
            "qqp",
            "QQP",
            2,
            ("f1", "acc"),
            ("dev",),
            ("question1", "question2"),
            "is_duplicate",
            None,
            "qqp",
            ("question1", "question2"),
        ),
        GlueTask(
            "mnli",
            "MNLI",
            3,
            ("acc",),
            ("matched", "mismatched"),
            ("sentence1", "sentence2"),
            "gold_label",
            ("entailment", "neutral", "contradiction"),
            "mnli",
            ("premise", "hypothesis"),
        ),
        GlueTask(
            "qnli",
            "QNLI",
            2,
            ("acc",),
            ("dev",),
            ("question", "sentence"),
            "label",
            _NLI2,
            "qnli",
            ("question", "sentence"),
        ),
        GlueTask(
            "rte",
            "RTE",
            2,
            ("acc",),
            ("dev",),
            ("sentence1", "sentence2"),
            "label",
            _NLI2,
            "rte",
            ("sentence1", "sentence2"),
        ),
        GlueTask(
            "wnli",
            "WNLI",
            2,
            ("acc",),
            ("dev",),
            ("sentence1", "sentence2"),
            "label",
            None,
            "wnli",
            ("sentence1", "sentence2"),
        ),
    )
}
"""Every GLUE task by name, in the order of the GLUE paper's table."""

_ALIASES = {"sst-2": "sst2", "sts-b": "stsb", "mnli-m": "mnli", "mnli-mm": "mnli"}


def get_task(name: str) -> GlueTask:
    """A task by name (case-insensitive; ``SST-2`` and ``STS-B`` spellings accepted)."""
    key = name.lower()
    key = _ALIASES.get(key, key)
    if key not in GLUE_TASKS:
        raise ValueError(f"Unknown GLUE task {name!r}. Choices: {', '.join(GLUE_TASKS)}.")
    return GLUE_TASKS[key]


@dataclass
class TaskData:
    """A task's examples: ``train`` and one list per evaluation split, with a note on where each came from."""

    task: GlueTask
    train: list[Example]
    evals: dict[str, list[Example]]
    provenance: str
    skipped_rows: int = 0
    heldout: bool = False
    eval_notes: dict[str, str] = field(default_factory=dict)


class TaskDataMissing(FileNotFoundError):
    """No usable training data for a task (the message says what was looked for)."""


# --------------------------------------------------------------------------------------------------- readers
def _parse_label(task: GlueTask, raw: str, where: str) -> int | float:
    raw = raw.strip()
    if task.is_regression:
        return float(raw)
    if task.label_names is not None and raw in task.label_names:
        return task.label_names.index(raw)
    value = int(raw)
    if not 0 <= value < task.num_labels:
        raise ValueError(f"{where}: label {raw!r} outside 0..{task.num_labels - 1}")
    return value


def _read_rows(path: Path) -> list[list[str]]:
    # GLUE TSVs are not CSV-quoted: quotes are text (QUOTE_NONE); the MRPC release starts with a BOM (utf-8-sig).
    with open(path, encoding="utf-8-sig", newline="") as f:
        return [row for row in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE) if row]


def read_glue_tsv(task: GlueTask, path: Path) -> tuple[list[Example], int]:
    """Examples of an official GLUE TSV (columns by header name; CoLA by position). Returns (examples, rows skipped).

    Rows without a label (``-``, as in some MNLI lines) or with missing fields (a few malformed QQP lines) are skipped
    and counted, as GLUE's own loaders do.
    """
    rows = _read_rows(path)
    examples: list[Example] = []
    skipped = 0
    if task.name == "cola" and rows and rows[0][:2] != ["sentence", "label"]:
        text_idx, label_idx, header_rows = [3], 1, 0  # headerless: source, label, annotation, sentence
    else:
        header = [h.strip() for h in rows[0]]
        missing = [c for c in (*task.text_columns, task.label_column) if c not in header]
        if missing:
            raise ValueError(
                f"{path}: no column(s) {missing} in the header {header}; expected GLUE's {task.folder} layout."
            )
        text_idx = [header.index(c) for c in task.text_columns]
        label_idx, header_rows = header.index(task.label_column), 1
    need = max(*text_idx, label_idx) + 1
    for n, row in enumerate(rows[header_rows:], start=header_rows + 1):
        if len(row) < need or row[label_idx].strip() in ("", "-"):
            skipped += 1
            continue
        texts = [row[i] for i in text_idx]
        label = _parse_label(task, row[label_idx], f"{path}:{n}")
        uid = "\t".join(row[1:3]) if task.name == "mrpc" else ""
        examples.append(Example(texts[0], texts[1] if len(texts) > 1 else None, label, uid))
    return examples, skipped


def read_kim_sst(task: GlueTask, path: Path) -> tuple[list[Example], int]:
    """``stsa.binary.*`` of Kim (2014): ``<label> <sentence>`` per line."""
    examples = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            label, _, text = line.partition(" ")
            examples.append(Example(text.strip(), None, _parse_label(task, label, f"{path}:{n}")))
    return examples, 0


def read_sts_csv(task: GlueTask, path: Path) -> tuple[list[Example], int]:
    """STS Benchmark ``sts-*.csv``: tab-separated genre, file, year, id, score, sentence1, sentence2 (+ extras)."""
    examples, skipped = [], 0
    for n, row in enumerate(_read_rows(path), start=1):
        if len(row) < 7:
            skipped += 1
            continue
        examples.append(Example(row[5], row[6], _parse_label(task, row[4], f"{path}:{n}")))
    return examples, skipped


Reader = Callable[[GlueTask, Path], tuple[list[Example], int]]


@dataclass(frozen=True)
class Layout:
    """A file layout: training files, evaluation files per split (empty: held-out dev), and their reader."""

    name: str
    train: tuple[str, ...]
    evals: dict[str, tuple[str, ...]]
    reader: Reader


def layouts(task: GlueTask) -> list[Layout]:
    """The file layouts tried for a task, the official GLUE one first."""
    official = Layout("GLUE", ("train.tsv",), {s: (task.dev_file(s),) for s in task.eval_splits}, read_glue_tsv)
    originals = {
        "cola": Layout(
            "CoLA 1.1 raw",
            ("in_domain_train.tsv",),
            {"dev": ("in_domain_dev.tsv", "out_of_domain_dev.tsv")},
            read_glue_tsv,
        ),
        "sst2": Layout("SST-2 (Kim 2014)", ("stsa.binary.train",), {"dev": ("stsa.binary.dev",)}, read_kim_sst),
        "mrpc": Layout("MSRP release", ("msr_paraphrase_train.txt",), {}, read_glue_tsv),
        "stsb": Layout("STS Benchmark", ("sts-train.csv",), {"dev": ("sts-dev.csv",)}, read_sts_csv),
    }
    return [official] + ([originals[task.name]] if task.name in originals else [])


# ------------------------------------------------------------------------------------------------ loading
def heldout_key(example: Example) -> float:
    """Where an example falls in [0, 1) under the held-out rule (sha1 of its text)."""
    digest = hashlib.sha1(f"{example.text_a}\t{example.text_b or ''}".encode()).hexdigest()
    return int(digest[:8], 16) / 2**32


def split_heldout(examples: list[Example], fraction: float) -> tuple[list[Example], list[Example]]:
    """(train, held-out): the examples with ``heldout_key < fraction`` are held out."""
    if not 0 < fraction < 1:
        raise ValueError(f"heldout_fraction must lie in (0, 1), got {fraction}.")
    held = [e for e in examples if heldout_key(e) < fraction]
    return [e for e in examples if heldout_key(e) >= fraction], held


def load_task(name: str, data_dir: str | Path | None, source: str = "auto", heldout_fraction: float = 0.1) -> TaskData:
    """Read a task's train and evaluation examples (see the module docstring for the order of sources).

    Raises:
        TaskDataMissing: no training data (the message lists what was looked for).
    """
    task = get_task(name)
    if source not in ("auto", "files", "hf"):
        raise ValueError(f"source must be auto, files or hf, got {source!r}.")
    looked: list[str] = []
    if source in ("auto", "files") and data_dir is not None:
        folder = Path(data_dir) / task.folder
        data = _load_files(task, folder, heldout_fraction, looked)
        if data is not None:
            return data
    if source == "hf" or (source == "auto" and _datasets_available()):
        return _load_hf(task)
    where = f"{Path(data_dir) / task.folder}" if data_dir is not None else "(no data_dir)"
    raise TaskDataMissing(
        f"No training data for GLUE {task.name} in {where}: looked for {'; '.join(looked) or 'nothing'}. Put GLUE's "
        f"{task.folder}/train.tsv there (download_glue_data.py layout), point data.data_dir at a GLUE folder, or "
        "install `datasets` and use data.source hf (online)."
    )


def _load_files(task: GlueTask, folder: Path, heldout_fraction: float, looked: list[str]) -> TaskData | None:
    for layout in layouts(task):
        looked.append(f"{layout.name}: {', '.join(layout.train)}")
        train_paths = [folder / f for f in layout.train]
        if not all(p.is_file() for p in train_paths):
            continue
        train, skipped = _read_all(task, layout.reader, train_paths)
        evals: dict[str, list[Example]] = {}
        notes: dict[str, str] = {}
        if layout.evals and all((folder / f).is_file() for files in layout.evals.values() for f in files):
            for split, files in layout.evals.items():
                evals[split], more = _read_all(task, layout.reader, [folder / f for f in files])
                skipped += more
                notes[split] = f"{' + '.join(files)} ({len(evals[split])})"
            heldout = False
        elif task.name == "mrpc" and (folder / "dev_ids.tsv").is_file():
            ids = {"\t".join(r[:2]) for r in _read_rows(folder / "dev_ids.tsv")}
            evals["dev"] = [e for e in train if e.uid in ids]
            train = [e for e in train if e.uid not in ids]
            notes["dev"] = f"pairs of dev_ids.tsv ({len(evals['dev'])})"
            heldout = False
        else:
            train, held = split_heldout(train, heldout_fraction)
            for split in task.eval_splits:
                evals[split] = held
                notes[split] = f"held-out {heldout_fraction:.0%} of train by text hash ({len(held)})"
            heldout = True
        provenance = f"{layout.name} {', '.join(layout.train)} ({len(train)})"
        return TaskData(task, train, evals, provenance, skipped, heldout, notes)
    return None


def _read_all(task: GlueTask, reader: Reader, paths: list[Path]) -> tuple[list[Example], int]:
    examples, skipped = [], 0
    for path in paths:
        more, n = reader(task, path)
        examples += more
        skipped += n
    return examples, skipped


def _datasets_available() -> bool:
    try:
        import datasets  # noqa: F401
    except ImportError:
        return False
    return True


def _load_hf(task: GlueTask) -> TaskData:
    """``nyu-mll/glue`` through ``datasets`` (optional dependency, network on first use; cached afterwards)."""
    try:
        import datasets
    except ImportError:
        raise TaskDataMissing(
            f"data.source hf needs the `datasets` package (pip install datasets) to download GLUE {task.name}."
        ) from None
    try:
        ds = datasets.load_dataset("nyu-mll/glue", task.hf_config)
    except Exception as err:  # offline, hub errors, ...: the task has no data here, say why
        raise TaskDataMissing(
            f"No local files for GLUE {task.name} and nyu-mll/glue/{task.hf_config} could not be loaded ({err})."
        ) from err

    def convert(split: str) -> list[Example]:
        rows = ds[split]
        columns = [rows[c] for c in task.hf_columns]
        labels = rows["label"]
        return [
            Example(cols[0], cols[1] if len(cols) > 1 else None, float(lab) if task.is_regression else int(lab))
            for *cols, lab in zip(*columns, labels)
            if task.is_regression or int(lab) >= 0
        ]

    train = convert("train")
    evals = {s: convert(task.hf_split(s)) for s in task.eval_splits}
    notes = {s: f"nyu-mll/glue {task.hf_split(s)} ({len(v)})" for s, v in evals.items()}
    return TaskData(
        task, train, evals, f"Hugging Face nyu-mll/glue/{task.hf_config}: train ({len(train)})", 0, False, notes
    )
