"""docs/mapping.md shows real output: every ``$ stepsim ...`` line of its console blocks runs and prints
exactly the lines under it."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from stepsim.cli import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "mapping.md"


def transcripts() -> list[tuple[str, list[str]]]:
    """``(command, output lines)`` of each console block: its first line ``$ stepsim ...``, then the output (the
    page's ``text`` blocks are transcripts no test re-runs: the Qwen3 FFN's mapping takes two minutes cold)."""
    out = []
    for block in re.findall(r"```console\n(.*?)```", DOC.read_text(), re.S):
        first, *lines = block.rstrip("\n").splitlines()
        assert first.startswith("$ stepsim "), first
        out.append((first[len("$ stepsim "):], lines))
    return out


def test_the_doc_has_its_transcripts_and_the_sections_the_code_cites():
    assert [c for c, _ in transcripts()] == [
        "map ffn --model llama-3.1-8b --shape 1 --hardware sn40l",
        "map decode --model qwen3-30b-a3b --shape 64 --hardware sn40l"]
    headings = re.findall(r"^## ([0-9]+)\. ", DOC.read_text(), re.M)
    assert headings == [str(i) for i in range(1, 10)]


@pytest.mark.slow
@pytest.mark.parametrize("command, lines", transcripts(), ids=[c for c, _ in transcripts()])
def test_the_doc_commands_print_what_the_doc_shows(tmp_path, monkeypatch, capsys, command, lines):
    monkeypatch.setenv("STEPSIM_MAPPING_CACHE", str(tmp_path))
    assert main(shlex.split(command + " --no-cache")) == 0
    assert capsys.readouterr().out.splitlines() == lines
