"""GLUE readers: the official TSV layout of all nine tasks, the original releases, held-out dev, the hub path."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from lightning_cqk.downstream.glue_tasks import (
    GLUE_TASKS,
    Example,
    TaskDataMissing,
    get_task,
    heldout_key,
    load_task,
    split_heldout,
)


def test_every_task_reads_the_official_layout(glue_dir: Path):
    for name, task in GLUE_TASKS.items():
        data = load_task(name, glue_dir, source="files")
        assert len(data.train) == 64, name
        assert list(data.evals) == list(task.eval_splits) and all(len(v) == 32 for v in data.evals.values()), name
        assert not data.heldout and data.skipped_rows == 0
        assert (data.train[0].text_b is not None) == task.is_pair, name
    mnli = load_task("mnli", glue_dir)
    assert set(mnli.evals) == {"matched", "mismatched"}
    assert {e.label for e in mnli.train} <= {0, 1, 2}


def test_label_strings_and_numbers_map_to_the_same_ids(tmp_path: Path):
    folder = tmp_path / "RTE"
    folder.mkdir()
    (folder / "train.tsv").write_text(
        "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\tc\td\tnot_entailment\n"
    )
    # the Hugging Face export: numeric labels, other column order
    (folder / "dev.tsv").write_text('sentence1\tsentence2\tlabel\tidx\n"quoted" a\tb\t0\t0\nc\td\t1\t1\n')
    data = load_task("rte", tmp_path)
    assert [e.label for e in data.train] == [0, 1] == [e.label for e in data.evals["dev"]]
    assert data.evals["dev"][0] == Example('"quoted" a', "b", 0)  # quotes are text in GLUE TSVs


def test_cola_headerless_and_stsb_regression_values(glue_dir: Path):
    cola = load_task("cola", glue_dir)
    row = (glue_dir / "CoLA" / "train.tsv").read_text().splitlines()[0].split("\t")
    assert cola.train[0] == Example(row[3], None, int(row[1]))
    stsb = load_task("stsb", glue_dir)
    assert all(isinstance(e.label, float) and e.label in (0.0, 5.0) for e in stsb.train)


def test_malformed_and_unlabelled_rows_are_skipped_and_counted(tmp_path: Path):
    folder = tmp_path / "QQP"
    folder.mkdir()
    header = "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
    (folder / "train.tsv").write_text(header + "0\t1\t2\tq1\tq2\t1\n1\t3\t4\tonly one question\n2\t5\t6\ta\tb\t0\n")
    (folder / "dev.tsv").write_text(header + "0\t1\t2\tq1\tq2\t-\n1\t3\t4\tx\ty\t1\n")
    data = load_task("qqp", tmp_path)
    assert [e.label for e in data.train] == [1, 0] and len(data.evals["dev"]) == 1 and data.skipped_rows == 2


def test_bad_label_and_missing_column_are_clear_errors(tmp_path: Path):
    folder = tmp_path / "SST-2"
    folder.mkdir()
    (folder / "train.tsv").write_text("sentence\tlabel\nfine\t7\n")
    with pytest.raises(ValueError, match=r"train.tsv:2: label '7' outside 0..1"):
        load_task("sst2", tmp_path)
    (folder / "train.tsv").write_text("text\tlabel\nfine\t1\n")
    with pytest.raises(ValueError, match=r"no column\(s\) \['sentence'\]"):
        load_task("sst2", tmp_path)


def test_missing_task_says_what_was_looked_for(tmp_path: Path):
    (tmp_path / "QNLI").mkdir()
    (tmp_path / "QNLI" / "dev.tsv").write_text("index\tquestion\tsentence\tlabel\n")
    with pytest.raises(TaskDataMissing, match=r"No training data for GLUE qnli .*train.tsv"):
        load_task("qnli", tmp_path, source="files")
    with pytest.raises(ValueError, match="Unknown GLUE task 'qnlx'"):
        get_task("qnlx")


def test_heldout_split_is_deterministic_disjoint_and_sized():
    examples = [Example(f"sentence {i}", None, i % 2) for i in range(2000)]
    train, held = split_heldout(examples, 0.1)
    assert len(train) + len(held) == 2000 and not set(train) & set(held)
    assert 150 < len(held) < 250  # ~10% by hash
    assert all(heldout_key(e) < 0.1 for e in held)
    train2, held2 = split_heldout(list(reversed(examples)), 0.1)
    assert set(held2) == set(held)  # independent of file order
    with pytest.raises(ValueError, match="heldout_fraction"):
        split_heldout(examples, 1.5)


def test_mrpc_original_release_uses_dev_ids_when_present(tmp_path: Path):
    folder = tmp_path / "MRPC"
    folder.mkdir()
    rows = [f"{i % 2}\t{10 + i}\t{20 + i}\tfirst {i}\tsecond {i}" for i in range(40)]
    header = "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String"  # the release starts with a BOM
    (folder / "msr_paraphrase_train.txt").write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    held = load_task("mrpc", tmp_path)
    assert held.heldout and "held-out 10%" in held.eval_notes["dev"]
    assert len(held.train) + len(held.evals["dev"]) == 40
    (folder / "dev_ids.tsv").write_text("10\t20\n13\t23\n")
    data = load_task("mrpc", tmp_path)
    assert not data.heldout and [e.text_a for e in data.evals["dev"]] == ["first 0", "first 3"]
    assert len(data.train) == 38


def test_hub_path_with_a_stand_in_datasets_module(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    calls = []

    def load_dataset(path, name):
        calls.append((path, name))
        split = {"premise": ["p1", "p2"], "hypothesis": ["h1", "h2"], "label": [2, -1]}  # -1: unlabelled row
        names = ("train", "validation_matched", "validation_mismatched")
        return {s: split for s in names}

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    data = load_task("mnli", tmp_path, source="auto")  # no local files -> the hub
    assert calls == [("nyu-mll/glue", "mnli")]
    assert data.train == [Example("p1", "h1", 2)] and set(data.evals) == {"matched", "mismatched"}


def test_shared_glue_copies(shared_data: Path):
    glue = shared_data / "glue"
    expected = {"cola": (8551, 1043), "sst2": (6920, 872), "stsb": (5749, 1500), "rte": (2490, 277)}
    for name, (n_train, n_dev) in expected.items():
        data = load_task(name, glue, source="files")
        assert (len(data.train), len(data.evals["dev"])) == (n_train, n_dev), name
    mrpc = load_task("mrpc", glue, source="files")
    assert mrpc.heldout and len(mrpc.train) + len(mrpc.evals["dev"]) == 4076
    assert abs(len(mrpc.evals["dev"]) - 408) < 60
    for name in ("qnli", "qqp", "mnli", "wnli"):
        with pytest.raises(TaskDataMissing):
            load_task(name, glue, source="files")


def test_hub_failure_is_reported_as_missing_data(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    def load_dataset(path, name):
        raise ConnectionError("offline")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    with pytest.raises(TaskDataMissing, match=r"nyu-mll/glue/rte could not be loaded \(offline\)"):
        load_task("rte", tmp_path)
