"""Every ``stepsim`` command in a code block of docs/*.md parses as written: its command, subcommand, flags and
choices exist (argparse of ``stepsim.cli.build_parser``, the parser ``stepsim`` itself uses), so a flag renamed
or removed in the code fails here instead of leaving the docs stale. The README's commands are run (and their
outputs compared) by tests/test_readme.py; these are only parsed (many need minutes or files a reader makes).

A command is a line of a fenced block starting with ``stepsim`` or ``$ stepsim`` (a console transcript), with
backslash continuations joined, split at ``&&``, its ``# comment`` dropped. ``python examples/X.py`` lines name a
script that must exist."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from stepsim.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted((REPO / "docs").glob("*.md"))


def doc_commands() -> list[tuple[str, str]]:
    """``(page name, command)`` of every shell command in the code blocks of docs/*.md."""
    found = []
    for page in DOCS:
        for block in re.findall(r"^```\w*\n(.*?)^```$", page.read_text(), re.S | re.M):
            for line in block.replace("\\\n", " ").splitlines():
                for part in line.strip().removeprefix("$ ").split("&&"):
                    if part.strip().startswith(("stepsim ", "python examples/")):
                        found.append((page.name, shlex.join(shlex.split(part, comments=True))))
    return found


COMMANDS = doc_commands()


def test_the_docs_hold_commands_of_every_kind():
    """The extraction finds the docs' commands (a change of the fences' style would leave nothing to check)."""
    names = {shlex.split(c)[1] for _, c in COMMANDS if c.startswith("stepsim ")}
    assert len(COMMANDS) >= 60
    assert {"run", "metrics", "trace", "models", "map", "serve", "size-fifos", "report", "optimize", "reproduce",
            "graph"} <= names


@pytest.mark.parametrize(("page", "command"), COMMANDS, ids=[f"{p}: {c}" for p, c in COMMANDS])
def test_documented_command_parses(page, command):
    words = shlex.split(command)
    if words[0] == "python":
        assert (REPO / words[1]).is_file(), f"{page}: {words[1]} does not exist"
        return
    argv = words[1:]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            build_parser(argv).parse_args(argv)
        except SystemExit as exc:
            pytest.fail(f"{page}: `{command}` does not parse (exit {exc.code}): {err.getvalue().strip()}")


def test_a_stale_flag_fails():
    """The check itself: a flag that does not exist is caught."""
    argv = ["run", "moe", "--tile-size", "4"]
    with contextlib.redirect_stderr(io.StringIO()) as err, pytest.raises(SystemExit):
        build_parser(argv).parse_args(argv)
    assert err.getvalue().splitlines()[-1] == "stepsim: error: unrecognized arguments: --tile-size 4"
