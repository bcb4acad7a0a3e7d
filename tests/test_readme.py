"""Every command in the README runs as written and prints what the README shows (so the README cannot drift from
the code).

The ```bash blocks run line by line (backslash continuations joined) and the ```python blocks run in one shared
namespace, in a folder laid out like the repository: the repository's top-level entries linked into it (paths such
as ``stepsim/data/models/...`` resolve) and ``../shared`` beside it, so outputs land in a temporary folder. A ```text
block right after a bash block is the standard output of that block's last command, after a python block that
block's standard output: compared line by line, numbers included (a ``...`` line stands for any lines, a line
ending in `` ...`` for any line starting with the rest). The quick start's two ``./run.sh`` lines are left out (one
would run this suite again) and so is the install line (it would reinstall the environment under test);
``./run.sh`` itself is checked to print its usage. Needs ``../shared/traces`` (skipped with that reason when
absent).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from calibration_seeding import check_seed_used, seeded_cache

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
#: lines of the quick start that are not run here
SKIPPED = ("./run.sh demo", "./run.sh test")
#: the one install line (not run here)
INSTALL = 'pip install -e ".[all]"'
#: the README's length limit (the rest is in docs/)
MAX_LINES = 300


def readme_blocks(kind: str) -> list[str]:
    return [text for lang, text in fenced_blocks() if lang == kind]


def fenced_blocks() -> list[tuple[str, str]]:
    """Every fenced block of the README in order, as (language, text)."""
    return re.findall(r"^```(\w*)\n(.*?)^```$", README.read_text(), re.S | re.M)


def bash_commands() -> list[tuple[str, str | None]]:
    """Every command line of the README's bash blocks, continuations joined, quick-start and install lines left out,
    each with the output the README shows for it (None: none shown)."""
    commands = []
    blocks = fenced_blocks()
    for i, (lang, block) in enumerate(blocks):
        if lang != "bash":
            continue
        lines = [line.strip() for line in block.replace("\\\n", " ").splitlines()
                 if line.strip() and not line.startswith(SKIPPED) and line.strip() != INSTALL]
        shown = blocks[i + 1][1] if i + 1 < len(blocks) and blocks[i + 1][0] == "text" else None
        commands += [(line, shown if n == len(lines) - 1 else None) for n, line in enumerate(lines)]
    return commands


def assert_shown(actual: str, shown: str, what: str) -> None:
    """``actual`` (a command's output) matches ``shown`` (the README's block): line by line, a ``...`` line for any
    lines (none included), a line ending in `` ...`` for any line starting with the rest."""
    pattern = ""
    for line in shown.splitlines():
        if line == "...":
            pattern += r"(?:[^\n]*\n)*?"
        elif line.endswith(" ..."):
            pattern += re.escape(line[:-4]) + r"[^\n]*\n"
        else:
            pattern += re.escape(line) + r"\n"
    assert re.fullmatch(pattern, actual), f"{what}: the README shows\n{shown}\nbut it printed\n{actual}"


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
    text = README.read_text()
    assert len(text.splitlines()) <= MAX_LINES
    quick = readme_blocks("bash")[1].splitlines()
    assert [line.split("#")[0].strip() for line in quick] == list(SKIPPED)
    assert readme_blocks("bash")[0] == INSTALL + "\n"
    assert len(bash_commands()) >= 20
    assert all(lang in ("bash", "python", "text") for lang, _ in fenced_blocks())
    outputs = [i for i, (lang, _) in enumerate(fenced_blocks()) if lang == "text"]
    assert len(outputs) >= 17 and all(fenced_blocks()[i - 1][0] in ("bash", "python") for i in outputs)
    run_sh = subprocess.run(["./run.sh"], cwd=REPO, capture_output=True, text=True)
    assert (run_sh.returncode, run_sh.stderr) == (2, "usage: ./run.sh demo|test [args...]\n")


def test_the_install_lines_extra_holds_every_extra():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["all"] == [f"stepsim[{','.join(name for name in extras if name not in ('all', 'dev'))}]"]
    assert '-e ".[all]"' in (REPO / "run.sh").read_text()  # the demo installs it too


def test_assert_shown_reads_the_readmes_elisions():
    assert_shown("a\nb 1 s\nc\n", "...\nb ...\n...\n", "x")
    assert_shown("a\n", "...\na\n...\n", "x")
    with pytest.raises(AssertionError, match="the README shows"):
        assert_shown("a\nb 2\n", "...\nb 1\n", "x")


@pytest.mark.slow
@pytest.mark.traces
@pytest.mark.parametrize("command, shown", bash_commands(), ids=[c for c, _ in bash_commands()])
def test_readme_bash_command_runs(repo_like, tmp_path, command, shown):
    """The commands' fast calibrations (the serve and plan examples: a mapped 4-layer model's takes minutes on a
    cold cache) come from the stored ones (tests/calibration_seeding.py), their own cache folder each."""
    from stepsim.serve.api import CALIBRATION_CACHE_ENV

    calibrations = seeded_cache(tmp_path / "calibrations")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               **{CALIBRATION_CACHE_ENV: str(calibrations)})
    proc = subprocess.run(command, shell=True, cwd=repo_like, env=env, capture_output=True, text=True,
                          timeout=600, executable="/bin/bash")
    assert proc.returncode == 0, f"{command}\n{proc.stderr[-2000:]}"
    assert "Traceback" not in proc.stderr
    if shown is not None:
        assert_shown(proc.stdout, shown, command)
    check_seed_used(calibrations)


@pytest.mark.traces
def test_readme_python_blocks_run(repo_like, monkeypatch):
    monkeypatch.chdir(repo_like)
    if not (repo_like / "stepsim-out" / "llama_block.onnx").exists():  # run alone: the ONNX section's model first
        [onnx] = [c for c, _ in bash_commands() if c.startswith("python examples/onnx_blocks.py")]
        subprocess.run(onnx.split(" && ")[0].replace("python", sys.executable, 1), shell=True, check=True)
    namespace: dict = {}
    blocks = fenced_blocks()
    for i, (lang, block) in enumerate(blocks):
        if lang != "python":
            continue
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(block, str(README), "exec"), namespace)  # noqa: S102 - the README's own examples
        if i + 1 < len(blocks) and blocks[i + 1][0] == "text":
            assert_shown(out.getvalue(), blocks[i + 1][1], "the python block")
    assert namespace["g"].off_chip_bytes() == 98304


@pytest.mark.slow
@pytest.mark.traces
def test_readme_commands_write_only_under_stepsim_out(repo_like):
    """Run after the commands: the folder laid out like a clone holds nothing new but stepsim-out/."""
    assert sorted(p.name for p in repo_like.iterdir() if not p.is_symlink()) == ["stepsim-out"]


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.lower()).strip().replace(" ", "-")


def test_every_link_of_the_readme_and_docs_points_to_a_file_and_heading_that_exist():
    broken = []
    for page in [README, *sorted((REPO / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if target.startswith("http"):
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path) if path else page
            if not file.exists():
                broken.append(f"{page.name}: {target}")
            elif anchor and anchor not in {_anchor(line.lstrip("#").strip()) for line in file.read_text().splitlines()
                                           if line.startswith("#")}:
                broken.append(f"{page.name}: {target}")
    assert broken == []
