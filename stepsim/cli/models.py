"""``stepsim models list | show``: the built-in models and the dimensions a model name or config file resolves to.

Dimensions are in elements (D, F, head_dim) or counts (layers, heads, experts); see
:mod:`stepsim.models.presets` for the Hugging Face fields they come from.
"""

from __future__ import annotations

from stepsim.base.errors import ConfigError
from stepsim.base.ranges import json_text
from stepsim.models.presets import PRESETS, ModelConfig, resolve_model

#: (JSON key, table header) of the ``models list`` columns
LIST_COLUMNS = (("name", "name"), ("model_type", "type"), ("hidden", "D"), ("expert_intermediate", "F_expert"),
                ("experts", "experts"), ("top_k", "top_k"), ("shared_experts", "shared"),
                ("shared_intermediate", "F_shared"), ("dense_intermediate", "F_dense"), ("layers", "layers"),
                ("heads", "heads"), ("kv_heads", "kv_heads"), ("head_dim", "head_dim"), ("aliases", "aliases"))

#: (JSON key, label) of the ``models show`` lines
SHOW_LINES = (("name", "name"), ("source", "source"), ("model_type", "model_type"), ("kind", "kind"),
              ("hidden", "hidden (D, elements)"), ("layers", "layers"), ("heads", "attention heads"),
              ("kv_heads", "KV heads"), ("query_per_kv_head", "query heads per KV head"),
              ("head_dim", "head_dim (elements)"), ("experts", "routed experts"), ("top_k", "top_k"),
              ("expert_intermediate", "expert FFN (F, elements)"), ("shared_experts", "shared experts"),
              ("shared_intermediate", "shared FFN (elements)"), ("dense_intermediate", "dense FFN (elements)"),
              ("aliases", "aliases"))
#: (JSON key, label) of the ``models show`` lines after the moe workload's
MEMORY_LINES = (("attention_kind", "attention"), ("kv_bytes_per_token", "KV bytes per token"),
                ("parameters", "parameters"))
MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, list | tuple):
        return ", ".join(value) or "-"
    return str(value)


def _moe_workload_note(m: ModelConfig) -> str:
    """Whether ``stepsim metrics/run moe --model <m>`` accepts the model, and why not."""
    try:
        m.moe
    except ConfigError as exc:
        return f"no: {exc}"
    return "yes (routed experts)"


def _memory(m: ModelConfig) -> dict:
    """KV bytes per token (all layers; the sliding layers' share, held for at most the window) and the
    parameter count and bf16 weight bytes (None when the config has no ``vocab_size``)."""
    from stepsim.serve.memory import kv_bytes_per_layer, model_memory

    d = {"kv_bytes_per_token": m.layers * kv_bytes_per_layer(m),
         "sliding_kv_bytes_per_token": m.sliding_layers * kv_bytes_per_layer(m), "parameters": None,
         "weight_bytes": None}
    try:
        memory = model_memory(m)
    except ConfigError as exc:  # a user's file may leave vocab_size out: its dimensions are still shown
        if "missing field" not in str(exc):  # a value serving refuses ("false" as a bool, inf) is refused here too
            raise
        return d
    return {**d, "parameters": memory.parameters, "weight_bytes": memory.weight_bytes}


def _list(args) -> int:
    rows = [m.as_dict() for m in PRESETS.values()]
    if args.json:
        print(json_text(rows, indent=2))
        return 0
    table = [[header for _, header in LIST_COLUMNS]] + [[_cell(r[key]) for key, _ in LIST_COLUMNS] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(LIST_COLUMNS))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    print("D, F_*, head_dim in elements; F_shared is all shared experts together; '-' = none. "
          "stepsim models show NAME_OR_FILE for one model")
    return 0


def _show(args) -> int:
    m = resolve_model(args.model)
    d = m.as_dict()
    d["moe_workload"] = _moe_workload_note(m)
    d.update(_memory(m))
    # what serve and plan price layer group by layer group (stepsim/serve/layer_list.py); run and map refuse them
    d["layer_list_features"] = m.unmodelled()
    if m.paper_attention:
        d["paper_attention"] = {**m.paper_attention_model.__dict__}
    if args.json:
        print(json_text(d, indent=2))
        return 0
    width = max(len(label) for _, label in SHOW_LINES)
    for key, label in SHOW_LINES:
        print(f"{label:<{width}}  {_cell(d[key])}")
    print(f"{'moe workload':<{width}}  {d['moe_workload']}")
    for key, label in MEMORY_LINES:
        print(f"{label:<{width}}  {_cell(d[key])}")
    if m.is_mla:
        print(f"{'MLA (elements)':<{width}}  " + ", ".join(f"{k} {getattr(m, k)}" for k in MLA_KEYS))
    if m.sliding_layers:
        print(f"{'sliding window':<{width}}  {m.sliding_window} tokens on {m.sliding_layers} of {m.layers} layers")
    if m.chunked_layers:
        print(f"{'attention chunks':<{width}}  {m.attention_chunk_size} tokens on {m.chunked_layers} of {m.layers} "
              "layers")
    if d["layer_list_features"]:
        print(f"{'layer-list features':<{width}}  {', '.join(d['layer_list_features'])} (served and planned layer "
              "group by layer group; run and map refuse them)")
    if m.paper_attention:
        changed = ", ".join(f"{k} {v} (published {getattr(m.attention, k)})" for k, v in m.paper_attention.items())
        print(f"{'paper attention runs':<{width}}  {changed}")
    return 0


def register(subparsers) -> None:
    """Add ``stepsim models list`` and ``stepsim models show``."""
    models = subparsers.add_parser("models", help="list built-in models, show a model's resolved dimensions",
                                   description="Built-in models and Hugging Face config.json files.")
    models.set_defaults(handler=lambda args: (models.print_help(), 1)[1])
    sub = models.add_subparsers(dest="models_command", metavar="SUBCOMMAND")
    p = sub.add_parser("list", help="the built-in models and their dimensions")
    p.add_argument("--json", action="store_true", help="print a JSON list of the resolved dimensions")
    p.set_defaults(handler=_list)
    p = sub.add_parser("show", help="the dimensions a preset name, alias or config.json resolves to")
    p.add_argument("model", metavar="NAME_OR_FILE", help="preset name or alias (stepsim models list), or a "
                                                         "Hugging Face config.json path")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=_show)
