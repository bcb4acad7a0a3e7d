"""Write simulation results as Parquet, atomically, with provenance and units; read them back.

* :func:`write_parquet_atomic` writes to a hidden temp file in the destination folder, fsyncs it and
  ``os.replace``-s it over the target, so readers never see a half-written file and an interrupted write
  leaves nothing behind (the temp file is removed; a previous version of the target stays intact).
* Provenance (stepsim version, config hash, trace hash, seed) goes into the schema metadata under
  ``stepsim.*`` keys; units go into field metadata (``{"unit": "cycles"}``).
* :func:`write_partitioned` files one result row (or a few rows of one configuration) under a hive-style
  folder ``root/model=<m>/tiling=<t>/part-<config hash>.parquet``; :func:`read_results` reads the whole tree
  back with pyarrow.dataset. Re-running the same configuration overwrites the same file, so sweeps are
  idempotent.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from pathlib import Path
from urllib.parse import quote

import numpy as np

from stepsim._version import __version__
from stepsim.base.errors import ConfigError, OutputError, os_reason
from stepsim.base.lazy_import import LazyModule

# pyarrow is imported when a table is first written or read (a command that only prints imports none of it)
pa, ds, pq = LazyModule("pyarrow"), LazyModule("pyarrow.dataset"), LazyModule("pyarrow.parquet")

VERSION_KEY = "stepsim.version"
CONFIG_HASH_KEY = "stepsim.config_hash"
CONFIG_KEY = "stepsim.config"
TRACE_HASH_KEY = "stepsim.trace_hash"
SEED_KEY = "stepsim.seed"

# os.umask can only be read by setting it; do it once at import, not around every write (not thread-safe)
_UMASK = os.umask(0)
os.umask(_UMASK)


# --- hashing --------------------------------------------------------------------------------------------
def _jsonable(obj):
    """``json.dumps`` fallback: numpy scalars/arrays, paths, dataclasses, sets (sorted), bytes (hex)."""
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, os.PathLike):
        return Path(obj).as_posix()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=canonical_json)
    if isinstance(obj, bytes):
        return obj.hex()
    raise ConfigError(f"cannot hash a value of type {type(obj).__name__}: {obj!r}")


def canonical_json(obj) -> str:
    """Canonical JSON text of ``obj``: sorted keys, no whitespace, ASCII only, NaN refused.

    Raises
    ------
    ConfigError
        ``obj`` holds a value JSON cannot represent (or NaN/inf, whose JSON spelling is not standard).
    """
    try:
        return json.dumps(
            obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False, default=_jsonable
        )
    except ValueError as exc:
        raise ConfigError(f"cannot hash {obj!r}: {exc}") from exc


def stable_hash(obj) -> str:
    """SHA-256 (hex) of the canonical JSON of ``obj``; equal for equal configs across runs and machines."""
    return hashlib.sha256(canonical_json(obj).encode("ascii")).hexdigest()


def file_sha256(path: str | Path, chunk_bytes: int = 1 << 20) -> str:
    """SHA-256 (hex) of a file's bytes, read in ``chunk_bytes`` chunks (bounded memory). A named pipe or a device
    is refused (ConfigError) rather than read: its bytes might never end."""
    refuse_special_file(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk_bytes):
            h.update(block)
    return h.hexdigest()


# --- free text in file names and TOML ---------------------------------------------------------------------
#: characters a file name made from free text keeps (everything else becomes "_")
_SAFE_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._+-")
#: the longest stem :func:`safe_stem` returns (file systems allow 255 bytes; room for a suffix and a hash)
MAX_STEM = 100


def safe_stem(text: str) -> str:
    """A file-name stem made from free text (a system's or model's ``name``): one path component that stays in
    its folder. Letters, digits and ``._+-`` are kept, every other character (``/``, ``\\``, quotes, spaces,
    control characters) becomes ``_``, leading dots and dashes are dropped (no ``..``, no hidden file, no name
    read as a flag), and the stem is at most :data:`MAX_STEM` characters. A name that had to change gets 8 hex of its hash appended, so two different names
    never share a file.

    >>> safe_stem("ring-8"), safe_stem("../../etc/x")
    ('ring-8', 'etc_x-56da1a2e')
    """
    text = str(text)
    clean = "".join(c if c in _SAFE_CHARS else "_" for c in text).lstrip("._-")[:MAX_STEM] or "unnamed"
    if clean == text:
        return clean
    return f"{clean}-{hashlib.sha256(text.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}"


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string, quotes included: backslash, double quote and control characters escaped
    (``\\uXXXX``), so any name or path written into a TOML file reads back as the same text.

    >>> print(toml_string('say "hi"'))
    "say \\"hi\\""
    """
    out = []
    for c in str(text):
        if c in '"\\':
            out.append("\\" + c)
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


# --- special files ----------------------------------------------------------------------------------------
def special_file(path: str | os.PathLike) -> str | None:
    """What ``path`` is when it exists and is neither a regular file nor a folder (symbolic links followed):
    ``"a named pipe"``, ``"a character device"`` (``/dev/zero``), ``"a block device"``, ``"a socket"``; else None.
    Reading such a file can wait forever (a pipe nobody writes) or never end (``/dev/zero``)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    for test, kind in ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "a special file"


def refuse_special_file(path: str | os.PathLike, error: type[Exception] = ConfigError, what: str = "an input") -> None:
    """Raise ``error`` (one line naming ``path``) when ``path`` is a :func:`special_file`: every input stepsim
    reads (traces, request files, system / hardware / sweep / space / depths files) is a regular file or a folder,
    checked before it is opened (opening a pipe without a writer already blocks)."""
    kind = special_file(path)
    if kind is not None:
        raise error(f"{os.fspath(path)}: is {kind}, not a regular file; give {what} file (reading it could wait "
                    f"forever)")


# --- metadata -------------------------------------------------------------------------------------------
def provenance_metadata(
    config=None, trace: str | Path | None = None, seed: int | None = None, trace_hash: str | None = None
) -> dict[str, str]:
    """Provenance schema metadata: stepsim version, config (canonical JSON) and its hash, trace hash, seed.

    Parameters
    ----------
    config : JSON-able, optional
        The run configuration; stored as canonical JSON with its :func:`stable_hash`.
    trace : str or Path, optional
        Trace file read by the run; its :func:`file_sha256` is stored (unless ``trace_hash`` is given).
    seed : int, optional
        Random seed of the run.
    trace_hash : str, optional
        Precomputed trace hash.
    """
    meta = {VERSION_KEY: __version__}
    if config is not None:
        meta[CONFIG_KEY] = canonical_json(config)
        meta[CONFIG_HASH_KEY] = stable_hash(config)
    if trace_hash is None and trace is not None:
        trace_hash = file_sha256(trace)
    if trace_hash is not None:
        meta[TRACE_HASH_KEY] = trace_hash
    if seed is not None:
        meta[SEED_KEY] = str(int(seed))
    return meta


def with_units(table: pa.Table, units: Mapping[str, str]) -> pa.Table:
    """Return ``table`` with ``{"unit": ...}`` field metadata on the named columns.

    Raises
    ------
    ConfigError
        A named column does not exist.
    """
    missing = [c for c in units if c not in table.schema.names]
    if missing:
        raise ConfigError(f"units given for unknown column(s) {', '.join(missing)}")
    fields = []
    for f in table.schema:
        if f.name in units:
            meta = dict(f.metadata or {})
            meta[b"unit"] = units[f.name].encode()
            f = f.with_metadata(meta)
        fields.append(f)
    return table.cast(pa.schema(fields, metadata=table.schema.metadata))


def _merge_metadata(schema: pa.Schema, metadata: Mapping[str, str] | None) -> dict[bytes, bytes]:
    meta = dict(schema.metadata or {})
    for k, v in sorted((metadata or {}).items()):
        meta[str(k).encode()] = str(v).encode()
    return meta


# --- atomic writes --------------------------------------------------------------------------------------
def _fsync_dir(folder: Path) -> None:
    # make the rename itself durable; not possible on every OS/filesystem, and then not needed
    with suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


#: the renames an enclosing :func:`published_together` defers (None: each file is renamed when written)
_PENDING: ContextVar[list | None] = ContextVar("stepsim_pending_renames", default=None)


def _is_write_error(exc: OSError, tmp: Path | None) -> bool:
    """Whether ``exc`` came from writing the output (pyarrow's and matplotlib's errors name no file; Python's
    name the temp file) rather than from reading an input inside the ``with`` block (a trace being copied)."""
    return exc.filename is None or tmp is None or Path(exc.filename) in (tmp, tmp.parent)


@contextmanager
def atomic_output(path: str | Path) -> Iterator[Path]:
    """Context manager: yield a temp path beside ``path``; on success fsync it and rename it to ``path``.

    The temp file is hidden (``.<name>.<random>.tmp``) so dataset discovery skips it. On any exception
    (including KeyboardInterrupt) the temp file is deleted and ``path`` is left as it was. An OSError of the
    write (a full disk, a read-only folder, no permission) becomes :class:`~stepsim.base.errors.OutputError`, one line
    naming ``path`` and the OS's reason, so every writer of stepsim reports it the same way. SIGINT / SIGTERM are
    blocked while the temp file is created and named, so a signal cannot arrive between ``mkstemp`` creating the
    file and this function knowing its name (it would leave the file behind); a signal that came meanwhile is
    delivered as soon as they are unblocked, inside the ``try`` that removes the file. Inside
    :func:`published_together` the rename waits until every file of the group is written.
    """
    path = Path(path)
    tmp = None
    previous = _signal_mask()  # only read here: a signal before the try leaves nothing to undo
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _block_stop_signals()
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        tmp = Path(tmp_name)
        _restore_signals(previous)
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600 files; give the usual permissions
        pending = _PENDING.get()
        if pending is not None:
            pending.append((tmp, path))  # published_together renames it (or removes it) at its end
            return
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException as exc:
        if tmp is not None:
            with suppress(FileNotFoundError):
                tmp.unlink()
        if isinstance(exc, OSError) and _is_write_error(exc, tmp):
            raise OutputError(path, exc) from None
        raise
    finally:
        _restore_signals(previous)


@contextmanager
def published_together() -> Iterator[None]:
    """Context manager: the files written with :func:`atomic_output` inside appear together at the end, or
    none of them (a run's record without its channel table is an output ``stepsim report`` rejects).

    Every file is first written and fsynced under its temp name; only then are they renamed into place, with
    SIGINT / SIGTERM blocked so an interrupt cannot fall between two renames. An earlier run's files are never
    lost: before the first rename each existing target gets a hard link under a hidden backup name (a target that
    cannot be backed up, such as a folder in a file's place or a read-only folder, fails the publication before
    anything is renamed), and a rename that fails afterwards puts every earlier file back from its backup (a
    target that did not exist before is removed). So either all new files land or the earlier files stay as they
    were, and the error names the target that could not be replaced.
    """
    pending: list = []
    token = _PENDING.set(pending)
    try:
        yield
    except BaseException:
        _PENDING.reset(token)
        for tmp, _ in pending:
            if tmp is not None:
                with suppress(FileNotFoundError):
                    tmp.unlink()
        raise
    _PENDING.reset(token)
    previous = _signal_mask()
    _block_stop_signals()
    try:
        _publish(pending)
    finally:
        _restore_signals(previous)


def retire(path: str | Path) -> None:
    """Remove ``path`` (an earlier run's output this run does not write again) together with the files of the
    enclosing :func:`published_together`: it is removed only when every new file lands, and put back when a later
    rename fails. Outside a group it is removed at once. A missing ``path`` is nothing to do; a folder is refused
    (OutputError): only files a command wrote itself are retired."""
    path = Path(path)
    if not os.path.lexists(path):
        return
    if path.is_dir() and not path.is_symlink():
        raise OutputError(path, IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path)))
    pending = _PENDING.get()
    if pending is not None:
        pending.append((None, path))  # published_together removes it with the renames (tmp None: a removal)
        return
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise OutputError(path, exc) from None
    _fsync_dir(path.parent)


def _backup(path: Path) -> Path | None:
    """A hidden hard link to ``path`` beside it (None: ``path`` does not exist). Raises OSError when ``path``
    cannot be replaced by a file later (a folder) or the folder takes no new name (read-only)."""
    if not os.path.lexists(path):
        return None
    if path.is_dir() and not path.is_symlink():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    backup = Path(tempfile.mktemp(prefix=f".{path.name}.", suffix=".bak", dir=path.parent))
    try:
        os.link(path, backup, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.EXDEV):
            raise
        # a filesystem without hard links: a copy keeps the earlier bytes just as well
        shutil.copy2(path, backup, follow_symlinks=False)
    return backup


def _publish(pending: list) -> None:
    """Rename every ``(tmp, path)`` of ``pending`` into place, all or none (see :func:`published_together`)."""
    backups: list[Path | None] = []

    kept: set[Path] = set()  # backups an undo could not put back: never deleted

    def clean() -> None:
        for tmp, _ in pending:
            if tmp is not None:
                with suppress(FileNotFoundError):
                    tmp.unlink()
        for backup in backups:
            if backup is not None and backup not in kept:
                with suppress(FileNotFoundError):
                    backup.unlink()

    for tmp, path in pending:
        try:
            backups.append(_backup(path))
        except OSError as exc:
            clean()
            raise OutputError(path, exc) from None
    done = 0
    try:
        for tmp, path in pending:
            if tmp is not None:
                os.replace(tmp, path)
            elif os.path.lexists(path):  # a retired file (its backup puts it back if a later rename fails)
                os.unlink(path)
            done += 1
    except OSError as exc:
        failed = pending[done][1]
        lost = []  # what could not be undone, said in the error rather than deleted
        for (tmp, path), backup in zip(pending[:done], backups[:done]):
            if tmp is None and backup is None:  # a retired file that was already gone: nothing to put back
                continue
            try:
                if backup is None:
                    path.unlink()
                else:
                    os.replace(backup, path)
            except OSError:
                lost.append(f"new {path} left" if backup is None else f"earlier {path} kept as {backup}")
                kept.add(backup)
        if lost:
            exc = OSError(None, f"{os_reason(exc)}; could not undo: {', '.join(lost)}")
        clean()
        raise OutputError(failed, exc) from None
    clean()
    for folder in dict.fromkeys(path.parent for _, path in pending):
        _fsync_dir(folder)


@contextmanager
def published_folder(folder: str | Path) -> Iterator[Path]:
    """Context manager for a command that writes several files into ``folder``: they appear as a whole or not
    at all. A new folder is built as a hidden temp sibling and renamed into place at the end (its new parent
    folders too, so a failure leaves no empty folders); into an existing folder the files are published with
    :func:`published_together`. Yields the folder to write into (the temp one while it is being built)."""
    folder = Path(folder)
    if folder.is_dir():
        try:
            with published_together():
                yield folder
        except OutputError as exc:  # named by the folder the user gave (the files in it are this run's)
            raise OutputError(folder, exc) from None
        return
    top = folder  # the outermost folder that does not exist yet: it is the one renamed into place
    while not top.parent.exists() and top.parent != top:
        top = top.parent
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{top.name}.", suffix=".tmp", dir=top.parent))
    except OSError as exc:
        raise OutputError(folder, exc) from None
    try:
        inner = staging / folder.relative_to(top)
        inner.mkdir(parents=True, exist_ok=True)
        yield inner
        os.chmod(staging, 0o777 & ~_UMASK)  # mkdtemp makes 0700 folders; give the usual permissions
        os.rename(staging, top)
        _fsync_dir(top.parent)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(exc, (OSError, OutputError)):  # named by the folder given, not by the temporary one
            raise OutputError(folder, exc) from None
        raise


def _signal_mask():
    """This thread's blocked signals (POSIX), or None where signal masks are not supported."""
    import signal

    if not hasattr(signal, "pthread_sigmask"):
        return None
    return signal.pthread_sigmask(signal.SIG_BLOCK, [])


def _block_stop_signals() -> None:
    """Block SIGINT and SIGTERM for this thread (POSIX; nothing elsewhere)."""
    import signal

    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})


def _restore_signals(previous) -> None:
    """Set the mask :func:`_signal_mask` read (``previous`` None: nothing to undo)."""
    import signal

    if previous is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def write_parquet_atomic(
    table: pa.Table,
    path: str | Path,
    metadata: Mapping[str, str] | None = None,
    *,
    units: Mapping[str, str] | None = None,
    compression: str = "zstd",
) -> Path:
    """Write ``table`` to ``path`` as Parquet, atomically.

    Parameters
    ----------
    table : pyarrow.Table
        The rows.
    path : str or Path
        Destination; its folder is created if needed.
    metadata : mapping of str to str, optional
        Added to the schema metadata (e.g. :func:`provenance_metadata`); values are stringified.
    units : mapping of str to str, optional
        Column name -> unit, stored as field metadata ``{"unit": ...}``.
    compression : str
        Parquet codec.

    Returns
    -------
    Path
        ``path``.
    """
    if units:
        table = with_units(table, units)
    table = table.replace_schema_metadata(_merge_metadata(table.schema, metadata))
    with atomic_output(path) as tmp:
        pq.write_table(table, tmp, compression=compression)
    return Path(path)


# --- partitioned result sets ----------------------------------------------------------------------------
def partition_dir(root: str | Path, values: Mapping[str, object], partition_cols: Sequence[str]) -> Path:
    """Hive folder ``root/col=value/...`` for ``values``; values are URI-escaped as pyarrow expects."""
    folder = Path(root)
    for c in partition_cols:
        folder = folder / f"{c}={quote(str(values[c]), safe='')}"
    return folder


def write_partitioned(
    table_row: pa.Table,
    root: str | Path,
    partition_cols: Sequence[str] = ("model", "tiling"),
    *,
    config=None,
    metadata: Mapping[str, str] | None = None,
    units: Mapping[str, str] | None = None,
) -> Path:
    """Write the result row(s) of one configuration under ``root/model=.../tiling=.../part-<hash>.parquet``.

    Parameters
    ----------
    table_row : pyarrow.Table
        Usually one row; every partition column must hold a single value.
    root : str or Path
        Root of the result set.
    partition_cols : sequence of str
        Columns that become folder levels (dropped from the file, restored by :func:`read_results`).
    config : JSON-able, optional
        The run configuration. The file name is ``part-<first 16 hex of stable_hash(config)>``, and the
        provenance metadata records it. Without it the rows themselves are hashed.
    metadata : mapping, optional
        Extra schema metadata (e.g. trace hash, seed from :func:`provenance_metadata`).
    units : mapping, optional
        Column units for field metadata.

    Returns
    -------
    Path
        The written file.

    Raises
    ------
    ConfigError
        A partition column is missing, empty or holds more than one value.
    """
    values = {}
    for c in partition_cols:
        if c not in table_row.schema.names:
            raise ConfigError(
                f"partition column {c!r} is not in the result table ({', '.join(table_row.schema.names)})"
            )
        distinct = table_row.column(c).unique().to_pylist()
        if len(distinct) != 1 or distinct[0] is None:
            raise ConfigError(f"partition column {c!r} must hold exactly one non-null value, got {distinct}")
        values[c] = distinct[0]
    data = table_row.drop_columns(list(partition_cols))
    meta = provenance_metadata(config) if config is not None else {VERSION_KEY: __version__}
    meta.update(metadata or {})
    key = stable_hash(config) if config is not None else stable_hash(table_row.to_pylist())
    path = partition_dir(root, values, partition_cols) / f"part-{key[:16]}.parquet"
    return write_parquet_atomic(data, path, meta, units=units)


def read_results(root: str | Path, partition_cols: Sequence[str] = ("model", "tiling"), filter=None,
                 pattern: str = "part-*.parquet") -> pa.Table:
    """Read every ``part-*.parquet`` under ``root`` as one table, partition columns restored as strings.

    Parameters
    ----------
    root : str or Path
        Root written by :func:`write_partitioned`.
    partition_cols : sequence of str
        The partition levels (read as strings so ``tiling=32`` and ``tiling=dynamic`` share a type).
    filter : pyarrow.compute.Expression, optional
        Row filter, e.g. ``pc.field("model") == "qwen"``.
    pattern : str
        File-name glob of the files to read (``_units-*.parquet`` for :mod:`stepsim.results.records` unit tables).

    Returns
    -------
    pyarrow.Table
        Rows ordered by file path (deterministic), schema metadata of the first file.
    """
    root = Path(root)
    # an explicit sorted file list makes the row order independent of directory-listing order
    files = sorted(p.as_posix() for p in root.glob(f"**/{pattern}"))
    if not files:
        raise ConfigError(f"{root}: no result files ({pattern}) found")
    part_schema = pa.schema([(c, pa.string()) for c in partition_cols])
    partitioning = ds.partitioning(part_schema, flavor="hive")
    # unify across files so a column added by a later sweep is not dropped (missing values read as null);
    # footers only, cheap even for thousands of result files
    unified = pa.unify_schemas([pq.read_schema(f) for f in files] + [part_schema])
    dataset = ds.dataset(
        files, schema=unified, format="parquet", partitioning=partitioning, partition_base_dir=root.as_posix()
    )
    return dataset.to_table(filter=filter)


_TRACE_HASHES: dict[tuple[str, int, int], str] = {}


def arrays_sha256(arrays) -> str:
    """SHA-256 (hex) of a mapping of arrays (names, dtypes, shapes and bytes): the hash of a trace given as arrays
    (a Workload built in Python), where :func:`trace_sha256` hashes a trace file."""
    h = hashlib.sha256()
    for key in sorted(arrays):
        arr = np.ascontiguousarray(arrays[key])
        h.update(f"{key}\0{arr.dtype.str}\0{arr.shape}\0".encode())
        h.update(arr.tobytes())
    return h.hexdigest()


def trace_sha256(path: str | os.PathLike) -> str:
    """SHA-256 (hex) of a trace: of the file's bytes, or for a folder of ``relative path + file hash`` lines.

    Hashes are cached per (path, size, mtime) so a sweep reading one trace many times hashes it once.
    """
    p = Path(path)
    try:
        info = p.stat()
    except OSError as exc:
        raise ConfigError(f"cannot read trace {p}: {exc}") from exc
    key = (str(p.resolve()), info.st_size, info.st_mtime_ns)
    if key not in _TRACE_HASHES:
        if p.is_dir():
            files = sorted(f for f in p.rglob("*") if f.is_file() and not f.name.startswith("."))
            lines = "".join(f"{f.relative_to(p).as_posix()}\0{file_sha256(f)}\n" for f in files)
            _TRACE_HASHES[key] = hashlib.sha256(lines.encode()).hexdigest()
        else:
            _TRACE_HASHES[key] = file_sha256(p)
    return _TRACE_HASHES[key]
