"""Token-id files of `fixed_seq_qk`, read in data/ (numpy, the built-in corpus from `builtin.py`); model code stays
torch-only; `builtin.py` and `sources.py` do not import each other both ways (issue 18, item 6)."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import lightning_cqk
from lightning_cqk.data.builtin import iter_python_docs
from lightning_cqk.data.token_ids import load_token_ids
from lightning_cqk.errors import ConfigError

PACKAGE = Path(lightning_cqk.__file__).parent


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at any level."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize(
    "array",
    [
        np.arange(24, dtype=">i4").reshape(4, 6),  # big-endian, 2-D: flattened in C order
        np.asfortranarray(np.arange(24, dtype=np.int16).reshape(4, 6)),
        np.arange(24, dtype=np.uint16),
    ],
)
def test_npy_files_load_with_numpy_in_c_order(tmp_path, array):
    np.save(tmp_path / "ids.npy", array)
    assert load_token_ids(str(tmp_path / "ids.npy"), 20).tolist() == np.asarray(array).reshape(-1)[:20].tolist()


def test_bad_token_files_are_refused_as_user_errors(tmp_path):
    np.save(tmp_path / "f.npy", np.ones(4, dtype=np.float32))
    with pytest.raises(ConfigError, match="expected an integer array"):
        load_token_ids(str(tmp_path / "f.npy"), 2)
    (tmp_path / "junk.npy").write_bytes(b"not an array")
    with pytest.raises(ConfigError, match="not a readable .npy array"):
        load_token_ids(str(tmp_path / "junk.npy"), 2)
    with pytest.raises(ConfigError, match="Unknown built-in token source 'builtin:nope'"):
        load_token_ids("builtin:nope", 2)


def test_the_builtin_sequence_is_the_corpus_that_builtin_py_gathers():
    docs = iter_python_docs()
    text = next(docs).text + "\n\n" + next(docs).text
    length = len(text.encode("utf-8"))
    assert load_token_ids("builtin:python_docs", length).tolist() == list(text.encode("utf-8"))


def test_model_code_reads_no_files_and_builtin_does_not_import_sources():
    for path in sorted((PACKAGE / "attention").glob("*.py")):
        assert not {m for m in _imports(path) if m.split(".")[0] in ("numpy", "lightning", "litdata")}, path
    assert "lightning_cqk.data.sources" not in _imports(PACKAGE / "data" / "builtin.py")
    assert "lightning_cqk.data.builtin" in _imports(PACKAGE / "data" / "sources.py")  # one owner of builtin:<name>
