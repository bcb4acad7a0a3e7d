"""The layer map of docs/architecture.md holds: import contracts kept, no import circle, a tidy package top.

``lint-imports`` reads the contracts from ``pyproject.toml``; a copy of the package with one module that reaches
up a layer shows that a break fails with the contract's name.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
#: what may sit at the top of stepsim/ besides packages (docs/architecture.md)
TOP_LEVEL_FILES = {"__init__.py", "__main__.py", "_version.py"}
LAYERS_CONTRACT = "layers of docs/architecture.md (a module imports only its own layer and those below)"


def _lint_imports(project: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(project)}  # the copy's stepsim, ahead of the installed one
    return subprocess.run([str(LINT_IMPORTS), "--config", str(project / "pyproject.toml"), "--no-cache"],
                          cwd=project, env=env, capture_output=True, text=True, timeout=300)


def _copy_project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    shutil.copytree(ROOT / "stepsim", project / "stepsim", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", project / "pyproject.toml")
    return project


def test_the_import_contracts_are_kept():
    proc = _lint_imports(ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "Contracts: 3 kept, 0 broken." in proc.stdout


def test_an_import_that_reaches_up_a_layer_breaks_the_layers_contract(tmp_path):
    project = _copy_project(tmp_path)
    (project / "stepsim" / "models" / "reaches_up.py").write_text(
        '"""A model module that imports a workload builder: not allowed."""\n\n'
        "def build():\n    from stepsim.workloads.moe import build_moe  # lazy, and still an import\n\n"
        "    return build_moe\n")
    proc = _lint_imports(project)
    assert proc.returncode == 1
    assert "Contracts: 2 kept, 1 broken." in proc.stdout
    broken = re.sub(r"\s+", " ", proc.stdout.split("Broken contracts")[1])
    assert f"{LAYERS_CONTRACT} ---" in broken
    assert "stepsim.models is not allowed to import stepsim.workloads" in broken
    assert "stepsim.models.reaches_up -> stepsim.workloads.moe" in broken


def test_drivers_that_import_each_other_break_the_independence_contract(tmp_path):
    project = _copy_project(tmp_path)
    (project / "stepsim" / "optimize" / "borrows.py").write_text("from stepsim.reproduce.stats import *  # noqa\n")
    proc = _lint_imports(project)
    assert proc.returncode == 1
    broken = re.sub(r"\s+", " ", proc.stdout.split("Broken contracts")[1])
    assert "drivers are siblings: they share batch and results, not each other ---" in broken
    assert "stepsim.optimize.borrows -> stepsim.reproduce.stats" in broken


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module (iterative: no recursion limit)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_component_finder_finds_a_circle():
    assert _strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _strongly_connected({"a": {"b"}, "b": set()}) == []


def test_no_module_of_stepsim_imports_itself_through_others():
    graph = grimp.build_graph("stepsim", cache_dir=None)
    imports = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    assert _strongly_connected(imports) == []


def test_the_top_of_the_package_holds_only_packages_and_the_entry_files():
    top = ROOT / "stepsim"
    files = {p.name for p in top.iterdir() if p.is_file()}
    assert files == TOP_LEVEL_FILES
    packages = sorted(p.name for p in top.iterdir() if (p / "__init__.py").is_file())
    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert [p for p in packages if f"`stepsim/{p}/`" not in doc] == []
    assert {p.name for p in top.iterdir() if p.is_dir() and p.name != "__pycache__"} == {*packages, "data"}


def _doc_layers() -> list[set[str]]:
    """The layers drawn in docs/architecture.md, top first (each a set of package names)."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    diagram = doc.split("```")[1]
    layers = []
    for line in diagram.splitlines():
        names = re.match(r"^  ([a-z_]+(?: \| [a-z_]+)*)\s", line + " ")
        if names and names.group(1) != "":
            layers.append(set(names.group(1).split(" | ")))
    return layers


def test_the_documented_layers_are_the_contracts_layers():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c["layers"] for c in config["contracts"] if c["type"] == "layers"]
    contract = [{name.strip().removeprefix("stepsim.") for name in re.split(r"[:|]", line)} for line in layers]
    assert _doc_layers() == contract
