"""Request traces for serving: the Azure CSV as shipped, the serving request schema, and every bad input."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from serve_requests import requests_file

from stepsim.base.errors import TraceError, TraceSchemaError, TraceValueError
from stepsim.trace_io.requests import read_requests

CSV_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"


def _csv(tmp_path, rows, name="t.csv"):
    p = tmp_path / name
    p.write_bytes((CSV_HEADER + "".join(r + "\r\n" for r in rows)).encode())
    return p


def test_azure_conv_as_shipped(conv_csv):
    t = read_requests(conv_csv)
    assert len(t) == 19366
    assert t.request_id[:3].tolist() == [1, 2, 3]
    # seconds from the first row: 18:15:46.6805900 -> 18:15:50.9951690 is 4.314579 s
    assert t.arrival_s[:2].tolist() == [0.0, 4.314579]
    assert t.prompt_tokens[:2].tolist() == [374, 396] and t.output_tokens[:2].tolist() == [44, 109]
    assert (int(t.prompt_tokens.sum()), int(t.output_tokens.sum())) == (22361870, 4088665)
    assert t.prompt_tokens.dtype == np.int64 and t.arrival_s.dtype == np.float64
    assert float(t.arrival_s[-1]) == pytest.approx(3501.721937, abs=1e-9)


def test_serve_schema_round_trip(tmp_path):
    for name in ("r.parquet", "r.arrow"):
        p = requests_file(tmp_path / name, [0.0, 0.5, 0.5, 2.25], [10, 20, 30, 40], [1, 2, 3, 4], [7, 8, 9, 10])
        t = read_requests(p)
        assert t.arrival_s.tolist() == [0.0, 0.5, 0.5, 2.25]
        assert t.prompt_tokens.tolist() == [10, 20, 30, 40] and t.output_tokens.tolist() == [1, 2, 3, 4]
        assert t.request_id.tolist() == [7, 8, 9, 10]


def test_serve_schema_without_request_id_numbers_rows(tmp_path):
    p = tmp_path / "r.parquet"
    pq.write_table(pa.table({"arrival_s": pa.array([1, 2], pa.int32()), "prompt_tokens": [5, 6],
                             "output_tokens": [7, 8]}), p)
    t = read_requests(p)
    assert t.request_id.tolist() == [0, 1] and t.arrival_s.tolist() == [1.0, 2.0]


def test_csv_errors_are_one_line(tmp_path):
    with pytest.raises(TraceValueError) as e:
        read_requests(_csv(tmp_path, ["2023-11-16 18:15:46.6805900,374,44", "2023-11-16 18:15:45.9951690,396,109"]))
    assert str(e.value) == (f"{tmp_path}/t.csv: row 1, column 'TIMESTAMP': arrival is 0.685421 s before the previous "
                            "row's (requests must be sorted by arrival)")
    with pytest.raises(TraceValueError) as e:
        read_requests(_csv(tmp_path, ["2023-11-16 18:15:46.6805900,374,44", "2023-11-16 18:15:47.0000000,-3,9"]))
    assert str(e.value) == f"{tmp_path}/t.csv: row 1, column 'ContextTokens': negative value -3"
    with pytest.raises(TraceValueError) as e:
        read_requests(_csv(tmp_path, ["2023-11-16 18:15:46.6805900,374,44", "2023-11-16 18:15:47.0000000,3,0"]))
    assert str(e.value) == (f"{tmp_path}/t.csv: row 1, column 'GeneratedTokens': an output of 0 tokens (a request "
                            "has at least 1)")


def _bad(tmp_path, columns):
    p = tmp_path / "bad.parquet"
    pq.write_table(pa.table(columns), p)
    return p


@pytest.mark.parametrize("columns, error, message", [
    ({"arrival_s": [0.0, -1.0], "prompt_tokens": [1, 1], "output_tokens": [1, 1]}, TraceValueError,
     "row 1, column 'arrival_s': negative arrival -1.0 s"),
    ({"arrival_s": [0.0, 2.0, 1.5], "prompt_tokens": [1, 1, 1], "output_tokens": [1, 1, 1]}, TraceValueError,
     "row 2, column 'arrival_s': arrival 1.5 s is before the previous row's 2.0 s (requests must be sorted by "
     "arrival)"),
    ({"arrival_s": [0.0, float("nan")], "prompt_tokens": [1, 1], "output_tokens": [1, 1]}, TraceValueError,
     "row 1, column 'arrival_s': arrival nan is not a finite number"),
    ({"arrival_s": [0.0, 1.0], "prompt_tokens": [1, -4], "output_tokens": [1, 1]}, TraceValueError,
     "row 1, column 'prompt_tokens': negative token count -4"),
    ({"arrival_s": [0.0, 1.0], "prompt_tokens": [0, 1], "output_tokens": [1, 1]}, TraceValueError,
     "row 0, column 'prompt_tokens': a prompt of 0 tokens (a request has at least 1)"),
    ({"arrival_s": [0.0, 1.0], "prompt_tokens": [1, None], "output_tokens": [1, 1]}, TraceValueError,
     "row 1, column 'prompt_tokens': missing value (null)"),
    ({"arrival_s": [0.0], "prompt_tokens": [1.5], "output_tokens": [1]}, TraceSchemaError,
     "column 'prompt_tokens' has type double, expected an integer type"),
    ({"arrival_s": [0.0], "prompt_tokens": [1]}, TraceSchemaError,
     "missing column(s) output_tokens for a request trace (columns: arrival_s, prompt_tokens; expected arrival_s, "
     "prompt_tokens, output_tokens, or a requests trace with context_tokens)"),
    ({"arrival_s": pa.array([], pa.float64()), "prompt_tokens": pa.array([], pa.int64()),
      "output_tokens": pa.array([], pa.int64())}, TraceValueError, "empty trace (0 rows)"),
])
def test_serve_schema_errors_are_one_line(tmp_path, columns, error, message):
    p = _bad(tmp_path, columns)
    with pytest.raises(error) as e:
        read_requests(p)
    assert str(e.value) == f"{p}: {message}"


def test_not_a_request_file(tmp_path):
    with pytest.raises(TraceError) as e:
        read_requests(tmp_path / "nope.csv")
    assert str(e.value) == f"{tmp_path}/nope.csv: no such file"
    with pytest.raises(TraceError) as e:
        read_requests(tmp_path)
    assert str(e.value) == f"{tmp_path}: a request trace is one file, not a folder"
