"""``--help`` reads as a reference: the long commands' options grouped by topic, and every option states its
default (or is a flag, or is required)."""

from __future__ import annotations

import argparse

import pytest

from stepsim.cli import build_parser
from stepsim.cli.help_topics import TOPICS


def _commands() -> dict[str, argparse.ArgumentParser]:
    """Every command's parser, subcommands included (``trace synth``), by its name."""
    found = {}

    def walk(parser, name):
        found[name] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, child in action.choices.items():
                    walk(child, f"{name} {sub}".strip())

    walk(build_parser([]), "")
    return found


COMMANDS = _commands()


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_states_its_default_or_is_a_flag(command):
    parser = COMMANDS[command]
    unstated = [action.option_strings[-1] for action in parser._actions
                if action.option_strings and action.nargs != 0 and not action.required
                and "default" not in (action.help or "")]
    assert unstated == []
    parser.format_help()  # renders (no % left unescaped)


@pytest.mark.parametrize("command", sorted(TOPICS))
def test_long_commands_group_their_options_by_topic(command):
    parser = COMMANDS[command]
    groups = {group.title: [a.dest for a in group._group_actions] for group in parser._action_groups}
    assert groups.pop("options") == ["help"]  # every other option under a topic
    groups = {title: dests for title, dests in groups.items() if title != "positional arguments"}
    assert list(groups) == [
        title for title, dests in TOPICS[command] if any(d in {a.dest for a in parser._actions} for d in dests)]
    assert all(groups.values())


def test_run_help_shows_the_topics_in_order_with_their_defaults(capsys):
    with pytest.raises(SystemExit):
        build_parser(["run", "--help"]).parse_args(["run", "--help"])
    text = capsys.readouterr().out
    titles = [line[:-1] for line in text.splitlines() if line and not line.startswith(" ") and line.endswith(":")]
    assert titles == ["positional arguments", "options", "model", "traces", "schedule: tiling, regions, attention",
                      "many chips and collectives", "ONNX models", "hardware and FIFOs", "run mode", "output",
                      "timeline"]
    assert "--channel-depth CHANNEL_DEPTH\n                        default FIFO depth in elements (default: the" in text
