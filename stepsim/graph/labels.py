"""Labels of a graph's operators that stay put when other operators come and go: each one's group (``expert 3``)
and operator class. Timelines, unit tables and reports use them; light on purpose (no pyarrow, no sympy)."""

from __future__ import annotations


def group_label(group) -> str:
    """The label of an operator's ``op.group`` (``("expert", 3)`` -> ``expert 3``); ``shared`` for none."""
    if isinstance(group, tuple) and len(group) == 2:
        return f"{group[0]} {group[1]}"
    return "shared"


def graph_labels(graph) -> tuple[dict[str, str], dict[str, str]]:
    """``(groups, kinds)``: every operator's group label and operator class, by name (for :func:`decode`)."""
    return ({op.name: group_label(op.group) for op in graph.ops}, {op.name: type(op).__name__ for op in graph.ops})
