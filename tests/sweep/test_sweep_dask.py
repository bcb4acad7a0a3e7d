"""The Dask executor writes the same rows and files as the local pool (wall-time columns aside)."""

from __future__ import annotations

import pytest
from sweep_helpers import SWIGLU_CYCLES, files_under

from stepsim.base.errors import ConfigError
from stepsim.batch import load_sweep, run_sweep
from stepsim.batch.executor_factory import make_executor
from stepsim.batch.rows import WALL_TIME_COLUMNS, read_sweep

pytest.importorskip("distributed")

# two simulations and one task the builder refuses (tile_n = 24 does not divide F = 512)
SWEEP = """
workload = "swiglu"
mode = "simulate"
[axes]
tile_n = [16, 24, 32]
"""


def comparable(table) -> list[dict]:
    """Rows sorted by run id, without the columns that measure wall-clock time."""
    rows = table.drop_columns(list(WALL_TIME_COLUMNS)).to_pylist()
    return sorted(rows, key=lambda r: r["run_id"])


def test_dask_and_local_executors_write_identical_rows(sweep_file, tmp_path):
    from stepsim.batch.dask_executor import DaskExecutor

    spec = load_sweep(sweep_file(SWEEP))
    local = run_sweep(spec, out=tmp_path / "local", jobs=1, progress=False)
    # threads in this process on the loopback interface: the lightest real cluster
    with DaskExecutor(jobs=1, warm_kernels=True, processes=False) as executor:
        assert executor.address.startswith("tcp://127.0.0.1:")
        dask = run_sweep(spec, out=tmp_path / "dask", executor=executor, progress=False)
    assert dask.executor == "dask (local cluster), 1 worker thread"
    assert local.ran == dask.ran == 3 and [t.index for t in dask.failed] == [1]

    assert files_under(tmp_path / "dask") == files_under(tmp_path / "local")
    local_rows, dask_rows = comparable(read_sweep(tmp_path / "local")), comparable(read_sweep(tmp_path / "dask"))
    assert dask_rows == local_rows
    assert {r["tile_n"]: r["cycles"] for r in dask_rows} == {16: SWIGLU_CYCLES[(16, 16)], 24: None,
                                                             32: SWIGLU_CYCLES[(16, 32)]}


def test_address_is_only_for_the_dask_executor():
    with pytest.raises(ConfigError) as info:
        make_executor("local", jobs=1, warm_kernels=False, address="tcp://127.0.0.1:8786")
    assert str(info.value) == "--address is only for --executor dask"
    with pytest.raises(ConfigError) as info:
        make_executor("ray", jobs=1, warm_kernels=False)
    assert str(info.value) == "unknown executor 'ray' (expected one of local, dask)"
