"""Versioned Arrow schemas of the three trace kinds stepsim reads and writes.

Every trace table carries two schema-metadata keys, :data:`VERSION_KEY` (``stepsim.schema_version``) and
:data:`KIND_KEY` (``stepsim.kind``), so a reader can refuse a file written by a newer, incompatible stepsim
instead of misreading it. Kind-specific metadata (``model``, ``num_experts``, ``top_k``, ``source`` for
routing traces) is stored as UTF-8 strings, because Arrow schema metadata is bytes-to-bytes.

Kinds and columns (schema version 1):

``expert_routing``
    one row per (iteration, layer, token): ``iteration`` int32, ``layer`` int32, ``token`` int32,
    ``expert_ids`` fixed_size_list<int16>[top_k], optional ``gate_weights`` fixed_size_list<float32>[top_k].
``requests``
    one row per request: ``request_id`` int64, ``arrival`` timestamp[us], ``context_tokens`` int32 (tokens),
    ``generated_tokens`` int32 (tokens).
``decode_batches``
    one row per decode batch: ``batch_id`` int32, ``request_ids`` list<int64>, ``kv_lengths`` list<int64>
    (KV-cache tokens per request of the batch).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from stepsim.base.errors import TraceSchemaError

#: schema-metadata key holding the schema version (a decimal string)
VERSION_KEY = "stepsim.schema_version"
#: schema-metadata key holding the trace kind
KIND_KEY = "stepsim.kind"
#: the version this stepsim writes
SCHEMA_VERSION = "1"
#: versions this stepsim can read
SUPPORTED_VERSIONS = frozenset({"1"})

ROUTING = "expert_routing"
REQUESTS = "requests"
DECODE_BATCHES = "decode_batches"
KINDS = (ROUTING, REQUESTS, DECODE_BATCHES)

#: routing-trace metadata keys (the spec's names, not prefixed)
MODEL_KEY = "model"
NUM_EXPERTS_KEY = "num_experts"
TOP_K_KEY = "top_k"
SOURCE_KEY = "source"

#: MoE models whose routing shape is known, so ``--model`` alone fills num_experts and top_k
#: (docs/semantics.md §5.1). Keys are lower-case aliases.
KNOWN_MODELS: dict[str, tuple[int, int]] = {
    "mixtral": (8, 2),
    "mixtral8x7b": (8, 2),
    "mixtral-8x7b": (8, 2),
    "qwen": (128, 8),
    "qwen30b": (128, 8),
    "qwen3-30b-a3b": (128, 8),
    "deepseek": (64, 6),
    "deepseekv316b": (64, 6),
}

#: columns of the non-routing kinds, in file order
REQUEST_FIELDS = (
    pa.field("request_id", pa.int64(), nullable=False),
    pa.field("arrival", pa.timestamp("us"), nullable=False),
    pa.field("context_tokens", pa.int32(), nullable=False, metadata={"unit": "tokens"}),
    pa.field("generated_tokens", pa.int32(), nullable=False, metadata={"unit": "tokens"}),
)
BATCH_FIELDS = (
    pa.field("batch_id", pa.int32(), nullable=False),
    pa.field("request_ids", pa.list_(pa.int64()), nullable=False),
    pa.field(
        "kv_lengths",
        pa.list_(pa.int64()),
        nullable=False,
        metadata={"unit": "tokens"},
    ),
)


def model_shape(model: str | None) -> tuple[int, int] | None:
    """Return ``(num_experts, top_k)`` of a known MoE model name (case-insensitive), else None.

    Known: :data:`KNOWN_MODELS` and the MoE presets of :mod:`stepsim.models.presets` with their aliases.
    """
    if not model:
        return None
    shape = KNOWN_MODELS.get(model.strip().lower())
    if shape is None:
        from stepsim.models.presets import PRESETS, canonical_model_name

        preset = PRESETS.get(canonical_model_name(model))
        shape = (preset.experts, preset.top_k) if preset is not None and preset.is_moe else None
    return shape


def same_model(a: str, b: str) -> bool:
    """Whether two model names mean the same model (aliases such as ``qwen`` / ``qwen3-30b-a3b`` agree)."""
    from stepsim.models.presets import canonical_model_name

    return canonical_model_name(a).lower() == canonical_model_name(b).lower()


def routing_fields(top_k: int, gate_weights: bool = False) -> list[pa.Field]:
    """Fields of a routing trace with ``top_k`` experts per token (``gate_weights`` adds the weights)."""
    fields = [
        pa.field("iteration", pa.int32(), nullable=False),
        pa.field("layer", pa.int32(), nullable=False),
        pa.field("token", pa.int32(), nullable=False),
        pa.field("expert_ids", pa.list_(pa.int16(), top_k), nullable=False),
    ]
    if gate_weights:
        fields.append(pa.field("gate_weights", pa.list_(pa.float32(), top_k), nullable=False))
    return fields


@dataclass(frozen=True)
class TraceInfo:
    """What a reader knows about a trace before reading its rows.

    Parameters
    ----------
    kind : str
        One of :data:`KINDS`.
    source : str
        The file or folder as the user named it; every error message starts with it.
    metadata : dict of str to str
        Kind-specific schema metadata (``model``, ``num_experts``, ``top_k``, ``source``, ...) without the
        two ``stepsim.*`` keys, which :meth:`schema` adds.
    num_experts : int or None
        Routing only: experts per MoE layer (valid ids are ``0 .. num_experts-1``).
    top_k : int or None
        Routing only: experts chosen per token.
    gate_weights : bool
        Routing only: whether the trace has a ``gate_weights`` column.
    column_names : dict of str to str
        How the file names a normalized column, where it names it otherwise (the Azure CSV's ``ContextTokens``
        for ``context_tokens``): error messages say the file's name.
    """

    kind: str
    source: str
    metadata: dict[str, str] = field(default_factory=dict)
    num_experts: int | None = None
    top_k: int | None = None
    gate_weights: bool = False
    column_names: dict[str, str] = field(default_factory=dict)

    def label(self, column: str) -> str:
        """``column`` as the file names it."""
        return self.column_names.get(column, column)

    def schema(self) -> pa.Schema:
        """The normalized (on-disk) schema, with version, kind and metadata."""
        if self.kind == ROUTING:
            fields = routing_fields(self.top_k, self.gate_weights)
        elif self.kind == REQUESTS:
            fields = list(REQUEST_FIELDS)
        else:
            fields = list(BATCH_FIELDS)
        meta = {VERSION_KEY: SCHEMA_VERSION, KIND_KEY: self.kind}
        # sorted so the serialized schema (and therefore the file bytes) never depends on insertion order
        meta.update(sorted(self.metadata.items()))
        return pa.schema(fields, metadata=meta)


def make_schema(kind: str, *, top_k: int | None = None, gate_weights: bool = False, **metadata) -> pa.Schema:
    """Build the normalized schema of ``kind`` (for writers and synthetic generators).

    Parameters
    ----------
    kind : str
        One of :data:`KINDS`.
    top_k : int, optional
        Routing only: experts per token (required for routing).
    gate_weights : bool
        Routing only: include a ``gate_weights`` column.
    **metadata
        Extra metadata; values are stringified. For routing, ``num_experts`` is required and ``top_k`` is
        stored too.
    """
    if kind not in KINDS:
        raise TraceSchemaError(f"unknown trace kind {kind!r}; expected one of {', '.join(KINDS)}")
    meta = {k: str(v) for k, v in metadata.items() if v is not None}
    if kind == ROUTING:
        if top_k is None or NUM_EXPERTS_KEY not in meta:
            raise TraceSchemaError("a routing schema needs top_k and num_experts")
        meta[TOP_K_KEY] = str(top_k)
    info = TraceInfo(
        kind=kind,
        source=meta.get(SOURCE_KEY, ""),
        metadata=meta,
        num_experts=int(meta[NUM_EXPERTS_KEY]) if NUM_EXPERTS_KEY in meta else None,
        top_k=top_k,
        gate_weights=gate_weights,
    )
    return info.schema()


def decode_metadata(schema: pa.Schema) -> dict[str, str]:
    """Schema metadata as a str-to-str dict (empty when the schema has none)."""
    raw = schema.metadata or {}
    return {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in raw.items()}


def infer_kind(names: list[str], source: str) -> str:
    """Guess the kind of a foreign (metadata-less) table from its column names."""
    cols = set(names)
    if "expert_ids" in cols:
        return ROUTING
    if "context_tokens" in cols:
        return REQUESTS
    if "kv_lengths" in cols:
        return DECODE_BATCHES
    raise TraceSchemaError(
        f"{source}: cannot tell the trace kind from columns {sorted(cols)}; expected an 'expert_ids' "
        "(routing), 'context_tokens' (requests) or 'kv_lengths' (decode batches) column"
    )


def _int_meta(meta: dict[str, str], key: str, source: str) -> int | None:
    if key not in meta:
        return None
    text = meta[key]
    if not re.fullmatch(r"\s*\d+\s*", text) or int(text) <= 0:
        raise TraceSchemaError(f"{source}: metadata {key!r} = {text!r} is not a positive integer")
    return int(text)


def trace_info(
    schema: pa.Schema,
    source: str | Path,
    *,
    kind: str | None = None,
    num_experts: int | None = None,
    model: str | None = None,
    top_k: int | None = None,
) -> TraceInfo:
    """Check a file schema's version/kind metadata and resolve the routing shape.

    Parameters
    ----------
    schema : pyarrow.Schema
        The schema as stored in the file (possibly foreign, without ``stepsim.*`` metadata).
    source : str or Path
        File name for error messages.
    kind : str, optional
        Kind forced by the reader (npz/npy/csv readers know it); else taken from metadata or columns.
    num_experts, model : optional
        Caller-supplied routing metadata; used when the file has none, and must agree when it has.
    top_k : int, optional
        Row length seen by a reader (e.g. the ``.npz`` array width), checked against the model's top_k.

    Raises
    ------
    TraceSchemaError
        Unknown schema version or kind, metadata that is not a number, a conflict between the file's and the
        caller's ``num_experts``/``model``, or no way to know ``num_experts`` for a routing trace.
    """
    source = str(source)
    meta = decode_metadata(schema)
    version = meta.pop(VERSION_KEY, None)
    if version is not None and version not in SUPPORTED_VERSIONS:
        raise TraceSchemaError(
            f"{source}: unknown schema version {version!r} (metadata {VERSION_KEY}); this stepsim reads "
            f"version(s) {', '.join(sorted(SUPPORTED_VERSIONS))}"
        )
    file_kind = meta.pop(KIND_KEY, None)
    if file_kind is not None and file_kind not in KINDS:
        raise TraceSchemaError(
            f"{source}: unknown trace kind {file_kind!r} (metadata {KIND_KEY}); expected one of {', '.join(KINDS)}"
        )
    if kind and file_kind and kind != file_kind:
        raise TraceSchemaError(f"{source}: file holds a {file_kind!r} trace, not {kind!r}")
    kind = kind or file_kind or infer_kind(schema.names, source)
    # pandas/Arrow bookkeeping keys are not ours to carry over
    meta = {k: v for k, v in meta.items() if not k.startswith(("ARROW:", "pandas"))}
    if kind != ROUTING:
        return TraceInfo(kind=kind, source=source, metadata=meta)

    if model:
        if MODEL_KEY in meta and not same_model(meta[MODEL_KEY], model):
            raise TraceSchemaError(f"{source}: metadata model {meta[MODEL_KEY]!r} conflicts with model {model!r}")
        meta.setdefault(MODEL_KEY, model)
    file_e = _int_meta(meta, NUM_EXPERTS_KEY, source)
    file_k = _int_meta(meta, TOP_K_KEY, source)
    shape = model_shape(meta.get(MODEL_KEY))
    if num_experts is not None:
        if num_experts <= 0:
            raise TraceSchemaError(f"{source}: num_experts must be positive, got {num_experts}")
        if file_e is not None and file_e != num_experts:
            raise TraceSchemaError(
                f"{source}: metadata num_experts = {file_e} conflicts with num_experts = {num_experts}"
            )
        file_e = num_experts
    if file_e is None and shape is not None:
        file_e = shape[0]
    if file_e is None:
        raise TraceSchemaError(
            f"{source}: missing metadata 'num_experts' (routing traces need it to check expert ids); pass "
            f"num_experts (CLI --num-experts) or a known model ({', '.join(sorted(KNOWN_MODELS))})"
        )
    if shape is not None and shape[0] != file_e:
        if num_experts is not None:  # the caller's model does not match the model the trace was recorded for
            raise TraceSchemaError(
                f"{source}: this routing trace is for {meta[MODEL_KEY]!r} ({shape[0]} experts), but the run's "
                f"model has {num_experts} experts; pass --model {meta[MODEL_KEY]} (or a trace of your model)"
            )
        raise TraceSchemaError(
            f"{source}: num_experts = {file_e} conflicts with model {meta[MODEL_KEY]!r} ({shape[0]} experts)"
        )
    # the row length the data really has: a fixed-size list's size, else what the reader saw, else metadata
    data_k = top_k
    if "expert_ids" in schema.names:
        t = schema.field("expert_ids").type
        if pa.types.is_fixed_size_list(t):
            data_k = t.list_size
    expect_k = file_k if file_k is not None else (shape[1] if shape is not None else None)
    if data_k is not None and expect_k is not None and data_k != expect_k:
        what = f"model {meta[MODEL_KEY]!r}" if file_k is None else "metadata top_k"
        raise TraceSchemaError(
            f"{source}: column 'expert_ids' has rows of length {data_k}, but {what} says top_k = {expect_k}"
        )
    k = expect_k if expect_k is not None else data_k
    if k is None:
        raise TraceSchemaError(
            f"{source}: missing metadata 'top_k' and column 'expert_ids' is variable-length; cannot tell top_k"
        )
    meta[NUM_EXPERTS_KEY] = str(file_e)
    meta[TOP_K_KEY] = str(k)
    return TraceInfo(
        kind=ROUTING,
        source=source,
        metadata=meta,
        num_experts=file_e,
        top_k=k,
        gate_weights="gate_weights" in schema.names,
    )
