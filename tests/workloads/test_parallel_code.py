"""The parallel code of issue 43: the stack builder files are gone (each kind's ``build.py`` or ``many_chips.py``
hands the sharding pass its layer), and ``bench/parallel_lines.py`` counts what remains over a named list that
cannot silently lose a function (a renamed one would leave the count)."""

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import parallel_lines  # noqa: E402

#: the files the stacks were built in before the pass took them (their entries in the list count 0)
REMOVED = ("moe/pipeline.py", "moe/pipeline_ep.py", "moe/pipeline_tp.py", "decoder/pipeline.py", "decoder/parallel.py",
           "decoder/expert_parallel.py", "decoder/pipeline_ep.py", "decoder/pipeline_tp.py", "swiglu/pipeline.py",
           "swiglu/parallel.py")


@pytest.mark.parametrize("path", REMOVED)
def test_the_stack_builder_files_are_gone(path):
    module = "stepsim.workloads." + path.removesuffix(".py").replace("/", ".")
    assert importlib.util.find_spec(module) is None
    assert f"stepsim/workloads/{path}" in parallel_lines.PARALLEL  # counted (as 0) against the tree before


def test_every_counted_file_and_function_exists():
    for path, functions in parallel_lines.PARALLEL.items():
        if path.removeprefix("stepsim/workloads/") in REMOVED:
            assert not (ROOT / path).exists()
            continue
        assert (ROOT / path).is_file(), path
        if functions is not None:
            defined = {n.name for n in ast.parse((ROOT / path).read_text()).body if isinstance(n, ast.FunctionDef)}
            assert set(functions) <= defined, (path, set(functions) - defined)


def test_a_function_counts_from_its_first_line_to_its_last(tmp_path):
    (tmp_path / "m.py").write_text("import os\n\n\n@staticmethod\ndef f():\n    return 1\n\n\ndef g():\n    pass\n")
    assert parallel_lines.lines_of(tmp_path, "m.py", ("f",)) == 3
    assert parallel_lines.lines_of(tmp_path, "m.py", None) == 10
    assert parallel_lines.lines_of(tmp_path, "absent.py", None) == 0
