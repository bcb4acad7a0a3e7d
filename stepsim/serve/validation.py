"""Serving validation (docs/validation.md, ``stepsim reproduce serving-validation``): stepsim's predicted decode
speed of one request on SN40L sockets beside every per-model serving figure SambaNova has published for a
shipping SN40L system, and beside the HBM roofline of the same sockets.

Each published figure is output tokens per second per user (the inverse of the time per output token) at
batch 1 as far as a public API measures it. stepsim predicts it by serving one request (prompt
:data:`PROMPT_TOKENS`, :data:`OUTPUT_TOKENS` outputs) with ``--fidelity exact --schedule auto`` on ``sn40l-N``
(N SN40L sockets on a ring, tensor parallelism: :mod:`stepsim.serve.system`): tokens/s = 1 / TPOT p50. The
roofline is the bytes one decode token must read (:func:`stepsim.mapping.roofline.decode_token_bytes`) at N x
1.6 TB/s. A published KV length near 1,000 tokens instead of 128 moves the bytes a token reads by under 0.3 %
(Llama-3.1-70B: 0.3 GB of KV against 141 GB of weights).

The published figures do not state how many sockets served them; the ratio is taken at :data:`HEADLINE_SOCKETS`
(a SambaRack SN40L-16, the system SambaNova's DAC 2025 talk names for DeepSeek-R1) and the rows at 8 sockets (one
node) are given beside it. A model whose weights do not fit the sockets' HBM is a row saying so. These are vendor
figures, measured by artificialanalysis.ai on SambaNova's cloud, not a controlled experiment: the validation says
how far stepsim's model of the chip is from a shipping system, not which is right.

DeepSeek-R1 (DeepSeek-V3's shape) is served layer group by layer group (docs/serving.md §9.1: MLA absorbed, the
3 dense layers by tensor parallelism, the 58 MoE layers by expert parallelism, group-limited routing). In bf16 its
1.34 TB need 83.88 GB a socket on 16 sockets, more than an SN40L's 64 GiB of HBM; SambaNova holds such a model in
the socket's DDR tier, which stepsim does not model, so its rows give each socket :data:`STAND_IN_HBM_GIB` GiB read
at HBM bandwidth (``examples/hardware_sn40l_hbm96.toml``; optimistic for the bytes that would sit in DDR). Its
expert-parallel MoE block is mapped chip by chip (:mod:`stepsim.mapping.expert_parallel`), as every row's layers
are mapped (until 2026-11-26 it ran the paper's schedule: 32.121 ms a token, 11.2x its roofline).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

#: the request stepsim serves for each row (tokens)
PROMPT_TOKENS, OUTPUT_TOKENS = 128, 16
#: sockets each model is predicted on; the ratio's
SOCKETS, HEADLINE_SOCKETS = (8, 16), 16
HBM_BYTES_PER_S = 1.6e12  # one SN40L socket (docs/hardware.md)
#: HBM a socket of the DeepSeek-R1 rows (GiB): a stand-in for SambaNova's DDR tier (module docstring)
STAND_IN_HBM_GIB = 96
#: the note of a row served on the stand-in, and of one refused even with it
STAND_IN = (f"{STAND_IN_HBM_GIB} GiB a socket standing in for SambaNova's DDR tier, every byte at HBM bandwidth "
            "(optimistic)")
STAND_IN_REFUSED = f"even with {STAND_IN_HBM_GIB} GiB a socket, the stand-in for SambaNova's DDR tier"

BLOG = ("SambaNova blog, \"Why SambaNova's SN40L Chip is The Best for Inference\", 2024-09-10, Table 1 (16-bit; "
        "measured by artificialanalysis.ai), https://sambanova.ai/blog/sn40l-chip-best-inference-solution")
DAC = ("DAC 2025 talk \"SambaNova SN40L: Unleashing Agentic AI with Dataflow\" (\"a single rack of 16 SN40L RDUs "
       "serves DeepSeek-R1 671B at 198 tokens/s\"), https://62dac.conference-program.com/presentation/"
       "?id=SSSN027&sess=sess258")


@dataclass(frozen=True)
class Published:
    """One published serving figure.

    Attributes
    ----------
    model : str
        A model preset, or a config in ``stepsim/data/validation`` (published ``config.json`` values).
    tokens_per_s : float
        Output tokens per second per user.
    sockets : int or None
        Sockets that served it, when the source says.
    source : str
    not_modelled : str or None
        Why stepsim cannot predict it yet (None: it can).
    schedule : str
        The serve run's ``--schedule``.
    hbm_gib : int or None
        HBM a socket (GiB) instead of the SN40L's 64 (a stand-in: :data:`STAND_IN`), None: the SN40L's.
    """

    model: str
    tokens_per_s: float
    sockets: int | None
    source: str
    not_modelled: str | None = None
    schedule: str = "auto"
    hbm_gib: int | None = None

    def hardware(self):
        """The sockets' hardware: ``sn40l``, with :attr:`hbm_gib` of HBM when set."""
        from stepsim.base.hardware import Hardware

        return Hardware.preset("sn40l", **({} if self.hbm_gib is None else
                                           {"hbm_capacity_bytes": self.hbm_gib * 2**30}))


FIGURES = (
    Published("llama-3.1-8b", 1042, None, BLOG),
    Published("llama-3.1-70b", 457, None, BLOG),
    Published("llama-3.1-405b", 129, None, BLOG),
    Published("deepseek-r1", 198, 16, DAC, hbm_gib=STAND_IN_HBM_GIB),
)


@dataclass(frozen=True)
class Row:
    """One (figure, sockets) comparison; ``tpot_s`` and the ratios are None where stepsim has no prediction."""

    model: str
    published_tokens_per_s: float
    published_sockets: int | None
    sockets: int
    tpot_s: float | None
    tokens_per_s: float | None
    roofline_tokens_per_s: float | None
    ratio: float | None  # stepsim's tokens/s over the published
    roofline_ratio: float | None  # the roofline's tokens/s over the published
    tpot_over_roofline: float | None  # stepsim's TPOT over the roofline's (how near the bound stepsim is)
    note: str
    source: str


def model_argument(name: str) -> str:
    """What :func:`stepsim.serve` takes for ``name``: a preset's name or alias (``deepseek-r1``), or the path of a
    validation config."""
    from stepsim.models.presets import PRESETS, canonical_model_name

    if canonical_model_name(name) in PRESETS:
        return name
    return str(resources.files("stepsim") / "data" / "validation" / f"{name}.json")


def predict(figure: Published, sockets: int, requests: Path, progress=None, run=None) -> Row:
    """The row of ``figure`` on ``sockets`` SN40L sockets (module docstring); ``requests``: the one-request file.
    ``run``: that serve run's result made before (:func:`serve_row`), instead of serving it here."""
    from stepsim.base.errors import ConfigError
    from stepsim.mapping.roofline import decode_token_bytes
    from stepsim.models.presets import resolve_model
    from stepsim.serve.memory import model_memory

    common = dict(model=figure.model, published_tokens_per_s=figure.tokens_per_s, published_sockets=figure.sockets,
                  sockets=sockets, source=figure.source)
    if figure.not_modelled:
        return Row(**common, tpot_s=None, tokens_per_s=None, roofline_tokens_per_s=None, ratio=None,
                   roofline_ratio=None, tpot_over_roofline=None, note=figure.not_modelled)
    argument = model_argument(figure.model)
    model = resolve_model(argument)
    roofline = sockets * HBM_BYTES_PER_S / decode_token_bytes(model, model_memory(model).vocab_size)
    if progress is not None and run is None:
        progress(f"{figure.model} on {sockets} sockets")
    stand_in = "" if figure.hbm_gib is None else STAND_IN
    try:
        result = serve_row(figure, sockets, requests) if run is None else run
    except ConfigError as exc:  # the weights do not fit these sockets
        note = str(exc) + (f" ({STAND_IN_REFUSED})" if stand_in else "")
        return Row(**common, tpot_s=None, tokens_per_s=None, roofline_tokens_per_s=roofline, ratio=None,
                   roofline_ratio=roofline / figure.tokens_per_s, tpot_over_roofline=None, note=note)
    tpot = result.summary["tpot_s"]["p50"]
    return Row(**common, tpot_s=tpot, tokens_per_s=1 / tpot, roofline_tokens_per_s=roofline,
               ratio=1 / tpot / figure.tokens_per_s, roofline_ratio=roofline / figure.tokens_per_s,
               tpot_over_roofline=tpot * roofline, note=stand_in)


def serve_row(figure: Published, sockets: int, requests: Path, out: Path | None = None):
    """The serve run behind a row: ``requests`` with ``--fidelity exact`` and the figure's schedule and hardware on
    ``sn40l-N`` (:class:`stepsim.serve.ServeResult`; ``out``: its folder, if it is to be kept).

    Raises
    ------
    ConfigError
        The model's weights do not fit the sockets.
    """
    from stepsim.serve.api import serve

    return serve(model_argument(figure.model), requests, fidelity="exact", schedule=figure.schedule,
                 hardware=figure.hardware() if figure.hbm_gib is not None else None, system=f"sn40l-{sockets}",
                 out=out)


def request_table():
    """The one request every row serves (:data:`PROMPT_TOKENS`, :data:`OUTPUT_TOKENS`), as an Arrow table."""
    import pyarrow as pa

    return pa.table({"arrival_s": [0.0], "prompt_tokens": [PROMPT_TOKENS], "output_tokens": [OUTPUT_TOKENS]})


def validate(folder: Path, progress=None, runs: dict | None = None) -> list[Row]:
    """Every (figure, sockets) row, in :data:`FIGURES` then :data:`SOCKETS` order; ``folder`` holds the request
    file. ``runs``: ``{(model, sockets): serve result}`` of rows served before (a test's stored runs), the others
    served here."""
    import pyarrow.parquet as pq

    runs = runs or {}
    requests = Path(folder) / "one_request.parquet"
    pq.write_table(request_table(), requests)
    try:
        return [predict(figure, sockets, requests, progress, runs.get((figure.model, sockets)))
                for figure in FIGURES for sockets in SOCKETS]
    finally:
        requests.unlink()


def median_ratio_error(rows: list[Row]) -> float:
    """The median of ``|stepsim's tokens/s / published - 1|`` over the rows at :data:`HEADLINE_SOCKETS` that have a
    prediction (the README's headline)."""
    return statistics.median(abs(r.ratio - 1) for r in rows if r.sockets == HEADLINE_SOCKETS and r.ratio is not None)


def _number(value, digits: int) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def markdown(rows: list[Row]) -> str:
    """The table of docs/validation.md and its headline line."""
    lines = ["| model | published tokens/s/user | sockets | stepsim TPOT (ms) | stepsim tokens/s | HBM roofline "
             "tokens/s | stepsim / published | roofline / published | stepsim TPOT / roofline's | note |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        tpot = None if r.tpot_s is None else r.tpot_s * 1e3
        note = r.note.replace("|", "/")
        lines.append(f"| {r.model} | {_number(r.published_tokens_per_s, 0)} | {r.sockets} | {_number(tpot, 3)} | "
                     f"{_number(r.tokens_per_s, 0)} | {_number(r.roofline_tokens_per_s, 0)} | "
                     f"{_number(r.ratio, 2)} | {_number(r.roofline_ratio, 2)} | {_number(r.tpot_over_roofline, 2)} | "
                     f"{note} |")
    lines += ["", f"Median absolute ratio error at {HEADLINE_SOCKETS} sockets: "
                  f"{median_ratio_error(rows) * 100:.0f} % (stepsim's tokens/s against the published)."]
    return "\n".join(lines) + "\n"


def table(rows: list[Row]):
    """The rows as an Arrow table (units in the field metadata)."""
    import pyarrow as pa

    units = {"published_tokens_per_s": "tokens/s", "tpot_s": "s", "tokens_per_s": "tokens/s",
             "roofline_tokens_per_s": "tokens/s", "ratio": "ratio", "roofline_ratio": "ratio",
             "tpot_over_roofline": "ratio"}
    types = {"model": pa.string(), "published_tokens_per_s": pa.float64(), "published_sockets": pa.int64(),
             "sockets": pa.int64(), "tpot_s": pa.float64(), "tokens_per_s": pa.float64(),
             "roofline_tokens_per_s": pa.float64(), "ratio": pa.float64(), "roofline_ratio": pa.float64(),
             "tpot_over_roofline": pa.float64(), "note": pa.string(), "source": pa.string()}
    schema = pa.schema([pa.field(name, kind, metadata={"unit": units[name]} if name in units else None)
                        for name, kind in types.items()])
    return pa.table({name: [getattr(r, name) for r in rows] for name in types}, schema=schema)


def write(rows: list[Row], out: Path) -> dict[str, Path]:
    """``serving_validation.parquet`` and ``serving_validation.md`` in ``out``, published together."""
    import pyarrow.parquet as pq

    from stepsim.base.files import atomic_output, published_together

    out.mkdir(parents=True, exist_ok=True)
    files = {"table": out / "serving_validation.parquet", "markdown": out / "serving_validation.md"}
    with published_together():
        with atomic_output(files["table"]) as tmp:
            pq.write_table(table(rows), tmp)
        with atomic_output(files["markdown"]) as tmp:
            tmp.write_text(markdown(rows), encoding="utf-8")
    return files
