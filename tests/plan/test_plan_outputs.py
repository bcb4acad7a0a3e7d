"""A plan's outputs are exactly the files of its run: rerunning ``stepsim plan`` into the same ``--out`` retires the
earlier plan's files it does not write again (replica files of an earlier recommendation with more replicas, a
figure matplotlib no longer draws), all together with the new files, and never a file the earlier plan.json does
not list (a user's). ``stepsim.base.files.retire`` itself: removed with the group, put back when a later rename
fails, a folder refused."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import numpy as np
import pytest

from stepsim.base import files
from stepsim.base.errors import OutputError
from stepsim.base.files import atomic_output, published_together, retire
from stepsim.plan import output
from stepsim.trace_io.requests import RequestTrace

ROW = {"deployment": "d", "chips": 1, "goodput_per_chip": 1.5, "ttft_p99_s": 0.1, "on_front": True}


def _replicas(k: int) -> list:
    return [(f"replica-{r}.parquet", RequestTrace(f"replica-{r}.parquet", np.array([r]), np.array([0.5 * r]),
                                                  np.array([10]), np.array([3]))) for r in range(k)]


def _listing(folder: Path) -> list:
    return sorted(p.name for p in folder.iterdir())


def test_a_rerun_retires_the_earlier_plans_files_it_does_not_write(tmp_path, monkeypatch):
    out = tmp_path / "out"
    monkeypatch.setattr("stepsim.serve.api.matplotlib_available", lambda: True)
    monkeypatch.setattr(output, "figure", lambda table, path, title: path.write_bytes(b"png"))
    first = {"model": "m.json", "slo": "ttft=2s", "percentile": 99.0, "run": 1}
    output.write_plan(out, first, [ROW], _replicas(3))
    assert json.loads((out / "plan.json").read_text())["outputs"] == [
        "plan.json", "deployments.parquet", "replica-0.parquet", "replica-1.parquet", "replica-2.parquet", "plan.png"]
    (out / "notes.txt").write_text("mine\n")  # the user's files: never the plan's to remove
    (out / "replica-7.parquet").write_text("mine too\n")
    monkeypatch.setattr("stepsim.serve.api.matplotlib_available", lambda: False)  # no figure this time
    second = {"model": "m.json", "slo": "ttft=2s", "percentile": 99.0, "run": 2}
    written = output.write_plan(out, second, [ROW], _replicas(1))
    assert _listing(out) == ["deployments.parquet", "notes.txt", "plan.json", "replica-0.parquet",
                             "replica-7.parquet"]
    assert json.loads((out / "plan.json").read_text()) == {**second, "outputs": [
        "plan.json", "deployments.parquet", "replica-0.parquet"]}
    assert sorted(written) == ["deployments", "plan", "replica-0"]
    assert (out / "notes.txt").read_text() == "mine\n" and (out / "replica-7.parquet").read_text() == "mine too\n"


def test_names_an_earlier_plan_json_lists_are_retired_only_when_a_plan_writes_them(tmp_path):
    (tmp_path / "plan.json").write_text(json.dumps({"outputs": ["replica-2.parquet", "../x", "notes.txt", "plan.png",
                                                                 "replica-.parquet", 3]}))
    assert output.earlier_outputs(tmp_path) == ["replica-2.parquet", "plan.png"]
    (tmp_path / "plan.json").write_text("not json")
    assert output.earlier_outputs(tmp_path) == []
    (tmp_path / "plan.json").write_text("[1]")
    assert output.earlier_outputs(tmp_path) == []


def test_a_retired_file_goes_with_the_group_or_stays(tmp_path, monkeypatch):
    for name in ("a", "old"):
        (tmp_path / name).write_text(f"earlier {name}\n")
    with published_together():
        retire(tmp_path / "old")
        retire(tmp_path / "absent")  # nothing to do
        with atomic_output(tmp_path / "a") as tmp:
            tmp.write_text("new a\n")
        assert (tmp_path / "old").read_text() == "earlier old\n"  # not before the group publishes
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {"a": "new a\n"}

    (tmp_path / "old").write_text("earlier old\n")
    real = os.replace

    def replace(src, dst):  # the rename after the removal fails
        if Path(dst) == tmp_path / "b" and ".tmp" in Path(src).name:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(dst))
        return real(src, dst)

    monkeypatch.setattr(files.os, "replace", replace)
    with pytest.raises(OutputError) as err:
        with published_together():
            retire(tmp_path / "old")
            with atomic_output(tmp_path / "b") as tmp:
                tmp.write_text("new b\n")
    assert str(err.value) == f"cannot write {tmp_path / 'b'}: Read-only file system"
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {"a": "new a\n", "old": "earlier old\n"}


def test_retire_outside_a_group_removes_at_once_and_refuses_a_folder(tmp_path):
    (tmp_path / "f").write_text("x")
    retire(tmp_path / "f")
    assert not (tmp_path / "f").exists()
    (tmp_path / "d").mkdir()
    with pytest.raises(OutputError) as err:
        retire(tmp_path / "d")
    assert str(err.value) == f"cannot write {tmp_path / 'd'}: Is a directory"
    assert (tmp_path / "d").is_dir()
