"""A run is the same run only if the same code, data and settings computed it (issue 43): one test per way in which
two different runs used to count as one. No run is trained here: a finished run is its status file and budget.json,
as the runner leaves them, and a committed study is study.json / runs.csv / curves.csv as a report writes them.

Delta over tests/e2e/study/test_run_identity.py's twin spec (ref and twin, seed 1, the tiny quickstart).
"""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import pytest
import yaml
from test_run_identity import _twin_spec

from lightning_cqk.study.design.spec import SpecError, expand
from lightning_cqk.study.report.results import RUN_FIELDS
from lightning_cqk.study.run import identity as identity_module
from lightning_cqk.study.run import sharing
from lightning_cqk.study.run.adopt import index_committed
from lightning_cqk.study.run.identity import changes, checkout_code, data_fingerprint
from lightning_cqk.study.run.ledger import DONE, SUPERSEDED, Ledger
from lightning_cqk.study.run.runner import run_local


@pytest.fixture(autouse=True)
def _one_thread_and_a_private_cache(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the data fingerprints' cache


def _sweep(tmp: Path, out: str = "out", **spec_edits):
    path = _twin_spec(tmp)
    if spec_edits:
        spec = yaml.safe_load(path.read_text())
        spec["profiles"]["cpu"]["overrides"].update(spec_edits)
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return expand(path, "cpu", str(tmp / out))


def _finish(ledger: Ledger, name: str, **extra) -> None:
    """Run `name` as the runner leaves a finished run: its directory with budget.json, its status with its identity
    as computed now."""
    run = ledger.sweep.run(name)
    ledger.run_dir(run).mkdir(parents=True, exist_ok=True)
    (ledger.run_dir(run) / "budget.json").write_text("{}")
    fields = {"status": DONE, "attempts": 1, "config_hash": run.config_hash(), **ledger.identity_fields(run)}
    ledger.set_status(run, **fields, **extra)


def _git_checkout(tmp: Path) -> Path:
    repo = tmp / "checkout"
    (repo / "pkg" / "model").mkdir(parents=True)
    (repo / "pkg" / "__init__.py").write_text("")
    (repo / "pkg" / "model" / "gpt.py").write_text("INIT_STD = 0.02\n")
    for args in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    return repo


def _use_checkout(monkeypatch, repo: Path) -> None:
    """The identity's code part read from `repo` instead of this package's checkout."""
    monkeypatch.setattr(identity_module, "checkout_code", lambda: checkout_code(repo / "pkg"))


# ------------------------------------------------------------------------------------------------------------ code
def test_an_uncommitted_code_edit_makes_a_finished_run_refused_or_recomputed(tmp_path: Path, monkeypatch):
    repo = _git_checkout(tmp_path)
    _use_checkout(monkeypatch, repo)
    sweep = _sweep(tmp_path)
    ledger = Ledger(sweep)
    _finish(ledger, "ref-s1")
    assert ledger.is_done(sweep.run("ref-s1"))

    (repo / "pkg" / "model" / "gpt.py").write_text("INIT_STD = 0.01\n")  # the researcher's edit, not committed
    checkout_code.cache_clear()
    ledger = Ledger(sweep)
    with pytest.raises(SpecError, match=r"code: pkg/model/gpt.py changed since.*--on-changed recompute"):
        ledger.is_done(sweep.run("ref-s1"))
    with pytest.raises(SpecError, match="nothing was started"):  # the sweep refuses before anything starts
        run_local(sweep, jobs=1, only=["ref-s1"])

    ledger.on_changed = "recompute"
    assert not ledger.is_done(sweep.run("ref-s1"))
    ledger.supersede(sweep.run("ref-s1"))  # a new attempt: the old numbers are kept aside, never deleted
    assert (sweep.sweep_dir / SUPERSEDED / "ref-s1-1" / "budget.json").is_file()
    assert not ledger.run_dir(sweep.run("ref-s1")).exists()
    status = ledger.status(sweep.run("ref-s1"))
    assert status["status"] == "pending" and status["superseded"][0]["identity"]


def test_a_changed_untracked_module_changes_the_code(tmp_path: Path):
    repo = _git_checkout(tmp_path)
    checkout_code.cache_clear()
    before = checkout_code(repo / "pkg")
    (repo / "pkg" / "model" / "helper.py").write_text("SCALE = 1\n")  # untracked: `git status -uno` never saw it
    checkout_code.cache_clear()
    added = checkout_code(repo / "pkg")
    (repo / "pkg" / "model" / "helper.py").write_text("SCALE = 2\n")
    checkout_code.cache_clear()
    edited = checkout_code(repo / "pkg")
    assert before != added != edited
    assert "pkg/model/helper.py" in edited["files"]
    said = changes({"code": added}, {"code": edited})
    assert "code: pkg/model/helper.py changed since" in said


def _sweep_with_user_callback(tmp_path: Path, monkeypatch, lab: Path, module: str):
    """The twin spec with the user's callback `<module>.Scale` (a file in `lab`, trusted and importable by the runs
    and the CLI's resolver) added to its cpu profile's config files."""
    monkeypatch.syspath_prepend(str(lab))
    monkeypatch.setenv("PYTHONPATH", str(lab))  # where the runs (and the CLI's resolver) import it from
    monkeypatch.setenv("LIGHTNING_CQK_TRUSTED_MODULES", module)
    callbacks = tmp_path / "callbacks.yaml"
    callbacks.write_text(yaml.safe_dump({"trainer": {"callbacks": [{"class_path": f"{module}.Scale"}]}}))
    path = _twin_spec(tmp_path)
    spec = yaml.safe_load(path.read_text())
    spec["profiles"]["cpu"]["configs"].append(str(callbacks))
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return expand(path, "cpu", str(tmp_path / "out"))


def test_a_changed_user_callback_module_changes_the_identity(tmp_path: Path, monkeypatch):
    lab = tmp_path / "lab"
    lab.mkdir()
    (lab / "mylab_callbacks.py").write_text(
        "import lightning as L\n\n\nclass Scale(L.Callback):\n    def __init__(self, factor: float = 1.0):\n"
        "        self.factor = factor\n"
    )
    sweep = _sweep_with_user_callback(tmp_path, monkeypatch, lab, "mylab_callbacks")
    before = Ledger(sweep).identity(sweep.run("ref-s1"))
    assert before.parts["code"]["modules"]["mylab_callbacks"].startswith("sha256:")
    (lab / "mylab_callbacks.py").write_text((lab / "mylab_callbacks.py").read_text() + "\nLR_WARP = 2\n")
    after = Ledger(sweep).identity(sweep.run("ref-s1"))
    assert after.digest != before.digest
    assert any("module mylab_callbacks changed" in line for line in changes(before.parts, after.parts))


# ------------------------------------------------------------------------------------------------------------ data
def _prepare(corpus: Path, out: Path) -> None:
    from lightning_cqk.data import prepare

    prepare(str(corpus), str(out), val_fraction=0.2, documents="paragraph", overwrite=True)


def test_data_re_prepared_in_place_is_other_data_and_a_sibling_run_is_not_reused(tmp_path: Path):
    corpus = tmp_path / "corpus.txt"
    text = "".join(f"Paragraph {i}: queries meet keys; values follow the weights.\n\n" for i in range(60))
    corpus.write_text(text)
    shards = tmp_path / "shards"
    _prepare(corpus, shards)
    old = _sweep(tmp_path, "runs/old", **{"data.data_dir": str(shards)})
    ledger = Ledger(old)
    _finish(ledger, "ref-s1")
    first = data_fingerprint(shards)

    corpus.write_text(text.replace("weights", "weighTs", 1))  # one letter: the same sizes and counts
    _prepare(corpus, shards)
    assert data_fingerprint(shards) != first
    new = _sweep(tmp_path, "runs/new", **{"data.data_dir": str(shards)})
    new_ledger = Ledger(new)
    now = new_ledger.identity(new.run("ref-s1"))
    assert sharing._sibling_run(new_ledger, now.digest) is None  # the old run's numbers are not this data's
    assert "data: shards differs (re-prepared or replaced)" in changes(
        ledger.status(old.run("ref-s1"))["identity_parts"], now.parts
    )
    with pytest.raises(SpecError, match="data: shards differs"):
        Ledger(old).is_done(old.run("ref-s1"))

    corpus.write_text(text)  # the first data again
    _prepare(corpus, shards)
    again = Ledger(new).identity(new.run("ref-s1"))
    assert sharing._sibling_run(Ledger(new), again.digest)["dir"] == (old.sweep_dir / "ref-s1").resolve()


def test_a_replaced_tokenizer_file_is_other_data(tmp_path: Path):
    vocab = tmp_path / "gpt2.tiktoken"
    vocab.write_text("one vocabulary\n")
    sweep = _sweep(tmp_path, **{"data.tokenizer": "gpt2", "data.bpe_file": str(vocab)})
    before = Ledger(sweep).identity(sweep.run("ref-s1"))
    vocab.write_text("another vocabulary\n")
    after = Ledger(sweep).identity(sweep.run("ref-s1"))
    assert before.parts["settings"] == after.parts["settings"] and before.digest != after.digest
    assert "data: tokenizer differs (re-prepared or replaced)" in changes(before.parts, after.parts)


# ------------------------------------------------------------------------------------------------- threads, device
def test_another_thread_count_is_another_run(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS")
    sweep = _sweep(tmp_path)
    ledger = Ledger(sweep)
    ledger.threads = 1  # --jobs 2 on a 2-core machine: each run gets one thread
    _finish(ledger, "ref-s1")
    ledger = Ledger(sweep)
    ledger.threads = 2
    with pytest.raises(SpecError, match="threads: 1 -> 2"):
        ledger.is_done(sweep.run("ref-s1"))


# --------------------------------------------------------------------------------------------------------- settings
def test_a_changed_code_default_is_another_identity(tmp_path: Path, monkeypatch):
    """The same spec and config files; the default of a class the config names changed in its code: the CLI's parser
    resolves the new default, so the settings part (not only the code part) differs."""
    from lightning_cqk.study.design import settings

    lab = tmp_path / "lab"
    lab.mkdir()
    source = "import lightning as L\n\n\nclass Scale(L.Callback):\n    def __init__(self, factor: float = {}):\n" + (
        "        self.factor = factor\n"
    )
    (lab / "mylab_defaults.py").write_text(source.format("1.0"))
    sweep = _sweep_with_user_callback(tmp_path, monkeypatch, lab, "mylab_defaults")
    before = Ledger(sweep).identity(sweep.run("ref-s1"))
    (lab / "mylab_defaults.py").write_text(source.format("2.0"))
    settings.reset()  # a new sweep invocation: a new resolver imports the edited code
    after = Ledger(sweep).identity(sweep.run("ref-s1"))
    assert after.parts["settings"] != before.parts["settings"]


# -------------------------------------------------------------------------------------------------------- adoption
def _commit(tmp: Path, ledger: Ledger, folder: Path, runs: dict[str, dict]) -> Path:
    """A folder of committed results as `report --output` writes it, of the finished runs `runs` ({name: extra
    status fields}), each at val loss 2.5 and ppl 12.25."""
    folder.mkdir(parents=True)
    manifest = {"study": "mini", "profile": "cpu", "spec": ledger.sweep.spec, "runs": []}
    rows, curves = [], []
    for run in ledger.sweep.runs:
        status = {**ledger.status(run), **runs.get(run.name, {})}
        entry = {"name": run.name, "group": run.group, "seed": run.seed, "levels": run.levels,
                 "configs": run.configs, "overrides": run.overrides, "depends_on": run.depends_on,
                 "config_hash": run.config_hash(), **status}  # fmt: skip
        manifest["runs"].append(entry)
        row = dict.fromkeys(RUN_FIELDS, "")
        row.update(run=run.name, group=run.group, seed=str(run.seed), lr="0.003", val_loss="2.5", val_ppl="12.25",
                   val_bpb="3.5", code_revision=" ".join(status.get("revisions") or []), steps="7",
                   config_hash=run.config_hash(), identity=status.get("identity", ""), status="done")  # fmt: skip
        rows.append(row)
        curves += [
            [run.name, tag, 6, value] for tag, value in (("val/ppl", 12.25), ("val/bpb", 3.5), ("val/loss", 2.5))
        ]
    (folder / "study.json").write_text(json.dumps(manifest))
    with (folder / "runs.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=RUN_FIELDS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    with (folder / "curves.csv").open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(["run", "tag", "step", "value"])
        writer.writerows(curves)
    return folder


def _two_arm_sweep(tmp: Path, out: str):
    """ref and alt (another attention), seeds 1 and 2."""
    path = _twin_spec(tmp)
    spec = yaml.safe_load(path.read_text())
    spec["axes"]["arm"] = {"ref": {"model.config.attention": "standard"}, "alt": {"model.config.attention": "coupled"}}
    spec["profiles"]["cpu"]["seeds"] = [1, 2]
    spec["profiles"]["cpu"]["overrides"]["model.optim.lr"] = 0.003
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return expand(path, "cpu", str(tmp / out))


def _committed_study(tmp: Path, runs: dict[str, dict] | None = None):
    sweep = _two_arm_sweep(tmp, "made")
    ledger = Ledger(sweep)
    for run in sweep.runs:
        _finish(ledger, run.name, revisions=["a" * 40])
    return sweep, ledger, _commit(tmp, ledger, tmp / "results" / "mini", runs or {})


def test_a_twin_whose_overrides_were_swapped_in_study_json_is_refused_by_name(tmp_path: Path):
    sweep, ledger, folder = _committed_study(tmp_path)
    assert len(index_committed([folder])) == 4
    study = json.loads((folder / "study.json").read_text())
    runs = {r["name"]: r for r in study["runs"]}
    runs["ref-s2"]["overrides"], runs["alt-s2"]["overrides"] = runs["alt-s2"]["overrides"], runs["ref-s2"]["overrides"]
    (folder / "study.json").write_text(json.dumps(study))
    with pytest.raises(ValueError, match=r"#(ref|alt)-s2: its record disagrees with itself.*model.config.attention"):
        index_committed([folder])


def test_a_twin_whose_config_file_was_edited_after_it_was_committed_is_not_adopted(tmp_path: Path):
    sweep, ledger, folder = _committed_study(tmp_path)
    config = Path(sweep.run("ref-s2").configs[-1])  # the spec's ckpt.yaml: edited since the twins were computed
    edited = yaml.safe_load(config.read_text())
    edited["trainer"]["gradient_clip_val"] = 0.5
    config.write_text(yaml.safe_dump(edited))
    index = index_committed([folder])  # the twins' identities as recorded, not rebuilt from today's file
    now = Ledger(expand(sweep.spec_path, "cpu", str(tmp_path / "elsewhere" / "again")))
    assert all(now.identity(run).what() not in index for run in now.sweep.runs)


def test_a_resumed_twin_is_not_adopted(tmp_path: Path):
    sweep, ledger, folder = _committed_study(tmp_path, {"ref-s2": {"resumed_from": "ref-s2/checkpoints/last.ckpt"}})
    notes: list[str] = []
    index = index_committed([folder], notes)
    assert [t.name for t in index.values()] == ["ref-s1", "alt-s1", "alt-s2"] or sorted(
        t.name for t in index.values()
    ) == ["alt-s1", "alt-s2", "ref-s1"]
    assert any("ref-s2 were resumed" in n for n in notes)


def test_an_adopted_run_takes_its_twins_provenance_through_a_chain(tmp_path: Path, monkeypatch):
    first = {"code": {"revision": "b" * 40}, "device": "cpu: the committing machine", "threads": 1}
    sweep, ledger, folder = _committed_study(tmp_path, {"ref-s2": {"made_by": first, "revisions": ["b" * 40]}})
    adopting = Ledger(_two_arm_sweep(tmp_path, "elsewhere/adopting"))  # no sibling: adoption alone
    adopting.committed = index_committed([folder])
    probe, adopted = adopting.sweep.run("ref-s1"), adopting.sweep.run("ref-s2")
    _finish(adopting, "ref-s1")
    monkeypatch.setattr(sharing, "reproduces", lambda run_dir, twin: True)  # the probe reproduced its twin
    twin = adopting.committed[adopting.identity(adopted).what()]
    twin_how = twin.made_by
    probe_twin = adopting.committed[adopting.identity(probe).what()]
    object.__setattr__(probe_twin, "made_by", twin_how)  # computed the same way as the probe's twin
    shared = sharing.computed_source(adopting, adopted, [], {"ref-s1"})
    assert shared["adopted_from"].endswith("#ref-s2")
    assert shared["device"] == "cpu: the committing machine" and shared["revisions"] == ["b" * 40]
    assert shared["made_by"] == first  # from the twin's own twin: it survives the chain
