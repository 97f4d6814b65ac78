"""Published effects in the study's unit: a paper's change of perplexity converted to a change of byte perplexity.

A claim's published effect carries its unit (spec `published: {value: -6.6, unit: token_ppl, tokenizer: gpt2,
corpus: wikitext, baseline: 24.22}`). The studies measure byte-level validation perplexity (val/ppl with the bytes
tokenizer, exp of the loss in nats per byte). Two reasonable rules carry a change across units:

- `nats_per_byte` (the rule verdicts use): the same information gain per byte of text. A perplexity ratio r in a
  unit of b bytes (a GPT-2 token, a word) is a loss change of ln r nats per unit, ln(r) / b nats per byte, so
  r_byte = r ** (1 / b). b is MEASURED on the corpus at hand with that tokenizer (`BYTES_PER_UNIT`).
- `relative_loss` (shown beside it when it gives another verdict): the same relative change of the loss,
  ln(r) / ln(P0) with P0 the paper's baseline perplexity, applied to our baseline loss L (nats per byte):
  r_byte = exp(L ln(r) / ln(P0)). It needs the paper's baseline (`baseline:`) and our own.

Bytes per unit (UTF-8 bytes of the corpus text / units), measured with

    lightning_cqk units-table --bpe-file ../shared/data/gpt2_bpe/gpt2.tiktoken \\
        wikitext=../shared/data/wikitext/wikitext-2-raw-test/wiki.test.raw \\
        pubmed=../shared/data/pubmed/combined/pubmed_abstracts.jsonl \\
        web=../shared/data/webtext/c4_en_first1000/c4_sample.jsonl

(a `.jsonl` file is read as one document per line, its `text` field; any other file as one document), and the
built-in corpus that 8 of the 9 studies train on (`builtin:python_docs`, Python 3.11's help topics and standard-library
docstrings) written out as a .jsonl by `lightning_cqk.data.builtin.iter_python_docs`. A word is
what lm-eval's `word_perplexity` counts: the pieces of `re.split(r"\\s+", document)`. WikiText-2's test articles
stand in for WikiText-103 (same source and preprocessing), C4 for the papers' web corpora (OpenWebText,
SlimPajama). The package never reads ../shared: the numbers are committed here.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Iterable
from pathlib import Path

UNIT_NAMES = {"byte_ppl": "byte PPL", "token_ppl": "token PPL", "word_ppl": "word PPL"}  # as tables print them
UNITS = tuple(UNIT_NAMES)
RULES = ("nats_per_byte", "relative_loss")
PRIMARY_RULE = "nats_per_byte"

# (unit counter, corpus) -> UTF-8 bytes per unit, measured by the command in the module docstring (2026-11-26).
BYTES_PER_UNIT: dict[tuple[str, str], float] = {
    ("gpt2", "wikitext"): 4.5454,  # 1,287,656 bytes / 283,287 tokens / 241,213 words
    ("gpt2", "pubmed"): 4.4290,  # 6,531,331 / 1,474,665 / 985,985
    ("gpt2", "web"): 4.5362,  # 2,200,107 / 485,006 / 372,144
    ("word", "wikitext"): 5.3383,
    ("word", "pubmed"): 6.6242,
    ("word", "web"): 5.9120,
    ("gpt2", "python_docs"): 3.5315,  # 2,086,098 / 590,709 / 311,151 (builtin:python_docs, Python 3.11)
    ("word", "python_docs"): 6.7045,
}

# The corpus a study's runs train on, by its `data.corpus` or `data.source` setting -> the key above.
TRAINING_CORPORA = {"wikitext103": "wikitext", "wikitext": "wikitext", "pubmed": "pubmed", "openwebtext": "web",
                    "web": "web", "builtin:python_docs": "python_docs"}  # fmt: skip
CORPUS_NAMES = {"wikitext": "WikiText", "pubmed": "PubMed", "web": "web text (C4)", "python_docs": "the built-in "
                "Python docs corpus"}  # fmt: skip


def training_corpus(settings: dict) -> str | None:
    """The BYTES_PER_UNIT corpus key a run trains on, from its resolved settings (`data.corpus`, else a built-in
    `data.source`); None when it is none of the measured corpora."""
    corpus = settings.get("data.corpus")
    if corpus in TRAINING_CORPORA:
        return TRAINING_CORPORA[corpus]
    source = settings.get("data.source")
    return TRAINING_CORPORA.get(source) if isinstance(source, str) else None


MEASURE_COMMAND = "lightning_cqk units-table (lightning_cqk/study/design/units.py)"


class UnitError(ValueError):
    """A published effect whose unit cannot be converted; the message says what to declare."""


def bytes_per_unit(unit: str, tokenizer: str | None, corpus: str | None) -> float:
    """Bytes of text per unit of `unit` (1 for byte perplexity); raises UnitError when not measured."""
    if unit == "byte_ppl":
        return 1.0
    if unit not in UNITS:
        raise UnitError(f"unit {unit!r} is not one of {', '.join(UNITS)}.")
    counter = "word" if unit == "word_ppl" else str(tokenizer)
    key = (counter, str(corpus))
    if key not in BYTES_PER_UNIT:
        known = ", ".join(f"{c}/{k}" for c, k in BYTES_PER_UNIT)
        raise UnitError(
            f"no measured bytes per {counter} on corpus {corpus!r} (measured: {known}); measure it with "
            f"{MEASURE_COMMAND} and add it to BYTES_PER_UNIT, or declare the effect on a measured corpus."
        )
    return BYTES_PER_UNIT[key]


def convert_pct(
    pct: float,
    unit: str,
    tokenizer: str | None = None,
    corpus: str | None = None,
    rule: str = PRIMARY_RULE,
    paper_baseline: float | None = None,
    our_baseline_loss: float | None = None,
) -> tuple[float, str]:
    """(the change of byte perplexity in %, the rule as one line); nan with the reason when it cannot be computed.

    pct: the published change of perplexity in `unit` (e.g. -6.6 for -6.6% GPT-2-token perplexity).
    paper_baseline: the paper's baseline perplexity in `unit` (relative_loss only).
    our_baseline_loss: our baseline's loss in nats per byte, ln(val/ppl) (relative_loss only).
    """
    if not math.isfinite(pct):
        return math.nan, "no published number"
    if pct <= -100.0:
        return math.nan, f"{pct:+g}% is not a perplexity ratio"
    log_r = math.log1p(pct / 100.0)
    if rule == "nats_per_byte":
        b = bytes_per_unit(unit, tokenizer, corpus)
        if unit == "byte_ppl":
            return pct, "published in byte perplexity: no conversion"
        what = "word" if unit == "word_ppl" else f"{tokenizer} token"
        return (
            100.0 * math.expm1(log_r / b),
            f"same nats per byte: (1 {pct:+g}%)^(1/{b:g}), {b:g} bytes per {what} measured on {corpus}",
        )
    if rule == "relative_loss":
        if not (paper_baseline and paper_baseline > 1.0):
            return math.nan, "relative loss needs the paper's baseline perplexity (published: baseline:)"
        if not (our_baseline_loss and math.isfinite(our_baseline_loss) and our_baseline_loss > 0):
            return math.nan, "relative loss needs our baseline's loss"
        rel = log_r / math.log(paper_baseline)
        return (
            100.0 * math.expm1(rel * our_baseline_loss),
            f"same relative change of loss: {100 * rel:+.2f}% of the loss (paper baseline ppl {paper_baseline:g}, "
            f"ours {our_baseline_loss:.3f} nats/byte)",
        )
    raise UnitError(f"rule {rule!r} is not one of {', '.join(RULES)}.")


# --------------------------------------------------------------------------------------------- measurement
def documents(path: str | Path) -> Iterable[str]:
    """The documents of a file: one per line of a .jsonl (its `text` field), else the whole file."""
    path = Path(path)
    if path.suffix == ".jsonl":
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    yield str(json.loads(line)["text"])
    else:
        yield path.read_text(encoding="utf-8")


def count_words(text: str) -> int:
    """Words as lm-eval's word_perplexity counts them: the pieces of re.split(r"\\s+", text)."""
    return len(re.split(r"\s+", text))


def measure(texts: Iterable[str], encode) -> dict[str, float]:
    """{'bytes', 'tokens', 'words', 'bytes_per_token', 'bytes_per_word'} of the texts (`encode`: text -> ids)."""
    n_bytes = n_tokens = n_words = 0
    for text in texts:
        n_bytes += len(text.encode("utf-8"))
        n_tokens += len(encode(text))
        n_words += count_words(text)
    return {
        "bytes": n_bytes,
        "tokens": n_tokens,
        "words": n_words,
        "bytes_per_token": n_bytes / n_tokens if n_tokens else math.nan,
        "bytes_per_word": n_bytes / n_words if n_words else math.nan,
    }


def units_table_command(argv: list[str] | None = None) -> None:
    """`lightning_cqk units-table name=path ... [--bpe-file FILE]`."""
    parser = argparse.ArgumentParser(
        prog="lightning_cqk units-table", description="Bytes per GPT-2 token and per word of corpora."
    )
    parser.add_argument("corpora", nargs="+", help="name=path (a text file, or a .jsonl with a text field)")
    parser.add_argument("--bpe-file", default=None, help="the local GPT-2 .tiktoken file")
    args = parser.parse_args(argv)
    from lightning_cqk.data.tokenizers import get_tokenizer

    tok = get_tokenizer("gpt2", args.bpe_file)
    print("corpus      bytes       gpt2 tokens  words      bytes/token  bytes/word")
    for item in args.corpora:
        name, _, path = item.partition("=")
        m = measure(documents(path), tok.encode)
        print(
            f"{name:<11} {m['bytes']:<11,} {m['tokens']:<12,} {m['words']:<10,} "
            f"{m['bytes_per_token']:<12.4f} {m['bytes_per_word']:.4f}"
        )
