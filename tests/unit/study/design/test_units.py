"""Published effects in our unit: bytes per GPT-2 token and per word measured on a small fixed text by hand, the
conversion rules computed by hand, and the committed table re-measured from ../shared/data when it is there."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from lightning_cqk.study.design.units import BYTES_PER_UNIT, UnitError, convert_pct, count_words, documents, measure

SHARED = Path(os.environ.get("LIGHTNING_CQK_SHARED_DATA", "../shared/data"))  # tests/conftest.py sets it
BPE = SHARED / "gpt2_bpe" / "gpt2.tiktoken"
TEXT = "The cat sat on the mat."  # GPT-2: The | ␣cat | ␣sat | ␣on | ␣the | ␣mat | .  (7 tokens); 23 bytes; 6 words


@pytest.mark.skipif(not BPE.is_file(), reason=f"no GPT-2 BPE at {BPE} (../shared/data)")
def test_bytes_per_token_and_word_on_a_fixed_text_equal_the_hand_count():
    from lightning_cqk.data.tokenizers import get_tokenizer

    m = measure([TEXT], get_tokenizer("gpt2", str(BPE)).encode)
    assert (m["bytes"], m["tokens"], m["words"]) == (23, 7, 6)
    assert m["bytes_per_token"] == 23 / 7 and m["bytes_per_word"] == 23 / 6


def test_conversion_by_hand():
    # same nats per byte: -6.6% GPT-2-token PPL on WikiText at 4.5454 bytes per token
    pct, rule = convert_pct(-6.6, "token_ppl", "gpt2", "wikitext")
    assert pct == pytest.approx(100 * (math.exp(math.log(0.934) / 4.5454) - 1), rel=1e-12)
    assert pct == pytest.approx(-1.4910, abs=5e-4) and "4.5454 bytes per gpt2 token measured on wikitext" in rule
    # word PPL (lm-eval) on WikiText: +25.7% at 5.3383 bytes per word -> +4.378% per byte
    assert convert_pct(25.7, "word_ppl", None, "wikitext")[0] == pytest.approx(4.3778, abs=5e-4)
    assert convert_pct(3.0, "byte_ppl")[0] == 3.0  # already ours
    # same relative change of loss: ln(0.934) / ln(24.22) of the loss, applied to our 2.0 nats per byte
    rel = convert_pct(-6.6, "token_ppl", "gpt2", "wikitext", "relative_loss", 24.22, 2.0)[0]
    assert rel == pytest.approx(100 * math.expm1(2.0 * math.log(0.934) / math.log(24.22)), rel=1e-12)
    assert math.isnan(convert_pct(-6.6, "token_ppl", "gpt2", "wikitext", "relative_loss")[0])  # no baseline given
    with pytest.raises(UnitError, match="no measured bytes per gpt2 on corpus 'slimpajama'"):
        convert_pct(-6.6, "token_ppl", "gpt2", "slimpajama")


def test_words_are_counted_as_lm_eval_counts_them():
    assert count_words("a  b\n c") == 3 and count_words(" a") == 2  # re.split(r"\s+"): a leading space counts


@pytest.mark.skipif(not BPE.is_file(), reason=f"no GPT-2 BPE at {BPE} (../shared/data)")
@pytest.mark.parametrize(
    "corpus, path",
    [("wikitext", "wikitext/wikitext-2-raw-test/wiki.test.raw"), ("web", "webtext/c4_en_first1000/c4_sample.jsonl")],
)
def test_the_committed_table_is_what_the_corpora_measure(corpus: str, path: str):
    from lightning_cqk.data.tokenizers import get_tokenizer

    if not (SHARED / path).is_file():
        pytest.skip(f"no {SHARED / path}")
    m = measure(documents(SHARED / path), get_tokenizer("gpt2", str(BPE)).encode)
    assert m["bytes_per_token"] == pytest.approx(BYTES_PER_UNIT[("gpt2", corpus)], abs=6e-5)
    assert m["bytes_per_word"] == pytest.approx(BYTES_PER_UNIT[("word", corpus)], abs=6e-5)
