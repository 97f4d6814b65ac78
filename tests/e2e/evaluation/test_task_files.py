"""A task YAML that lm-eval cannot read is reported as what it is (file, line), not as an unknown task (issue 25,
class 8): syntax errors, a duplicate key, an empty or list-shaped file, an `include:` of a missing file; a
`!function` tag is only looked at (its module never runs); a real `eval` subprocess says it in one paragraph."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from lmeval_helpers import write_tasks

from lightning_cqk.evaluation.task_files import check_task_folder
from lightning_cqk.files.strict_yaml import YAMLInputError

REPO = Path(__file__).resolve().parents[3]
TASK = """\
task: toy_broken
dataset_path: json
output_type: multiple_choice
test_split: test
doc_to_text: "{{context}}"
doc_to_choice: "{{choices}}"
doc_to_target: label
"""


@pytest.mark.parametrize(
    "text, words",
    [
        (TASK.replace("test_split: test", "test_split: test\n  bad_indent: 1"), "line 5, column 13: not valid YAML"),
        (TASK.replace('"{{choices}}"', '["a", "b"'), "line 7, column 1: not valid YAML"),
        (TASK.replace("dataset_path: json", "\tdataset_path: json"), "line 2, column 1: not valid YAML"),
        (
            TASK.replace('doc_to_text: "{{context}}"', "doc_to_text: {{context}}"),
            "line 5, column 15: not valid YAML (while constructing a mapping found unhashable key",
        ),
        (TASK + "output_type: generate_until\n", "line 8: key 'output_type' appears twice (first on line 3)"),
        ("", "is empty"),
        ("- task: toy_broken\n", "holds a sequence, not a mapping of task settings"),
        (TASK + "include: _default_template\n", "line 8: include: _default_template names no file"),
    ],
)
def test_an_unreadable_task_file_is_named_with_its_line(tmp_path: Path, text: str, words: str):
    folder = write_tasks(tmp_path / "tasks")
    (folder / "broken.yaml").write_text(text)
    with pytest.raises(YAMLInputError) as err:
        check_task_folder(folder)
    message = str(err.value)
    assert message.startswith(f"Task YAML {folder / 'broken.yaml'}") and words in message, message
    assert "lm-eval would skip this file without a word and call its task unknown" in message


def test_function_tags_are_read_not_run_and_a_sound_folder_passes(tmp_path: Path):
    folder = write_tasks(tmp_path / "tasks")
    marker = tmp_path / "ran"
    (folder / "utils.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\ndef docs(d):\n    return d\n")
    (folder / "fn.yaml").write_text(
        TASK.replace("task: toy_broken", "task: toy_fn") + "process_docs: !function utils.docs\n"
    )
    (folder / "sub").mkdir()
    (folder / "sub" / "_base").write_text("output_type: multiple_choice\n")
    (folder / "sub" / "inc.yaml").write_text("include: _base\ntask: toy_inc\ndataset_path: json\n")
    check_task_folder(folder)
    assert not marker.exists()


@pytest.mark.slow
def test_eval_names_the_syntax_error_not_an_unknown_task(tmp_path: Path):
    pytest.importorskip("lm_eval", reason="lm-eval is the `eval` extra")
    folder = write_tasks(tmp_path / "tasks")
    (folder / "mine.yaml").write_text(TASK.replace("task: toy_broken", "task: my_task").replace("label", "[label"))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_DATASETS_OFFLINE": "1"}
    args = ["--checkpoint=none.ckpt", "--tasks=my_task", f"--include_path={folder}"]
    run = subprocess.run(
        [sys.executable, "-m", "lightning_cqk", "eval", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=tmp_path,
    )
    assert run.returncode == 1, run.stderr[-2000:]
    first = run.stderr.strip().splitlines()[0]
    assert first.startswith(f"lightning_cqk eval: Task YAML {folder / 'mine.yaml'}, line 8, column 1: not valid YAML")
    assert "Unknown lm-eval task" not in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize(
    "target, words",
    [
        ("/etc/passwd", "holds a scalar, not a mapping of task settings"),
        ("../outside/notes.txt", "line 1, column 5: not valid YAML"),
        ("../outside/binary.yaml", "is not UTF-8 text"),
        ("../outside/list.yaml", "holds a sequence, not a mapping of task settings"),
    ],
    ids=["system file", "not YAML", "not text", "a list"],
)
def test_an_include_of_a_file_that_is_no_task_file_is_named(tmp_path: Path, target: str, words: str):
    """Issue 34 defect 12: an `include:` of a file outside the task folder that is no task file passed the check
    (it only asked whether the file exists), and lm-eval then called the including task unknown."""
    if target.startswith("/") and not Path(target).is_file():
        pytest.skip(f"{target} is not on this system")
    folder = write_tasks(tmp_path / "tasks")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "notes.txt").write_text("a: b: c\n")
    (outside / "binary.yaml").write_bytes(b"\xff\xfe\x00task")
    (outside / "list.yaml").write_text("- task: x\n")
    (folder / "broken.yaml").write_text(TASK + f"include: {target}\n")
    with pytest.raises(YAMLInputError) as err:
        check_task_folder(folder)
    message = str(err.value)
    included = Path(target) if target.startswith("/") else folder / target
    assert message.startswith(
        f"Task YAML {folder / 'broken.yaml'}, line 8: include: {target} names no task file: the included file "
        f"{included}"
    ), message
    assert words in message and "Include a task YAML (a mapping of task settings" in message, message


def test_an_include_of_a_task_template_outside_the_folder_passes(tmp_path: Path):
    folder = write_tasks(tmp_path / "tasks")
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "_template").write_text("output_type: multiple_choice\ninclude: _more.yaml\n")
    (tmp_path / "shared" / "_more.yaml").write_text("test_split: test\n")
    (folder / "uses.yaml").write_text("include: ../shared/_template\ntask: toy_uses\ndataset_path: json\n")
    check_task_folder(folder)
    (tmp_path / "shared" / "_more.yaml").write_text("[test_split\n")
    with pytest.raises(YAMLInputError, match=r"Task YAML .*_template \(included\), line 2: include: _more.yaml names"):
        check_task_folder(folder)
