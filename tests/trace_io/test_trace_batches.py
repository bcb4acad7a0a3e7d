"""Decode-batch windows, window selection and per-request attention metadata (no shared traces needed)."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepsim.base.errors import ConfigError, TraceValueError
from stepsim.trace_io import (
    KVWindow,
    attention_metadata,
    decode_batches_table,
    make_schema,
    request_window,
    select_windows,
    validate_table,
    window_stats,
    window_stdevs,
)

# STEP_SEMANTICS §8.5 (trace b16/conv_stdev0987_3349_3364, tile 32)
NUM_TOKENS = [181, 2292, 1119, 946, 2221, 1184, 425, 378, 1144, 1249, 203, 1037, 4079, 1083, 386, 1124]
SEQ_LEN_TILED = [6, 72, 35, 30, 70, 38, 14, 12, 36, 40, 7, 33, 128, 34, 13, 36]
OFFSET = [21, 20, 31, 18, 13, 0, 9, 26, 24, 1, 11, 13, 15, 27, 2, 4]


def test_attention_metadata_spec_example():
    tiles, offset = attention_metadata(NUM_TOKENS, tile=32)
    assert tiles.tolist() == SEQ_LEN_TILED
    assert offset.tolist() == OFFSET
    assert int(tiles.sum()) == 604
    # true K traffic of the example: 604 tiles * 8192 B + 16 * 9216 + 20480
    assert int(tiles.sum()) * 8192 + 16 * 9216 + 20480 == 5_115_904


def test_attention_metadata_tile_edges():
    # x = 31 fills a tile exactly; the new token needs a second one. x = 0 still needs one tile.
    tiles, offset = attention_metadata([0, 31, 32, 63, 64], tile=32)
    assert tiles.tolist() == [1, 1, 2, 2, 3]
    assert offset.tolist() == [0, 31, 0, 31, 0]
    with pytest.raises(TraceValueError, match="KV length -1 of request 1"):
        attention_metadata([3, -1])
    with pytest.raises(ConfigError):
        attention_metadata([3], tile=0)


@given(st.lists(st.integers(0, 10**12), min_size=1, max_size=50), st.integers(1, 4096))
@settings(max_examples=60, deadline=None)
def test_attention_metadata_matches_float_definition(xs, tile):
    tiles, offset = attention_metadata(xs, tile)
    for x, t, o in zip(xs, tiles.tolist(), offset.tolist()):
        assert t == -(-(x + 1) // tile)  # ceil((x+1)/tile), exact integer form
        assert o == x % tile
        assert (t - 1) * tile + o == x  # the new token sits at slot `offset` of the last tile


def _requests(kv, first_id=1):
    n = len(kv)
    schema = make_schema("requests", source="unit.csv")
    return pa.table(
        [
            pa.array(np.arange(first_id, first_id + n, dtype=np.int64)),
            pa.array([dt.datetime(2023, 11, 16) + dt.timedelta(seconds=i) for i in range(n)], pa.timestamp("us")),
            pa.array(kv, pa.int32()),
            pa.array([1] * n, pa.int32()),
        ],
        schema=schema,
    )


def test_window_stats_and_names():
    kv = np.array([10, 20, 30, 40, 1000, 1010, 5, 5])
    w = window_stats(kv, 2, 4)  # requests 2..4 = [20, 30, 40]
    assert (w.start, w.end, w.batch) == (2, 4, 3)
    assert w.stdev == 10.0 and w.label == 10
    assert w.file_name() == "conv_stdev0010_0002_0004.npy"
    assert KVWindow(3349, 3364, 987.1284089890906).file_name() == "conv_stdev0987_3349_3364.npy"
    with pytest.raises(ConfigError):
        window_stats(kv, 7, 9)


def test_window_stdevs_values():
    kv = np.array([1, 3, 5, 7])
    assert window_stdevs(kv, 2).tolist() == pytest.approx([np.sqrt(2)] * 3)
    assert window_stdevs(kv, 4)[0] == np.std(kv.astype(float), ddof=1)
    assert len(window_stdevs(kv, 5)) == 0


def test_select_windows_closest_and_non_overlapping():
    kv = np.array([100, 100, 100, 100, 0, 300, 0, 300, 50, 60, 70, 80])
    # windows of 2 (1-based starts): stdev 0 at 1, 2, 3; large at 4..7
    (low,), (high,) = select_windows(kv, 2, [0.0, 212.0], per_target=1)
    assert (low.start, low.end, low.stdev) == (1, 2, 0.0)
    assert (high.start, high.end) == (5, 6)  # ties (5, 6, 7) go to the earliest window
    assert high.stdev == np.std([0.0, 300.0], ddof=1)
    # 2..3 also has stdev 0 but shares request 2 with 1..2, so the second pick is 3..4
    lows = select_windows(kv, 2, [0.0], per_target=2)[0]
    assert [(w.start, w.end, w.stdev) for w in lows] == [(1, 2, 0.0), (3, 4, 0.0)]
    overl = select_windows(kv, 2, [0.0], per_target=3, allow_overlap=True)[0]
    assert [(w.start, w.stdev) for w in overl] == [(1, 0.0), (2, 0.0), (3, 0.0)]
    within = select_windows(kv, 2, [0.0], per_target=5, within=(9, 12))[0]
    assert [w.start for w in within] == [9, 11]


def test_request_window_and_decode_table():
    req = _requests([5, 6, 7, 8, 9])
    assert request_window(req, 2, 4).tolist() == [6, 7, 8]
    with pytest.raises(TraceValueError, match=r"unit.csv: window 4..6 needs 3 requests, the trace has 2"):
        request_window(req, 4, 6)
    table = decode_batches_table(req, [(1, 2), KVWindow(3, 5, 0.0)])
    validate_table(table)
    assert table.to_pylist() == [
        {"batch_id": 0, "request_ids": [1, 2], "kv_lengths": [5, 6]},
        {"batch_id": 1, "request_ids": [3, 4, 5], "kv_lengths": [7, 8, 9]},
    ]
