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


def _in_memory(source="replica 3", rid=(7, 8, 9), arrival=(0.0, 0.5, 0.5), prompt=(10, 20, 30), output=(1, 2, 3)):
    from stepsim.trace_io.requests import RequestTrace

    return RequestTrace(source, np.asarray(rid), np.asarray(arrival), np.asarray(prompt), np.asarray(output))


def test_requests_in_memory_are_held_and_checked_as_a_files_rows(tmp_path):
    """stepsim.plan serves each replica's requests from memory (requests_of): held as a file's are read, every
    bad value the one-line error a file's row gets, named by the trace's source."""
    from stepsim.trace_io.requests import requests_of

    t = requests_of(_in_memory(rid=np.array([7, 8, 9], np.int32), arrival=[0, 1, 1]))
    assert (t.request_id.dtype, t.arrival_s.dtype, t.prompt_tokens.dtype, t.output_tokens.dtype) == (
        np.int64, np.float64, np.int64, np.int64)
    assert (t.arrival_s.tolist(), t.request_id.tolist()) == ([0.0, 1.0, 1.0], [7, 8, 9])
    written = read_requests(requests_file(tmp_path / "r.parquet", t.arrival_s, t.prompt_tokens, t.output_tokens,
                                          t.request_id))
    for column in ("request_id", "arrival_s", "prompt_tokens", "output_tokens"):
        assert getattr(t, column).tolist() == getattr(written, column).tolist()
        assert getattr(t, column).dtype == getattr(written, column).dtype
    for trace, error, message in [
        (_in_memory(arrival=(0.0, -1.0, 2.0)), TraceValueError, "row 1, column 'arrival_s': negative arrival -1.0 s"),
        (_in_memory(output=(1, 0, 3)), TraceValueError,
         "row 1, column 'output_tokens': an output of 0 tokens (a request has at least 1)"),
        (_in_memory(rid=(7, 8, 7)), TraceValueError,
         "row 2, column 'request_id': request id 7 is also row 0's (request ids must be unique)"),
        (_in_memory(prompt=(10.0, 2.5, 30.0)), TraceSchemaError,
         "column 'prompt_tokens' must be a 1-d array of integers, got float64 of shape (3,)"),
        (_in_memory(arrival=("0", "1", "2")), TraceSchemaError,
         "column 'arrival_s' must be a 1-d array of numbers, got <U1 of shape (3,)"),
        (_in_memory(output=(1, 2)), TraceSchemaError,
         "the columns have different lengths (request_id 3, arrival_s 3, prompt_tokens 3, output_tokens 2)"),
        (_in_memory(prompt=np.array([1, 2**63, 3], np.uint64)), TraceValueError,
         "row 1, column 'prompt_tokens': value 9223372036854775808 does not fit int64"),
        (_in_memory(rid=np.array([], np.int64), arrival=np.array([]), prompt=np.array([], np.int64),
                    output=np.array([], np.int64)), TraceValueError, "empty trace (0 rows)"),
    ]:
        with pytest.raises(error) as e:
            requests_of(trace)
        assert str(e.value) == f"replica 3: {message}"


def test_requests_in_memory_are_identified_by_their_values(tmp_path):
    """requests_sha256 (a fast calibration's key, the outputs' metadata): a file's SHA-256 for a path; for requests
    in memory the hash of their values as held, whatever their source's name or their arrays' types."""
    from stepsim.base.files import file_sha256
    from stepsim.trace_io.requests import requests_sha256

    p = requests_file(tmp_path / "r.parquet", [0.0, 0.5], [10, 20], [1, 2])
    assert requests_sha256(p) == requests_sha256(str(p)) == file_sha256(p)
    same = requests_sha256(_in_memory())
    assert same == requests_sha256(_in_memory(source="other", rid=np.array([7, 8, 9], np.uint8),
                                              prompt=np.array([10, 20, 30], np.int16)))
    assert len({same, requests_sha256(_in_memory(arrival=(0.0, 0.5, 0.75))),
                requests_sha256(_in_memory(rid=(7, 9, 8))), requests_sha256(_in_memory(output=(1, 2, 4)))}) == 4


def test_serve_takes_requests_in_memory_as_from_their_file(tmp_path):
    """serve(model, RequestTrace) gives the tables a run from the same requests' file gives, and its files name
    the in-memory source and its values' hash (read back by stepsim compare's reader)."""
    import stepsim
    from stepsim.results.serve_record import read_serve_folder
    from stepsim.serve.output import read_outputs
    from stepsim.trace_io.requests import requests_sha256

    trace = _in_memory(arrival=(0.0, 0.001, 0.001), prompt=(300, 20, 900), output=(9, 40, 3))
    path = requests_file(tmp_path / "r.parquet", trace.arrival_s, trace.prompt_tokens, trace.output_tokens,
                         trace.request_id)
    from_file = stepsim.serve("llama-3.1-8b", path, out=tmp_path / "file", iteration_latency=0.002, max_seqs=2)
    in_memory = stepsim.serve("llama-3.1-8b", trace, out=tmp_path / "memory", iteration_latency=0.002, max_seqs=2)
    assert in_memory.requests.equals(from_file.requests) and in_memory.iterations.equals(from_file.iterations)
    requests, iterations, summary = read_outputs(tmp_path / "memory")
    assert requests.equals(from_file.requests) and iterations.equals(from_file.iterations)
    row = read_serve_folder(tmp_path / "memory")
    assert (row["requests_file"], row["requests_sha256"]) == ("replica 3", requests_sha256(trace))
    assert summary["completed"] == 3
