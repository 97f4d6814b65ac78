"""val/bpb under limit_val_batches divides by the bytes of exactly the windows scored (issue 13 class 10): checked
against a direct computation (the model's summed NLL of those batches over the bytes their target tokens stand for,
from the tokenizer itself) with the byte tokenizer and GPT-2 BPE; without the GPT-2 vocabulary there is no val/bpb and
a warning says why, rather than an estimate from the whole split's bytes per token."""

from __future__ import annotations

import math
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from tiny_run import tiny_trainer

from lightning_cqk.data import TokenDataModule, prepare
from lightning_cqk.data.tokenizers import GPT2_BPE_ENV, get_tokenizer
from lightning_cqk.model_config import ModelConfig
from lightning_cqk.module import LitLM

SEQ, BATCH, SCORED = 16, 2, 3  # three validation batches of two 16-token windows


def validate(model: LitLM, dm: TokenDataModule) -> dict[str, float]:
    trainer = tiny_trainer(limit_val_batches=SCORED)
    return trainer.validate(model, datamodule=dm, verbose=False)[0]


def target_bytes(tokenizer: str, bpe_file: str | None, targets: torch.Tensor) -> int:
    """UTF-8 bytes the target ids stand for, straight from the tokenizer (EOS stands for no text)."""
    tok = get_tokenizer(tokenizer, bpe_file)
    ids = [int(t) for t in targets.flatten() if int(t) != tok.eos_id]
    if tokenizer == "bytes":
        return len(bytes(ids))
    return sum(len(tok._encoding.decode_single_token_bytes(t)) for t in ids)


@pytest.mark.parametrize("tokenizer", ["bytes", "gpt2"])
def test_val_bpb_counts_the_bytes_of_the_scored_windows(tokenizer, corpus: Path, tmp_path: Path, request):
    bpe_file = str(request.getfixturevalue("gpt2_bpe_dir") / "gpt2.tiktoken") if tokenizer == "gpt2" else None
    data_dir = tmp_path / tokenizer
    manifest = prepare(str(corpus), str(data_dir), tokenizer=tokenizer, bpe_file=bpe_file, val_fraction=0.25)

    def datamodule() -> TokenDataModule:
        return TokenDataModule(
            data_dir=str(data_dir), source=None, tokenizer=tokenizer, bpe_file=bpe_file, seq_len=SEQ, batch_size=BATCH
        )

    L.seed_everything(0, verbose=False)
    vocab = get_tokenizer(tokenizer, bpe_file).vocab_size
    model = LitLM(ModelConfig(vocab_size=vocab, n_layer=1, n_embd=16, n_head=2, mlp_hidden=32, block_size=SEQ))
    logged = validate(model, datamodule())

    # Direct: the same first SCORED batches, the model's summed NLL in fp64, over their target tokens' bytes.
    dm = datamodule()
    dm.setup("validate")
    nll, n_bytes, n_tokens = 0.0, 0, 0
    model.eval()
    with torch.no_grad():
        for scored, batch in enumerate(dm.val_dataloader(), start=1):
            logits = model(batch[:, :-1]).double()  # (B, T, vocab)
            nll += float(F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten(), reduction="sum"))
            n_bytes += target_bytes(tokenizer, bpe_file, batch[:, 1:])
            n_tokens += batch[:, 1:].numel()
            if scored == SCORED:
                break
    assert scored == SCORED and n_tokens < manifest.splits["val"].tokens / 2, "a prefix of the split is scored"
    expected = nll / math.log(2) / n_bytes
    assert logged["val/bpb"] == pytest.approx(expected, rel=1e-5)
    assert logged["val/loss"] == pytest.approx(nll / n_tokens, rel=1e-5)
    # The old estimate (the whole split's bytes per token) is measurably off on these windows.
    split_average = logged["val/loss"] / math.log(2) / manifest.bytes_per_token("val")
    assert abs(split_average - expected) / expected > 1e-3


def test_no_val_bpb_without_the_gpt2_vocabulary(corpus: Path, gpt2_bpe_dir: Path, tmp_path: Path, monkeypatch):
    data_dir = tmp_path / "gpt2"
    prepare(
        str(corpus), str(data_dir), tokenizer="gpt2", bpe_file=str(gpt2_bpe_dir / "gpt2.tiktoken"), val_fraction=0.25
    )
    monkeypatch.delenv(GPT2_BPE_ENV, raising=False)
    dm = TokenDataModule(data_dir=str(data_dir), source=None, tokenizer="gpt2", seq_len=SEQ, batch_size=BATCH)
    model = LitLM(ModelConfig(vocab_size=50257, n_layer=1, n_embd=16, n_head=2, mlp_hidden=32, block_size=SEQ))
    with pytest.warns(UserWarning, match=r"val/bpb is not logged: the 'gpt2' vocabulary is not available offline"):
        logged = validate(model, dm)
    assert "val/bpb" not in logged and math.isfinite(logged["val/loss"])
