"""``--help`` grouped by topic: each command's options in argparse argument groups (model, traces, schedule,
chips, hardware, outputs, ...), so a command of 50 flags reads as a few short lists.

The flags are added where they are defined (:mod:`stepsim.cli.args` shares the workload flags among commands);
:func:`group_options` then files each under its command's topic, in the order of :data:`TOPICS`. Only the help
layout changes: parsing, usage and mutually exclusive groups are untouched.
"""

from __future__ import annotations

import argparse

#: the shared workload flags (run, metrics, size-fifos, optimize), by topic
WORKLOAD_TOPICS = (
    ("model", ("model", "hidden", "intermediate", "experts", "top_k")),
    ("traces", ("trace", "routing", "kv_lengths", "iteration", "layer", "batch_id")),
    ("schedule: tiling, regions, attention", ("tiling", "tile_n", "tile_f", "tile_m", "regions", "strategy", "softmax",
                                              "kv_heads", "one_head")),
    ("many chips and collectives", ("system", "ep", "tp", "pp", "layers", "micro_batches", "placement", "op", "bytes",
                                    "algorithm")),
    ("ONNX models", ("no_fuse", "spill")),
    ("hardware and FIFOs", ("hardware", "compute_bw", "channel_depth", "fifo_depths", "convention")),
)
#: command -> (topic, option dests) in the order --help shows them
TOPICS: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "run": WORKLOAD_TOPICS + (
        ("whole-chip mapping", ("schedule",)),
        ("run mode", ("functional", "check", "force")),
        ("output", ("json", "verbose", "out", "report", "deadlock_report")),
        ("timeline", ("timeline", "timeline_limit", "timeline_min_dur")),
    ),
    "metrics": WORKLOAD_TOPICS + (("whole-chip mapping", ("schedule",)), ("output", ("json", "verbose", "out"))),
    "size-fifos": WORKLOAD_TOPICS + (
        ("sizing", ("slack", "min_depth", "jobs")),
        ("output", ("json", "verbose", "out")),
    ),
    "optimize": WORKLOAD_TOPICS + (
        ("search", ("objective", "max_on_chip", "max_compute", "max_chips", "space", "hierarchical", "force")),
        ("workers", ("jobs", "executor", "address")),
        ("output", ("json", "verbose", "out", "no_progress")),
    ),
    "serve": (
        ("model and hardware", ("model", "hardware", "system", "disaggregate", "first_token")),
        ("requests", ("requests", "arrival_scale", "arrival", "limit_requests", "duration", "drop_long",
                      "truncate_long", "seed")),
        ("scheduler", ("scheduler", "max_seqs", "max_batch_tokens", "chunk_tokens")),
        ("step latency", ("fidelity", "iteration_latency", "schedule", "routing", "calibration_requests")),
        ("SLO", ("slo",)),
        ("workers", ("jobs", "executor", "address")),
        ("output", ("out", "json", "timeline")),
    ),
    "plan": (
        ("model and hardware", ("model", "hardware", "max_chips")),
        ("requests and rate", ("requests", "limit_requests", "arrival_scale", "rate")),
        ("SLO", ("slo", "percentile")),
        ("deployments", ("space", "no_verify")),
        ("workers", ("jobs", "executor")),
        ("output", ("out", "json")),
    ),
}


def group_options(parser: argparse.ArgumentParser, command: str) -> None:
    """File ``parser``'s options under the topics of ``command`` (:data:`TOPICS`); an option no topic names stays
    under "options" (tests/cli/test_help.py checks that none does for the grouped commands)."""
    actions = {action.dest: action for action in parser._actions if action.option_strings}
    for action in actions.values():
        if action.required and "required" not in (action.help or ""):
            action.help = f"{action.help} (required)"
    for title, dests in TOPICS[command]:
        moved = [actions[d] for d in dests if d in actions]
        if not moved:
            continue
        group = parser.add_argument_group(title)
        for action in moved:
            for holder in parser._action_groups:
                if action in holder._group_actions:
                    holder._group_actions.remove(action)
            group._group_actions.append(action)
