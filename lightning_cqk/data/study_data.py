"""The text the corpus study trains on, fetched from its public sources and checked byte for byte.

The studies' CPU profiles read three small corpora through `LIGHTNING_CQK_SHARED_DATA` (`{shared_data}/...` in
`configs/ablations/*.yaml`): WikiText-2's test articles, 4,352 PubMed abstracts and the first 1,000 C4 documents.
This module fetches each from the public GitHub repository and commit it was taken from, checks every file's
sha256, and rebuilds the PubMed file (`pubmed/combined/pubmed_abstracts.jsonl`) from its three sources exactly as it
was built (the same sha256), so a machine with network access gets the same bytes the committed results came from:

    make study-data                                   # into ../shared/data
    lightning_cqk study-data DIR       # anywhere; then LIGHTNING_CQK_SHARED_DATA=DIR

- `wikitext/wikitext-2-raw-test/wiki.test.raw` (62 articles): Tylogi/TyloQuant @ 7989d03,
  `data/wikitext-2-raw/wiki.test.raw`;
- `webtext/c4_en_first1000/c4_sample.jsonl` (1,000 documents): Diffusion-bachelor/diffusion-data-constraint-rare-events
  @ 3305ae8, `data/c4_sample.jsonl`;
- `pubmed/combined/pubmed_abstracts.jsonl` (4,352 abstracts): built from BC5CDR (cryptoradon/biomedRelExt @ 3f113ff),
  PubMedQA (pubmedqa/pubmedqa @ 1cbae8e) and Hallmarks of Cancer (sb895/Hallmarks-of-Cancer @ 3bc6e6d).

PubMed, built (`build_pubmed_abstracts`): one JSON object per line, `{"pmid", "source", "text"}`, the first occurrence
of each PMID kept, in this order: BC5CDR training, development, test (title + "\\n" + abstract), PubMedQA's
`ori_pqal.json` (QUESTION + "\\n" + CONTEXTS joined by spaces + " " + LONG_ANSWER), Hallmarks of Cancer's
`text/<PMID>.txt` by file name (the tokenised text, stripped). The licences are the sources' own (see each
repository). Nothing here is imported by training: it only writes files, each through the package's atomic writer
(`atomic_files.write_bytes_atomically`: a temporary file created exclusively under an unpredictable name, so a
symlink planted in a shared data folder is never written through).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import tarfile
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from lightning_cqk.files.atomic import write_bytes_atomically

RAW = "https://raw.githubusercontent.com/{repo}/{commit}/{path}"
TARBALL = "https://codeload.github.com/{repo}/tar.gz/{commit}"


@dataclass(frozen=True)
class SourceFile:
    """One file of a public repository at one commit, with the sha256 its bytes must have."""

    folder: str  # where it goes, relative to the data root
    name: str
    repo: str
    commit: str
    path: str
    sha256: str

    @property
    def url(self) -> str:
        return RAW.format(repo=self.repo, commit=self.commit, path=self.path)


BC5CDR = "cryptoradon/biomedRelExt", "3f113ff1aefd03b7ecf053a6bc33cc6a75532f20", "CDR_Data/CDR.Corpus.v010516"
FILES = (
    SourceFile("wikitext/wikitext-2-raw-test", "wiki.test.raw", "Tylogi/TyloQuant",
               "7989d038b13ca737da11a95fb90e77ae059f33c0", "data/wikitext-2-raw/wiki.test.raw",
               "4f3e427e4aff23acff917a8a51aeae21bf12832256e26914c8fc250dcef4103c"),
    SourceFile("webtext/c4_en_first1000", "c4_sample.jsonl", "Diffusion-bachelor/diffusion-data-constraint-rare-events",
               "3305ae85ae51f4882f291ff894d49946af655a11", "data/c4_sample.jsonl",
               "cdd5b754119131d2934e3e799a059a9d64f53a6aac9e7e2ef79b43120bb01a32"),
    SourceFile("pubmed/bc5cdr", "CDR_TrainingSet.PubTator.txt", BC5CDR[0], BC5CDR[1],
               f"{BC5CDR[2]}/CDR_TrainingSet.PubTator.txt",
               "6c15ebf93b7a831f4f679f9ecda4e71fee7fba8c2bc687e8cf73c4d16d91d2a0"),
    SourceFile("pubmed/bc5cdr", "CDR_DevelopmentSet.PubTator.txt", BC5CDR[0], BC5CDR[1],
               f"{BC5CDR[2]}/CDR_DevelopmentSet.PubTator.txt",
               "9e18d8e700168887a7919e62f67ac2ce2357e3f409a48ee992906abdd80fe3e5"),
    SourceFile("pubmed/bc5cdr", "CDR_TestSet.PubTator.txt", BC5CDR[0], BC5CDR[1],
               f"{BC5CDR[2]}/CDR_TestSet.PubTator.txt",
               "a3c48d5f35bdfce20c2371778abedc9fd24d1da092207072e5181ad53c8d0e2f"),
    SourceFile("pubmed/pubmedqa", "ori_pqal.json", "pubmedqa/pubmedqa", "1cbae8e92f72f20c8d3747cbb3bf5bc53554d997",
               "data/ori_pqal.json", "8b3276be8942ebbd77f3ddcda12c1749bf0e490045a736fd8438ee40cf37a41d"),
)  # fmt: skip
HALLMARKS = "sb895/Hallmarks-of-Cancer", "3bc6e6deb90cf5bc4f9988c493fe2c32e9b3cf2a"
HALLMARKS_TEXTS = 1852
PUBMED_FILE = "pubmed/combined/pubmed_abstracts.jsonl"
PUBMED_SHA256 = "1f4bf4057ce2c08b7d326670ba5601baa1dff780c472f2c00778839cd3aa24b4"


class StudyDataError(RuntimeError):
    """A download that failed or whose bytes are not the pinned ones."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def download(url: str, timeout: float = 60.0) -> bytes:
    """The bytes at `url` (the Python standard library: proxies from the environment are honoured)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.read()
    except OSError as err:
        raise StudyDataError(f"could not download {url} ({err}); this needs network access to GitHub.") from None


def bc5cdr_records(pubtator_texts: Iterable[str]) -> Iterable[tuple[str, str]]:
    """(PMID, title + "\\n" + abstract) of every document of BC5CDR's PubTator files, in file order."""
    for text in pubtator_texts:
        for block in text.split("\n\n"):
            lines = block.strip("\n").split("\n")
            if len(lines) < 2 or "|t|" not in lines[0]:
                continue
            pmid, _, title = lines[0].split("|", 2)
            abstract = lines[1].split("|", 2)[2]
            yield pmid, f"{title}\n{abstract}"


def pubmedqa_records(ori_pqal: str) -> Iterable[tuple[str, str]]:
    """(PMID, QUESTION + "\\n" + CONTEXTS joined by spaces + " " + LONG_ANSWER) of PubMedQA's labelled set."""
    for pmid, record in json.loads(ori_pqal).items():
        yield pmid, record["QUESTION"] + "\n" + " ".join(record["CONTEXTS"]) + " " + record["LONG_ANSWER"]


def build_pubmed_abstracts(
    bc5cdr: Iterable[tuple[str, str]], pubmedqa: Iterable[tuple[str, str]], hallmarks: Iterable[tuple[str, str]]
) -> bytes:
    """The PubMed file of the corpus study (module docstring): each PMID's first occurrence, one JSON line each."""
    seen: set[str] = set()
    lines = []
    for source, records in (("bc5cdr", bc5cdr), ("pubmedqa", pubmedqa), ("hallmarks_of_cancer", hallmarks)):
        for pmid, text in records:
            if pmid not in seen:
                seen.add(pmid)
                lines.append(json.dumps({"pmid": pmid, "source": source, "text": text}, ensure_ascii=False) + "\n")
    return "".join(lines).encode("utf-8")


def hallmarks_texts(tarball: bytes) -> list[tuple[str, str]]:
    """(PMID, stripped text) of every `text/<PMID>.txt` in a tar archive (a repository tarball, whose members sit
    under one top folder, or the `text/` + `labels/` archive of ../shared/data), sorted by file name."""
    texts = []
    with tarfile.open(fileobj=io.BytesIO(tarball)) as archive:
        for member in archive.getmembers():
            path = PurePosixPath(member.name)
            if member.isfile() and path.parent.name == "text" and path.suffix == ".txt":
                texts.append((path.name, path.stem, archive.extractfile(member).read().decode("utf-8").strip()))
    return [(pmid, text) for _, pmid, text in sorted(texts)]


def fetch(root: Path, get: Callable[[str], bytes] = download, log: Callable[[str], None] = print) -> list[Path]:
    """Fetch every file into `root` (checked), build the PubMed file (checked), and return the paths written.
    A file already there with the right sha256 is kept; nothing is written whose bytes are not the pinned ones."""
    _refuse_what_is_in_the_way(root)
    written: list[Path] = []
    contents: dict[str, bytes] = {}
    for source in FILES:
        target = root / source.folder / source.name
        data = target.read_bytes() if target.is_file() else None
        if data is None or sha256(data) != source.sha256:
            log(f"study-data: {source.url}")
            data = get(source.url)
            if sha256(data) != source.sha256:
                raise StudyDataError(
                    f"{source.url} has sha256 {sha256(data)}, not the pinned {source.sha256}: not written."
                )
            write_bytes_atomically(target, data)
            written.append(target)
        contents[source.name] = data
    pubmed = root / PUBMED_FILE
    if pubmed.is_file() and sha256(pubmed.read_bytes()) == PUBMED_SHA256:
        return written
    url = TARBALL.format(repo=HALLMARKS[0], commit=HALLMARKS[1])
    log(f"study-data: {url}")
    hallmarks = hallmarks_texts(get(url))
    if len(hallmarks) != HALLMARKS_TEXTS:
        raise StudyDataError(f"{url} holds {len(hallmarks)} text/<PMID>.txt files, not {HALLMARKS_TEXTS}.")
    pubtator = [
        contents[f"CDR_{split}Set.PubTator.txt"].decode("utf-8") for split in ("Training", "Development", "Test")
    ]
    data = build_pubmed_abstracts(
        bc5cdr_records(pubtator), pubmedqa_records(contents["ori_pqal.json"].decode("utf-8")), hallmarks
    )
    if sha256(data) != PUBMED_SHA256:
        raise StudyDataError(f"the rebuilt {PUBMED_FILE} has sha256 {sha256(data)}, not {PUBMED_SHA256}: not written.")
    write_bytes_atomically(pubmed, data)
    return [*written, pubmed]


def _refuse_what_is_in_the_way(root: Path) -> None:
    """Before any download: every path a file goes to is a file or free (a folder there would end the fetch in a
    traceback after the downloads, issue 45 item 7), and the root is a folder or free."""
    if root.exists() and not root.is_dir():
        raise StudyDataError(f"{root} is a file, and the data root must be a folder: give another DIR.")
    targets = [root / source.folder / source.name for source in FILES] + [root / PUBMED_FILE]
    blocked = [t for t in targets if (t.exists() or t.is_symlink()) and not t.is_file()]
    blocked += [t.parent for t in targets if t.parent.exists() and not t.parent.is_dir()]
    if blocked:
        first = blocked[0]
        raise StudyDataError(
            f"{', '.join(map(str, dict.fromkeys(blocked)))}: not a file where a downloaded file goes (a folder, or a "
            f"file where a folder goes). Nothing was downloaded. Move it aside, e.g. mv {first} {first}.aside, and "
            "run the same command again."
        )


def study_data_command(argv: list[str] | None = None) -> None:
    """`lightning_cqk study-data DIR`."""
    parser = argparse.ArgumentParser(
        prog="lightning_cqk study-data",
        description="Fetch the corpus study's text (WikiText-2 test, PubMed abstracts, C4 sample) into DIR, checked.",
    )
    parser.add_argument("output", help="the data root, e.g. ../shared/data (then LIGHTNING_CQK_SHARED_DATA=DIR)")
    args = parser.parse_args(argv)
    root = Path(args.output)
    try:
        written = fetch(root)
    except StudyDataError as err:
        sys.exit(f"study-data: {err}")
    print(f"study-data: {len(written)} file(s) written; every file under {root} matches its pinned sha256.")
    print(f"Run a study with it: LIGHTNING_CQK_SHARED_DATA={root} make ablations STUDY=corpus")
