"""What --help shows: plain text (no reStructuredText), help for every argument, the same --jobs everywhere, the
workloads a command takes and every model preset; the long commands' options grouped by topic, and every option's
default stated (or a flag, or required)."""

from __future__ import annotations

import argparse

import pytest

from stepsim.cli import build_parser, main, plain_text
from stepsim.cli.help_topics import TOPICS


def _parsers(parser, path=("stepsim",)):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


PARSERS = dict(_parsers(build_parser([])))


def test_plain_text_drops_the_markup_of_docstrings():
    assert plain_text("``stepsim <command> ...`` (also ``python -m stepsim``)") == \
        "stepsim <command> ... (also python -m stepsim)"
    assert plain_text("(:mod:`stepsim.insight.compare`, :func:`~stepsim.passes.sizing.size_fifos`)") == \
        "(stepsim.insight.compare, stepsim.passes.sizing.size_fifos)"


def test_no_help_shows_restructuredtext_and_every_argument_has_help():
    assert len(PARSERS) > 20  # every command and subcommand (trace import / synth ..., cache, server ...)
    for path, parser in PARSERS.items():
        text = parser.format_help()
        assert "``" not in text and ":mod:`" not in text and ":func:`" not in text, " ".join(path)
        missing = [a.dest for a in parser._actions
                   if not isinstance(a, argparse._SubParsersAction) and not a.help]
        assert missing == [], " ".join(path)


def test_top_level_help(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # one line per paragraph
    with pytest.raises(SystemExit):
        main(["--help"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == ["usage: stepsim [-h] [--version] COMMAND ...", "",
                         "Simulate Streaming Tensor Programs on dataflow accelerators: traffic, on-chip memory, "
                         "FLOPs and cycles of LLM layers on real traces."]
    assert lines[-1] == "Run 'stepsim COMMAND --help' for a command's flags; 'python -m stepsim' works the same."


def test_jobs_is_one_flag_with_one_default():
    helps = {}
    for command in ("sweep", "optimize", "reproduce", "size-fifos"):
        [jobs] = [a for a in PARSERS[("stepsim", command)]._actions if a.dest == "jobs"]
        assert (jobs.option_strings, jobs.default) == (["--jobs", "-j"], None), command
        helps[command] = jobs.help
    assert helps == {
        "sweep": "the runs on N worker processes, N >= 1 (default: one per CPU available); local executor and "
                 "local Dask cluster",
        "optimize": "the simulations on N worker processes, N >= 1 (default: one per CPU available); local "
                    "executor and local Dask cluster",
        "reproduce": "the simulations (the tables do not depend on N) on N worker processes, N >= 1 (default: one "
                     "per CPU available)",
        "size-fifos": "candidate depths simulated at once on N worker processes, N >= 1 (default: one per CPU "
                      "available)"}


def test_jobs_left_out_is_every_cpu_and_a_bad_count_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    from stepsim.batch import executors
    from stepsim.cli.args import jobs_from_args

    assert jobs_from_args(argparse.Namespace(jobs=None)) == executors.default_jobs()
    assert jobs_from_args(argparse.Namespace(jobs=3)) == 3
    for command in (["reproduce", "validation", "--traces", str(tmp_path), "--out", str(tmp_path / "o")],
                    ["size-fifos", "swiglu", "--out", str(tmp_path / "d.toml")]):
        assert main([*command, "--jobs", "0"]) == 2
        # the last line (a cold kernel cache is announced on the line before it for simulating commands)
        err = capsys.readouterr().err
        assert err.splitlines()[-1] == (f"stepsim: error: --jobs must be an int >= 1 (leave it out to use every "
                                        f"CPU: {executors.default_jobs()}), got 0") and "Traceback" not in err
    assert not (tmp_path / "o").exists() and not (tmp_path / "d.toml").exists()


def test_optimize_lists_only_the_workloads_it_searches_and_model_lists_every_preset():
    from stepsim.models.presets import PRESETS

    [workload] = [a for a in PARSERS[("stepsim", "optimize")]._actions if a.dest == "workload"]
    assert workload.help == "moe | attention | decoder"
    for command in ("run", "metrics", "sweep", "optimize", "size-fifos", "demo"):
        models = [a for a in PARSERS[("stepsim", command)]._actions if a.dest == "model"]
        for action in models:
            for name, model in PRESETS.items():
                assert name in action.help and all(alias in action.help for alias in model.aliases), command
    assert len(PRESETS) == 10


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
                      "many chips and collectives", "ONNX models", "hardware and FIFOs", "whole-chip mapping",
                      "run mode", "output", "timeline"]
    assert "--channel-depth CHANNEL_DEPTH\n                        default FIFO depth in elements (default: the" in text
