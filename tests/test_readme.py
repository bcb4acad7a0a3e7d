"""Every command in the README runs as written (so the README cannot drift from the code).

The ```bash blocks run line by line (backslash continuations joined) and the ```python blocks run in one shared
namespace, in a folder laid out like the repository: the repository's top-level entries linked into it (paths such
as ``stepsim/data/models/...`` resolve) and ``../shared`` beside it, so outputs land in a temporary folder. The
quick start's two ``./run.sh`` lines are left out (one would run this suite again); ``./run.sh`` itself is checked
to print its usage. Needs ``../shared/traces`` (skipped with that reason when absent).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
#: lines of the quick start that are not run here
SKIPPED = ("./run.sh demo", "./run.sh test")


def readme_blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", README.read_text(), re.S)


def bash_commands() -> list[str]:
    """Every command line of the README's bash blocks, continuations joined, quick-start lines left out."""
    commands = []
    for block in readme_blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip() and not line.startswith(SKIPPED):
                commands.append(line.strip())
    return commands


@pytest.fixture(scope="module")
def repo_like(shared_traces, tmp_path_factory) -> Path:
    """``<tmp>/repo`` with links to the repository's top-level entries, and ``<tmp>/shared`` -> ../shared."""
    root = tmp_path_factory.mktemp("readme")
    repo = root / "repo"
    repo.mkdir()
    for entry in REPO.iterdir():
        if entry.name not in (".git", ".venv", "stepsim-out"):
            (repo / entry.name).symlink_to(entry)
    (root / "shared").symlink_to(shared_traces.parent)
    return repo


def test_readme_has_the_quick_start_and_commands():
    quick = readme_blocks("bash")[0].splitlines()
    assert [line.split("#")[0].strip() for line in quick] == list(SKIPPED)
    assert len(bash_commands()) >= 20
    run_sh = subprocess.run(["./run.sh"], cwd=REPO, capture_output=True, text=True)
    assert (run_sh.returncode, run_sh.stderr) == (2, "usage: ./run.sh demo|test [args...]\n")


@pytest.mark.slow
@pytest.mark.traces
@pytest.mark.parametrize("command", bash_commands())
def test_readme_bash_command_runs(repo_like, command):
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(command, shell=True, cwd=repo_like, env=env, capture_output=True, text=True,
                          timeout=600, executable="/bin/bash")
    assert proc.returncode == 0, f"{command}\n{proc.stderr[-2000:]}"
    assert "Traceback" not in proc.stderr


@pytest.mark.traces
def test_readme_python_blocks_run(repo_like, monkeypatch):
    monkeypatch.chdir(repo_like)
    namespace: dict = {}
    for block in readme_blocks("python"):
        exec(compile(block, str(README), "exec"), namespace)  # noqa: S102 - the README's own examples
    assert namespace["g"].off_chip_bytes() == 98304
