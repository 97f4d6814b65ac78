"""Named corpora: their document rules (WikiText articles, PubTator blocks), their own splits, the offline / online
source choice with errors that name the options, and a download through a stand-in ``datasets`` module."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from lightning_cqk.data import prepare
from lightning_cqk.data.corpora import CORPORA, resolve_corpus, split_of
from lightning_cqk.data.sources import iter_documents, iter_unit_documents, plan_work_units
from lightning_cqk.errors import UnavailableError

WIKI = (
    " = Alpha = \r\n \r\n Alpha is the first letter . \r\n = = History = = \r\n It is old . \r\n"
    " = Beta = \r\n Beta comes second . \r\n = = = Usage = = = \r\n Physics . \r\n = B = \r\n Short . \r\n"
)


def write_wikitext(root: Path, articles: dict[str, int]) -> Path:
    """``wiki.<split>.raw`` files with the given numbers of articles (each with a sub-heading)."""
    root.mkdir(parents=True, exist_ok=True)
    for split, n in articles.items():
        body = "".join(
            f" = {split} article {i} = \n \n Text of {i} . \n = = Section = = \n More {i} .\n" for i in range(n)
        )
        (root / f"wiki.{split}.raw").write_text(body, encoding="utf-8")
    return root


def test_wikitext_articles_start_at_top_level_headings(tmp_path: Path):
    path = tmp_path / "wiki.test.raw"
    path.write_bytes(WIKI.encode())
    docs = [d.text for d in iter_documents(str(path), documents="wikitext")]
    assert [d.splitlines()[0] for d in docs] == [" = Alpha = ", " = Beta = ", " = B = "]
    assert " = = History = = " in docs[0] and " = = = Usage = = = " in docs[1]
    assert all("\r" not in d and "\n\n" not in d for d in docs)  # CRLF and blank lines dropped


def test_wikitext_work_units_cut_at_article_headings(wikitext_lines: list[str]):
    shared = Path(__file__).resolve().parents[4] / "shared" / "data" / "wikitext" / "wikitext-2-raw-test"
    whole = [d.text for d in iter_documents(str(shared / "wiki.test.raw"), documents="wikitext")]
    assert len(whole) == 62  # the article count SOURCE.md states
    units = plan_work_units([shared / "wiki.test.raw"], "wikitext", 64 << 10)
    assert len(units) > 5
    assert [d.text for u in units for d in iter_unit_documents(u, documents="wikitext")] == whole


def test_pubtator_blocks_give_title_and_abstract(tmp_path: Path):
    path = tmp_path / "set.PubTator.txt"
    path.write_text(
        "11|t|A title.\n11|a|An abstract.\n11\t0\t1\tA\tChemical\tD1\n\n"
        "22|t|Other.\n22|a|Second abstract.\n22\tCID\tD1\tD2\n\nA plain abstract paragraph.\n",
        encoding="utf-8",
    )
    docs = [d.text for d in iter_documents(str(path), documents="pubtator")]
    assert docs == ["A title.\nAn abstract.", "Other.\nSecond abstract.", "A plain abstract paragraph."]


@pytest.mark.parametrize(
    ("name", "split"),
    [
        ("wiki.train.raw", "train"),
        ("wiki.valid.raw", "val"),
        ("wiki.test.raw", "test"),
        ("CDR_TrainingSet.PubTator.txt", "train"),
        ("CDR_DevelopmentSet.PubTator.txt", "val"),
        ("c4-validation.00000-of-00008.json", "val"),
        ("pubmed_abstracts.jsonl", None),
    ],
)
def test_split_of_file_names(name: str, split: str | None):
    assert split_of(name) == split


def test_own_splits_are_kept_and_other_files_left_out(tmp_path: Path):
    root = write_wikitext(tmp_path / "wt", {"train": 3, "valid": 2, "test": 2})
    (root / "README.md").write_text("not a corpus file")
    resolved = resolve_corpus("wikitext103", str(root))
    assert resolved.source == [str(root / "wiki.train.raw")]
    assert resolved.val_source == [str(root / "wiki.valid.raw")]
    assert resolved.held_out == [str(root / "wiki.test.raw")]
    assert resolved.documents == "wikitext"


def test_without_train_and_valid_files_everything_is_hash_split(tmp_path: Path):
    root = write_wikitext(tmp_path / "wt", {"test": 2})
    resolved = resolve_corpus("wikitext2", str(root))
    assert resolved.source == [str(root / "wiki.test.raw")] and resolved.val_source is None


def test_prepare_a_corpus_uses_its_splits_and_document_rule(tmp_path: Path):
    root = write_wikitext(tmp_path / "wt", {"train": 5, "valid": 3, "test": 2})
    manifest = prepare(str(root), str(tmp_path / "shards"), corpus="wikitext103")
    assert (manifest.splits["train"].documents, manifest.splits["val"].documents) == (5, 3)
    assert manifest.documents_mode == "wikitext" and manifest.val_sources == [str(root / "wiki.valid.raw")]


def test_unknown_corpus_and_missing_source_name_the_options(tmp_path: Path):
    with pytest.raises(ValueError, match="Known corpora") as err:
        resolve_corpus("wikitext-103", str(tmp_path))
    assert all(name in str(err.value) for name in CORPORA)
    with pytest.raises(FileNotFoundError, match="Known corpora.*\n.*wikitext103"):
        resolve_corpus("pubmed", str(tmp_path / "nowhere"))
    (tmp_path / "notes.md").write_text("x")
    with pytest.raises(FileNotFoundError, match=r"holds no \.raw files"):
        resolve_corpus("wikitext103", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="needs a local source"):
        resolve_corpus("text", None, download_dir=tmp_path / "raw")


def test_download_needs_datasets_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(UnavailableError, match="`datasets` package is not installed.*data.source PATH"):
        resolve_corpus("c4", None, download_dir=tmp_path / "raw")


def test_download_writes_the_corpus_format_and_keeps_its_splits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    calls = []

    def load_dataset(path, name=None, split=None, streaming=False):
        calls.append((path, name, split, streaming))
        lines = [f" = {split} {i} = \n" if j == 0 else f" line {j} of {i} .\n" for i in range(4) for j in range(3)]
        return iter({"text": line} for line in lines)

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    monkeypatch.setattr("lightning_cqk.data.corpora.hub_unreachable", lambda: None)  # no network probe in tests
    resolved = resolve_corpus("wikitext2", None, download_dir=tmp_path / "raw", max_documents=9)
    assert calls[0] == ("Salesforce/wikitext", "wikitext-2-raw-v1", "train", True)
    train = list(iter_documents(resolved.source, documents="wikitext"))
    assert len(train) == 3 and train[0].text.startswith(" = train 0 = ")  # 9 rows: three articles
    assert resolved.val_source == [str(tmp_path / "raw" / "wiki.valid.raw")]
    calls.clear()
    resolve_corpus("wikitext2", None, download_dir=tmp_path / "raw", max_documents=9)  # a finished download is reused
    assert calls == []
    with pytest.raises(ValueError, match=r"holds a download of .*'max_documents': 9.*'max_documents': None"):
        resolve_corpus("wikitext2", None, download_dir=tmp_path / "raw")  # ... but not for another ask
    resolve_corpus("wikitext2", None, download_dir=tmp_path / "raw", overwrite=True)  # downloaded again, whole
    assert len(calls) == 3 and len(list(iter_documents(str(tmp_path / "raw" / "wiki.train.raw"), documents="wikitext")))


def test_download_jsonl_corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    rows = {"train": ["a b c", "d e f"], "validation": ["g h"], "test": ["i"]}
    module = types.SimpleNamespace(
        load_dataset=lambda path, name=None, split=None, streaming=False: iter(
            {"abstract": t, "article": "x"} for t in rows[split]
        )
    )
    monkeypatch.setitem(sys.modules, "datasets", module)
    monkeypatch.setattr("lightning_cqk.data.corpora.hub_unreachable", lambda: None)  # no network probe in tests
    resolved = resolve_corpus("pubmed", None, download_dir=tmp_path / "raw")
    assert [json.loads(line)["text"] for line in Path(resolved.source[0]).read_text().splitlines()] == rows["train"]
    assert resolved.held_out == [str(tmp_path / "raw" / "test.jsonl")]
