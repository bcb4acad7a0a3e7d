"""A ResultIndex kept across sweeps into one folder (the rounds of ``stepsim optimize``): each refresh reads only
the part files added or changed since, and the index always equals a fresh ``ResultIndex.load`` of the folder."""

from __future__ import annotations

import shutil

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from serial_executor import SerialExecutor

from stepsim.base.files import write_parquet_atomic
from stepsim.batch import load_sweep, run_sweep, store
from stepsim.batch.store import ResultIndex

SWIGLU = """
workload = "swiglu"
mode = "metrics"
[fixed]
hardware = "hw.toml"
[axes]
tile_m = {tiles}
"""


@pytest.fixture
def reads(monkeypatch) -> list:
    """The names of the part files the index reads, in order."""
    seen = []
    read = store._read_rows

    def counting(out, path):
        seen.append(path.name)
        return read(out, path)

    monkeypatch.setattr(store, "_read_rows", counting)
    return seen


def sweep(sweep_file, tiles, out, index):
    spec = load_sweep(sweep_file(SWIGLU.format(tiles=list(tiles))))
    return run_sweep(spec, out=out, executor=SerialExecutor(), progress=False, index=index)


def same_as_a_fresh_load(index: ResultIndex) -> bool:
    """The same entries, in the same order, as a fresh load (its reads are counted too: call it last)."""
    fresh = ResultIndex.load(index.out)
    return (index.by_key, index.by_slot) == (fresh.by_key, fresh.by_slot) and list(index.by_key) == \
        list(fresh.by_key)


def part_names(out) -> list[str]:
    return sorted(p.name for p in store.row_files(out))


def test_a_kept_index_reads_each_file_once_and_equals_a_fresh_load(sweep_file, tmp_path, reads):
    (tmp_path / "hw.toml").write_text('preset = "step-eval"\nhbm_channels = 32\n')
    out = tmp_path / "results"
    index = ResultIndex(out)
    first = sweep(sweep_file, (16, 32), out, index)
    assert (first.ran, reads) == (2, [])  # an empty folder: nothing to read
    names = part_names(out)
    assert len(names) == 2

    second = sweep(sweep_file, (16, 32, 64), out, index)
    assert (second.ran, len(second.skipped)) == (1, 2)
    assert sorted(reads) == names  # the first sweep's two files, read once
    after_second = part_names(out)
    third = sweep(sweep_file, (16, 32, 64, 128), out, index)
    assert (third.ran, len(third.skipped)) == (1, 3)
    assert reads[2:] == sorted(set(after_second) - set(names))  # only the second sweep's file
    index.refresh()
    assert reads[3:] == sorted(set(part_names(out)) - set(after_second))  # the third sweep's file
    assert same_as_a_fresh_load(index) and len(index.by_key) == 4

    # changed from outside between two sweeps: a file deleted, one rewritten (its row now failed), a copy of a
    # row in a file whose name sorts first (the first copy counts)
    files = store.row_files(out)
    files[0].unlink()
    table = pq.read_table(files[1])
    write_parquet_atomic(table.set_column(table.schema.get_field_index("status"), "status",
                                          pa.array(["failed"] * table.num_rows)), files[1])
    shutil.copy(files[2], files[2].with_name("part-0000.parquet"))
    del reads[:]
    index.refresh()
    assert sorted(reads) == sorted([files[1].name, "part-0000.parquet"])  # not the two files unchanged
    assert same_as_a_fresh_load(index) and len(index.by_key) == 3
    assert index.by_key[pc.utf8_slice_codeunits(table["run_id"], 0, 16)[0].as_py()].status == "failed"
    copied = pq.read_table(files[2])["run_id"][0].as_py()[:16]
    assert index.by_key[copied].path.name == "part-0000.parquet"


def test_a_new_generation_purged_through_a_kept_index(sweep_file, tmp_path, reads):
    """The hardware file changes between two sweeps: the kept index purges the old rows, as a fresh one does."""
    hw = tmp_path / "hw.toml"
    hw.write_text('preset = "step-eval"\nhbm_channels = 32\n')
    out = tmp_path / "results"
    index = ResultIndex(out)
    sweep(sweep_file, (16, 32), out, index)
    hw.write_text('preset = "step-eval"\nhbm_channels = 4\n')
    again = sweep(sweep_file, (16, 32), out, index)
    assert (again.ran, again.superseded, len(part_names(out))) == (2, 2, 2)
    assert same_as_a_fresh_load(index.refresh())
    assert {e.path.name for e in index.by_key.values()} == set(part_names(out))


def test_an_index_of_another_folder_is_refused(sweep_file, tmp_path):
    (tmp_path / "hw.toml").write_text('preset = "step-eval"\n')
    with pytest.raises(ValueError, match=r"^the index given is of .*other, not of the output folder .*results$"):
        sweep(sweep_file, (16,), tmp_path / "results", ResultIndex(tmp_path / "other"))
    assert not (tmp_path / "results").exists()


def test_a_stopped_sweep_removes_the_temp_files_of_interrupted_writes(tmp_path):
    """What run_sweep does after a stop, once every write is done (stepsim/batch/runner.py): the temp files of
    interrupted writes go (row files and counter tables, in any partition folder), finished files stay."""
    from stepsim.batch.store import remove_temp_files

    folder = tmp_path / "model=m" / "tiling=static"
    folder.mkdir(parents=True)
    names = [".part-1.parquet.ab.tmp", "._channels-99ff.parquet.k7.tmp", "._units-99ff.parquet.x1.tmp",
             "part-1.parquet", "_channels-99ff.parquet", "notes.tmp"]
    for name in names:
        (folder / name).write_text("x")
    assert [p.name for p in remove_temp_files(tmp_path)] == ["._channels-99ff.parquet.k7.tmp",
                                                             "._units-99ff.parquet.x1.tmp", ".part-1.parquet.ab.tmp"]
    assert sorted(p.name for p in folder.iterdir()) == ["_channels-99ff.parquet", "notes.tmp", "part-1.parquet"]
