"""Find the traces an experiment needs in a folder laid out like ``../shared/traces``.

Layout (every batch size found is used)::

    <traces>/expert_routing/<mixtral|qwen>_b<B>/<iteration>_<layer>.npz   routing of one batch of B tokens
    <traces>/kv_lengths/b<B>/<trace>_stdev<SSSS>_<start>_<end>.npy        KV lengths of B consecutive requests

Routing folders map to the model presets ``mixtral-8x7b`` and ``qwen3-30b-a3b``; other folder names are
ignored. Every ``.npz`` of a routing folder is one experiment point (the shared folder has one per model).

KV windows are grouped into the paper's variance classes ``high`` / ``med`` / ``low``:

* for B = 16, 64, 80 the classes are the paper's own windows (docs/semantics.md §5.5,
  :data:`stepsim.trace_io.batches.PAPER_WINDOWS`); the windows present in the folder are used, other files of
  the folder are ignored, and every class needs at least one window;
* for any other B the paper names no windows, so the folder's windows, sorted by the sample stdev of their
  contents (not the label in the name), are split into thirds: with n windows sorted by stdev, highest
  first, window i (0-based) is ``high`` / ``med`` / ``low`` for ``3*i // n`` = 0 / 1 / 2 (4 windows: high,
  high, med, low); at least 3 windows are needed.

Every problem raises :class:`~stepsim.reproduce.errors.TracesLayoutError` naming the offending path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stepsim.base.errors import TraceError
from stepsim.reproduce.errors import TracesLayoutError
from stepsim.trace_io.batches import PAPER_WINDOWS
from stepsim.trace_io.readers import parse_kv_name

#: routing folder prefix -> model preset (the artifact's folder names)
FOLDER_MODELS = {"mixtral": "mixtral-8x7b", "qwen": "qwen3-30b-a3b"}
#: order of the models in tables and figures
MODEL_ORDER = ("mixtral-8x7b", "qwen3-30b-a3b")
#: variance classes, in the paper's order
VARIANCE_CLASSES = ("high", "med", "low")
ROUTING_DIR = "expert_routing"
KV_DIR = "kv_lengths"
#: the trace the paper's KV windows come from (the Azure conversation trace)
PAPER_KV_TRACE = "conv"

_ROUTING_FOLDER = re.compile(r"^(?P<prefix>[a-z0-9]+)_b(?P<batch>[1-9][0-9]*)$")
_KV_FOLDER = re.compile(r"^b(?P<batch>[1-9][0-9]*)$")
_LAYOUT_HINT = (f"expected {ROUTING_DIR}/<mixtral|qwen>_b<B>/*.npz and "
                f"{KV_DIR}/b<B>/<trace>_stdev<SSSS>_<start>_<end>.npy, as in ../shared/traces")


@dataclass(frozen=True)
class RoutingFile:
    """One routing batch: ``model`` preset, ``batch`` tokens, and its ``.npz`` file."""

    model: str
    batch: int
    path: Path

    @property
    def name(self) -> str:
        """``<folder>/<file>``, e.g. ``qwen_b64/032_012.npz`` (how tables name the trace)."""
        return f"{self.path.parent.name}/{self.path.name}"


@dataclass(frozen=True)
class KVWindowFile:
    """One decode batch: ``batch`` requests ``start..end`` (1-based) in variance class ``variance``."""

    batch: int
    variance: str
    start: int
    end: int
    path: Path

    @property
    def name(self) -> str:
        """``b<B>/<file>``, e.g. ``b16/conv_stdev0987_3349_3364.npy``."""
        return f"{self.path.parent.name}/{self.path.name}"


def _root(traces: str | Path) -> Path:
    root = Path(traces)
    if not root.is_dir():
        raise TracesLayoutError(f"{root}: traces folder not found ({_LAYOUT_HINT})")
    return root


def _subdir(root: Path, name: str) -> Path:
    folder = root / name
    if not folder.is_dir():
        raise TracesLayoutError(f"{folder}: folder not found in the traces folder {root} ({_LAYOUT_HINT})")
    return folder


def _rows(path: Path, what: str) -> int:
    """Leading dimension of the array in ``path`` (tokens of a routing batch, requests of a KV window).

    Read with the trace readers' checks (a text or corrupt file, an object array, a missing ``data`` array, a
    wrong rank are each one clear line naming the file), before any simulation starts."""
    from stepsim.trace_io.readers import load_numpy_file, npz_routing_matrix

    try:
        if path.suffix == ".npz":
            return int(npz_routing_matrix(path).shape[0])
        array = load_numpy_file(path, lambda: np.load(path, allow_pickle=False, mmap_mode="r"))
        if array.ndim != 1:
            raise TracesLayoutError(f"{path}: the {what} has shape {list(array.shape)}, expected one value per request")
        return int(array.shape[0])
    except TraceError as exc:
        raise TracesLayoutError(str(exc)) from exc


def _routing_folder(sub: Path) -> tuple[str, int] | None:
    """``(model, batch)`` of a ``<prefix>_b<B>`` routing folder of a model the paper ran, else None."""
    m = _ROUTING_FOLDER.match(sub.name)
    if not m or m.group("prefix") not in FOLDER_MODELS:
        return None
    return FOLDER_MODELS[m.group("prefix")], int(m.group("batch"))


def _kv_folder(sub: Path) -> int | None:
    """The batch size of a ``b<B>`` folder of KV-length windows, else None."""
    m = _KV_FOLDER.match(sub.name)
    return int(m.group("batch")) if m else None


def skipped_folders(traces: str | Path) -> list[tuple[Path, str]]:
    """The sub-folders of ``expert_routing/`` and ``kv_lengths/`` that no experiment reads, with the reason
    (so a ``llama_b64/`` beside ``mixtral_b64/`` is reported, not silently ignored)."""
    root = Path(traces)
    skipped = []
    routing, kv = root / ROUTING_DIR, root / KV_DIR
    if routing.is_dir():
        known = ", ".join(f"{prefix}_b<B>" for prefix in FOLDER_MODELS)
        for sub in sorted(p for p in routing.iterdir() if p.is_dir()):
            if _routing_folder(sub) is None:
                skipped.append((sub, f"not a routing folder of a model the paper ran ({known})"))
    if kv.is_dir():
        for sub in sorted(p for p in kv.iterdir() if p.is_dir()):
            if _kv_folder(sub) is None:
                skipped.append((sub, "not a b<B> folder of KV-length windows"))
    return skipped


def routing_files(traces: str | Path, models: tuple[str, ...] = MODEL_ORDER) -> list[RoutingFile]:
    """Every routing batch of the given models, ordered by model, batch size, then file name.

    Raises
    ------
    TracesLayoutError
        No ``expert_routing`` folder, no folder for any of ``models``, a model folder without ``.npz``
        files, or a file whose batch differs from its folder's ``b<B>``.
    """
    folder = _subdir(_root(traces), ROUTING_DIR)
    found = []
    for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
        found_folder = _routing_folder(sub)
        if found_folder is None or found_folder[0] not in models:
            continue
        model, batch = found_folder
        files = sorted(sub.glob("*.npz"))
        if not files:
            raise TracesLayoutError(f"{sub}: no .npz routing files ({_LAYOUT_HINT})")
        for path in files:
            rows = _rows(path, "routing array 'data'")
            if rows != batch:
                raise TracesLayoutError(f"{path}: holds {rows} tokens but its folder says b{batch}")
            found.append(RoutingFile(model, batch, path))
    if not found:
        wanted = ", ".join(f"{p}_b<B>" for p, mdl in FOLDER_MODELS.items() if mdl in models)
        raise TracesLayoutError(f"{folder}: no routing folder for {wanted} ({_LAYOUT_HINT})")
    return sorted(found, key=lambda f: (MODEL_ORDER.index(f.model), f.batch, f.path.name))


def _stdev(path: Path) -> float:
    """Sample standard deviation (ddof=1, tokens) of the KV lengths in ``path`` (0 for a single request)."""
    try:
        kv = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise TracesLayoutError(f"{path}: cannot read the KV-length array: {exc}") from exc
    return float(np.std(kv.astype(np.float64), ddof=1)) if kv.size > 1 else 0.0


def _parsed_windows(folder: Path, batch: int) -> list[tuple[dict, Path]]:
    out = []
    for path in sorted(folder.glob("*.npy")):
        parsed = parse_kv_name(path.name)
        if parsed is None or parsed["end"] - parsed["start"] + 1 != batch:
            continue  # not a window file of this batch size (a stray file): ignored
        out.append((parsed, path))
    return out


def _classify(folder: Path, batch: int) -> list[KVWindowFile]:
    """The windows of one ``b<B>`` folder with their variance class (see the module docstring)."""
    parsed = _parsed_windows(folder, batch)
    chosen = []
    if batch in PAPER_WINDOWS:
        by_range = {(p["start"], p["end"]): path for p, path in parsed if p["trace"] == PAPER_KV_TRACE}
        for variance in VARIANCE_CLASSES:
            windows = PAPER_WINDOWS[batch][variance]
            present = [(s, e) for s, e, _ in windows if (s, e) in by_range]
            if not present:
                names = ", ".join(f"{PAPER_KV_TRACE}_stdev{lbl:04d}_{s:04d}_{e:04d}.npy" for s, e, lbl in windows)
                raise TracesLayoutError(f"{folder}: no window of the paper's {variance!r} KV-length variance class "
                                        f"for batch {batch} (expected one of {names})")
            chosen += [KVWindowFile(batch, variance, s, e, by_range[(s, e)]) for s, e in present]
    else:
        if len(parsed) < 3:
            raise TracesLayoutError(f"{folder}: batch {batch} has no paper windows, and splitting windows into "
                                    f"high/med/low variance needs at least 3 <trace>_stdev<SSSS>_<start>_<end>.npy "
                                    f"files of {batch} requests, found {len(parsed)}")
        # by the stdev of the contents (the label in a name can be off: two shared B=64 files are)
        ordered = sorted(parsed, key=lambda item: (_stdev(item[1]), item[0]["start"], item[1].name))
        n = len(ordered)
        for i, (p, path) in enumerate(reversed(ordered)):  # highest stdev first, like the paper's lists
            chosen.append(KVWindowFile(batch, VARIANCE_CLASSES[min(2, 3 * i // n)], p["start"], p["end"], path))
    for w in chosen:
        rows = _rows(w.path, "KV-length array")
        if rows != batch:
            raise TracesLayoutError(f"{w.path}: holds {rows} KV lengths but its name says {batch} requests")
    return chosen


def kv_windows(traces: str | Path) -> list[KVWindowFile]:
    """Every KV window to simulate, ordered by batch size, then variance class (high, med, low), then the
    paper's order within a class (by stdev, highest first, for batch sizes the paper does not list).

    Raises
    ------
    TracesLayoutError
        No ``kv_lengths`` folder, no ``b<B>`` folder in it, or a ``b<B>`` folder without usable windows.
    """
    folder = _subdir(_root(traces), KV_DIR)
    subs = [(batch, p) for p in sorted(folder.iterdir()) if p.is_dir() and (batch := _kv_folder(p)) is not None]
    if not subs:
        raise TracesLayoutError(f"{folder}: no b<B> folder of KV-length windows ({_LAYOUT_HINT})")
    out = []
    for batch, sub in sorted(subs):
        out += _classify(sub, batch)
    return out
