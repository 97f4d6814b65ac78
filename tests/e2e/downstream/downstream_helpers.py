"""Helpers for downstream tests: tiny LM checkpoints written by the real `lightning_cqk fit` path, toy GLUE folders."""

from __future__ import annotations

import random
import sys
from pathlib import Path

from lightning_cqk.cli.trainer import CQKCLI

REPO = Path(__file__).resolve().parents[3]

# A toy corpus: sentences over two small vocabularies, so a 2-step LM has seen the letters of the toy tasks.
_WORDS = ["good", "great", "fine", "nice", "bad", "awful", "poor", "sad", "the", "cat", "sat", "on", "mat"]


def _corpus(path: Path) -> Path:
    rng = random.Random(0)
    paragraphs = [" ".join(rng.choice(_WORDS) for _ in range(12)) for _ in range(300)]
    path.write_text("\n\n".join(paragraphs))
    return path


def train_lm(root: Path, attention: str = "standard", steps: int = 2, extra: list[str] | None = None) -> Path:
    """Train a 1-layer `tiny` LM for a few steps through CQKCLI and save its checkpoint; returns the .ckpt path."""
    root.mkdir(parents=True, exist_ok=True)
    source = _corpus(root / "corpus.txt")
    args = [
        "fit",
        "--config",
        str(REPO / "configs" / "quickstart.yaml"),
        f"--data.source={source}",
        f"--data.data_dir={root / 'shards'}",
        "--data.documents=paragraph",
        "--data.seq_len=64",
        "--data.batch_size=8",
        "--data.val_fraction=0.1",
        "--model.config.n_layer=1",
        f"--model.config.attention={attention}",
        f"--trainer.max_steps={steps}",
        "--trainer.val_check_interval=1000",
        "--trainer.limit_val_batches=0",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        "--trainer.callbacks=[]",
        f"--trainer.logger.init_args.save_dir={root / 'runs'}",
        "--model.optim.warmup_steps=1",
        *(extra or []),
    ]
    argv, sys.argv = sys.argv, ["lightning_cqk"]
    try:
        cli = CQKCLI(args=args)
    finally:
        sys.argv = argv
    ckpt = Path(cli.trainer.log_dir) / "checkpoints" / "last.ckpt"
    cli.trainer.save_checkpoint(ckpt)
    return ckpt


def toy_sentences(n: int, seed: int) -> list[tuple[str, int]]:
    """A trivially separable sentiment task: label 1 sentences use only positive words, label 0 only negative ones."""
    rng = random.Random(seed)
    pos, neg = ["good", "great", "fine", "nice"], ["bad", "awful", "poor", "sad"]
    out = []
    for _ in range(n):
        label = rng.randint(0, 1)
        words = pos if label else neg
        out.append((" ".join(rng.choice(words) for _ in range(rng.randint(3, 8))), label))
    return out


def write_glue_folder(root: Path, n_train: int = 64, n_dev: int = 32) -> Path:
    """Every GLUE task in the official GLUE TSV layout, tiny (labels of the toy sentiment rule where they apply)."""
    train, dev = toy_sentences(n_train, 1), toy_sentences(n_dev, 2)
    nli3 = ("entailment", "neutral", "contradiction")

    def write(task: str, name: str, header: list[str] | None, rows: list[list[str]]) -> None:
        folder = root / task
        folder.mkdir(parents=True, exist_ok=True)
        lines = (["\t".join(header)] if header else []) + ["\t".join(r) for r in rows]
        (folder / name).write_text("\n".join(lines) + "\n")

    for split, data in (("train.tsv", train), ("dev.tsv", dev)):
        write("CoLA", split, None, [["src", str(y), "", s] for s, y in data])
        write("SST-2", split, ["sentence", "label"], [[s, str(y)] for s, y in data])
        write(
            "MRPC",
            split,
            ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
            [[str(y), str(i), str(i + 1), s, s[::-1]] for i, (s, y) in enumerate(data)],
        )
        write(
            "STS-B",
            split,
            [
                "index",
                "genre",
                "filename",
                "year",
                "old_index",
                "source1",
                "source2",
                "sentence1",
                "sentence2",
                "score",
            ],
            [[str(i), "g", "f", "y", "0", "a", "b", s, s, f"{5 * y:.1f}"] for i, (s, y) in enumerate(data)],
        )
        write(
            "QQP",
            split,
            ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
            [[str(i), "1", "2", s, s, str(y)] for i, (s, y) in enumerate(data)],
        )
        write(
            "QNLI",
            split,
            ["index", "question", "sentence", "label"],
            [[str(i), s, s, ("entailment", "not_entailment")[y]] for i, (s, y) in enumerate(data)],
        )
        write(
            "RTE",
            split,
            ["index", "sentence1", "sentence2", "label"],
            [[str(i), s, s, ("entailment", "not_entailment")[y]] for i, (s, y) in enumerate(data)],
        )
        write(
            "WNLI",
            split,
            ["index", "sentence1", "sentence2", "label"],
            [[str(i), s, s, str(y)] for i, (s, y) in enumerate(data)],
        )
    mnli_header = ["index", "promptID", "pairID", "genre", "s1bp", "s2bp", "s1p", "s2p", "sentence1", "sentence2"]
    write(
        "MNLI",
        "train.tsv",
        [*mnli_header, "label1", "gold_label"],
        [[str(i), "", "", "g", "", "", "", "", s, s, nli3[y], nli3[y]] for i, (s, y) in enumerate(train)],
    )
    for split in ("dev_matched.tsv", "dev_mismatched.tsv"):
        write(
            "MNLI",
            split,
            [*mnli_header, "label1", "label2", "label3", "label4", "label5", "gold_label"],
            [[str(i), "", "", "g", "", "", "", "", s, s, *[nli3[y]] * 5, nli3[y]] for i, (s, y) in enumerate(dev)],
        )
    return root
