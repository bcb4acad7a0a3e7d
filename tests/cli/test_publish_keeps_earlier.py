"""Publishing a run's files together (stepsim.base.files.published_together) never deletes an earlier run's files:
when one target cannot be replaced, either every new file lands or every earlier file stays as it was (same
bytes), the error is one line naming the target, and no temp or backup file is left behind.

Each case writes the files ``a``, ``b``, ``c`` of an earlier run, makes one target unreplaceable, publishes a new
run over them and checks the exact error, the bytes of every target and the folder's listing.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from stepsim.base import files
from stepsim.base.errors import OutputError
from stepsim.base.files import atomic_output, published_together

NAMES = ("a", "b", "c")


def _earlier(folder: Path, names=NAMES) -> None:
    for name in names:
        (folder / name).write_text(f"earlier {name}\n")


def _publish(folder: Path, names=NAMES) -> None:
    with published_together():
        for name in names:
            with atomic_output(folder / name) as tmp:
                tmp.write_text(f"new {name}\n")


def _listing(folder: Path) -> dict:
    """Every entry of ``folder``: a file's text, ``<dir>`` for a folder (hidden temp / backup files included)."""
    return {p.name: "<dir>" if p.is_dir() else p.read_text() for p in sorted(folder.iterdir())}


def _folder_in_place(folder, monkeypatch):
    (folder / "b").unlink()
    (folder / "b").mkdir()


def _rename_fails(folder, monkeypatch):
    """The second rename fails (a read-only remount between two renames: root ignores chmod, so it is simulated)."""
    real = os.replace

    def replace(src, dst):
        if Path(dst) == folder / "b" and ".tmp" in Path(src).name:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(dst))
        return real(src, dst)

    monkeypatch.setattr(files.os, "replace", replace)


def _rename_and_undo_fail(folder, monkeypatch):
    """The third rename fails and so does putting ``a`` back: ``a``'s earlier bytes stay under the backup name."""
    real = os.replace

    def replace(src, dst):
        if Path(dst) == folder / "c" or (Path(dst) == folder / "a" and ".bak" in Path(src).name):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(dst))
        return real(src, dst)

    monkeypatch.setattr(files.os, "replace", replace)


def _read_only_folder(folder, monkeypatch):
    """The folder takes no new name (read-only): the backup link fails, before anything is renamed."""
    def link(src, dst, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(dst))

    monkeypatch.setattr(files.os, "link", link)


def _no_hard_links(folder, monkeypatch):
    """A filesystem without hard links: the backup is a copy, and the publication succeeds."""
    def link(src, dst, **kwargs):
        raise OSError(errno.EPERM, os.strerror(errno.EPERM), str(dst))

    monkeypatch.setattr(files.os, "link", link)


EARLIER = {"a": "earlier a\n", "b": "earlier b\n", "c": "earlier c\n"}
NEW = {"a": "new a\n", "b": "new b\n", "c": "new c\n"}

#: (case, how the target is made unreplaceable, the error's message or None, the folder's listing afterwards)
CASES = [
    ("a folder in b's place", _folder_in_place, "cannot write {d}/b: Is a directory", {**EARLIER, "b": "<dir>"}),
    ("b's rename fails", _rename_fails, "cannot write {d}/b: Read-only file system", EARLIER),
    ("read-only folder", _read_only_folder, "cannot write {d}/a: Read-only file system", EARLIER),
    ("no hard links", _no_hard_links, None, NEW),
]


@pytest.mark.parametrize("case, make, message, after", CASES, ids=[c[0] for c in CASES])
def test_publishing_keeps_the_earlier_files_or_replaces_all(tmp_path, monkeypatch, case, make, message, after):
    _earlier(tmp_path)
    make(tmp_path, monkeypatch)
    if message is None:
        _publish(tmp_path)
    else:
        with pytest.raises(OutputError) as caught:
            _publish(tmp_path)
        assert str(caught.value) == message.format(d=tmp_path)
    assert _listing(tmp_path) == after


def test_a_new_target_is_removed_when_a_later_one_fails(tmp_path, monkeypatch):
    # a and c are new (no earlier file), b is earlier and its rename fails: a is removed again, b and c untouched
    (tmp_path / "b").write_text("earlier b\n")
    _rename_fails(tmp_path, monkeypatch)
    with pytest.raises(OutputError) as caught:
        _publish(tmp_path)
    assert str(caught.value) == f"cannot write {tmp_path}/b: Read-only file system"
    assert _listing(tmp_path) == {"b": "earlier b\n"}


def test_an_undo_that_fails_keeps_the_earlier_file_under_its_backup_name(tmp_path, monkeypatch):
    _earlier(tmp_path)
    _rename_and_undo_fail(tmp_path, monkeypatch)
    with pytest.raises(OutputError) as caught:
        _publish(tmp_path)
    listing = _listing(tmp_path)
    backups = [name for name in listing if name.endswith(".bak")]
    assert len(backups) == 1 and backups[0].startswith(".a.")
    assert str(caught.value) == (f"cannot write {tmp_path}/c: Read-only file system; could not undo: earlier "
                                 f"{tmp_path}/a kept as {tmp_path}/{backups[0]}")
    # a holds the new bytes (its undo failed), its earlier bytes are in the backup; b is back; c was never touched
    assert listing == {backups[0]: "earlier a\n", "a": "new a\n", "b": "earlier b\n", "c": "earlier c\n"}
