"""`make study-data` (issue 35 item 8): the corpus study's text fetched from its public sources and checked byte for
byte, the PubMed file rebuilt from its three sources to the same sha256 as ../shared/data's. Offline, the downloads
are served from ../shared/data itself (the same bytes GitHub serves at the pinned commits)."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from lightning_cqk.data import study_data
from lightning_cqk.data.study_data import (
    FILES,
    HALLMARKS,
    PUBMED_FILE,
    PUBMED_SHA256,
    StudyDataError,
    bc5cdr_records,
    build_pubmed_abstracts,
    fetch,
    hallmarks_texts,
    pubmedqa_records,
)


def _repository_tarball(shared: Path) -> bytes:
    """The Hallmarks of Cancer texts as GitHub's tarball of the repository lays them out (one top folder)."""
    with tarfile.open(shared / "pubmed" / "hallmarks_of_cancer" / "hoc_text_labels.tar.xz") as archive:
        members = [(m, archive.extractfile(m).read()) for m in archive.getmembers() if m.isfile()]
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tarball:
        for member, data in members:
            info = tarfile.TarInfo(f"Hallmarks-of-Cancer-{HALLMARKS[1]}/{member.name}")
            info.size = len(data)
            tarball.addfile(info, io.BytesIO(data))
    return out.getvalue()


@pytest.fixture
def served(shared_data: Path):
    """A `get` that answers each pinned URL with the file ../shared/data holds for it, and counts the requests."""
    by_url = {source.url: shared_data / source.folder / source.name for source in FILES}
    tarball = study_data.TARBALL.format(repo=HALLMARKS[0], commit=HALLMARKS[1])
    requests: list[str] = []

    def get(url: str) -> bytes:
        requests.append(url)
        return _repository_tarball(shared_data) if url == tarball else by_url[url].read_bytes()

    get.requests = requests
    return get


def test_the_pubmed_file_is_rebuilt_from_its_three_sources_to_the_same_bytes(shared_data: Path):
    pubmed = shared_data / "pubmed"
    pubtator = [
        (pubmed / "bc5cdr" / f"CDR_{s}Set.PubTator.txt").read_text() for s in ("Training", "Development", "Test")
    ]
    archive = (pubmed / "hallmarks_of_cancer" / "hoc_text_labels.tar.xz").read_bytes()
    data = build_pubmed_abstracts(
        bc5cdr_records(pubtator),
        pubmedqa_records((pubmed / "pubmedqa" / "ori_pqal.json").read_text()),
        hallmarks_texts(archive),
    )
    assert hashlib.sha256(data).hexdigest() == PUBMED_SHA256
    assert data == (shared_data / PUBMED_FILE).read_bytes()


def test_fetch_writes_every_file_checked_and_keeps_what_is_already_right(served, shared_data: Path, tmp_path: Path):
    written = fetch(tmp_path / "data", get=served, log=lambda message: None)
    assert len(written) == len(FILES) + 1 and len(served.requests) == len(FILES) + 1
    for path in written:
        relative = path.relative_to(tmp_path / "data")
        assert path.read_bytes() == (shared_data / relative).read_bytes(), relative
    again = fetch(tmp_path / "data", get=served, log=lambda message: None)
    assert again == [] and len(served.requests) == len(FILES) + 1, "nothing fetched twice"


def test_a_download_with_other_bytes_is_refused_and_not_written(served, tmp_path: Path):
    def tampered(url: str) -> bytes:
        data = served(url)
        return data + b" " if url == FILES[0].url else data

    with pytest.raises(StudyDataError, match="not the pinned"):
        fetch(tmp_path / "data", get=tampered, log=lambda message: None)
    assert not (tmp_path / "data" / FILES[0].folder / FILES[0].name).exists()


def test_a_planted_symlink_beside_a_download_is_never_written_through(served, tmp_path: Path):
    """Issue 45 item 8: `.wiki.test.raw.part -> victim.txt` in a shared data folder; the fetcher used to write the
    download through it and then put the symlink in place of the file. Now the temporary file is created exclusively
    under an unpredictable name (`atomic_files.write_bytes_atomically`): the victim keeps its bytes, the link stays
    a link beside a real file."""
    source = FILES[0]
    folder = tmp_path / "data" / source.folder
    folder.mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("the victim's own text\n")
    planted = folder / f".{source.name}.part"
    planted.symlink_to(victim)
    fetch(tmp_path / "data", get=served, log=lambda message: None)
    assert victim.read_text() == "the victim's own text\n"
    target = folder / source.name
    assert not target.is_symlink() and hashlib.sha256(target.read_bytes()).hexdigest() == source.sha256
    assert planted.is_symlink() and planted.resolve() == victim


def test_a_folder_where_a_file_goes_is_refused_before_any_download(served, tmp_path: Path):
    """Issue 45 item 7: `study-data` with a directory where a file goes ended in a traceback after the downloads."""
    blocked = tmp_path / "data" / FILES[0].folder / FILES[0].name
    blocked.mkdir(parents=True)
    asked: list[str] = []

    def counting(url: str) -> bytes:
        asked.append(url)
        return served(url)

    with pytest.raises(StudyDataError, match="not a file where a downloaded file goes") as err:
        fetch(tmp_path / "data", get=counting, log=lambda message: None)
    assert asked == [], "nothing was downloaded"
    assert f"mv {blocked} {blocked}.aside" in str(err.value)
