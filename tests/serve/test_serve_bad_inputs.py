"""The audit of ``stepsim serve``'s bad inputs and faults, case by case: each is one line naming what and where,
exit status 2, before any work, nothing written; inputs that only look odd (a BOM, reordered or extra columns,
blank lines, an Arrow stream) read as the plain file does; a failed write leaves an earlier run's folder as it
was; a corrupt calibration cache is never reused."""

from __future__ import annotations

import errno
import gzip
import json
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cache_folders import refuses_a_cache_folder_at_a_file
from serve_requests import requests_file
from test_exact import SMALL

import stepsim
from stepsim.base.errors import (
    ArgumentError,
    ConfigError,
    LatencyProviderError,
    SimulationError,
    StepsimWarning,
    TraceError,
    TraceValueError,
)
from stepsim.base.signals import Terminated
from stepsim.cli import main
from stepsim.serve.latency import IterationCost
from stepsim.trace_io.requests import read_requests

E = "stepsim: error: "
#: how the largest simulated time is named (stepsim.base.ranges.MAX_TIME_TEXT)
MAX_TIME = "2**32 s (about 136 years; beyond it float64 seconds are coarser than a microsecond)"
#: four layers of Qwen3-30B-A3B: an engine-backed run of a few requests takes seconds
MODEL4 = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "qwen3-30b-a3b-4layers.json")
HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
ROWS = ["2023-11-16 18:15:46.6805900,374,44", "2023-11-16 18:15:50.9951690,396,109",
        "2023-11-16 18:15:51.2000000,100,10"]


def _csv_text(lines) -> bytes:
    return "".join(line + "\r\n" for line in lines).encode()


def _serve(capsys, requests, tmp_path, *extra, model="qwen3-30b-a3b", latency=("--iteration-latency", "0.01")):
    """``stepsim serve`` on ``requests``: ``(exit status, stderr lines)``; asserts no traceback."""
    status = main(["serve", "--model", str(model), "--requests", str(requests), *latency, "--out",
                   str(tmp_path / "out"), *extra])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return status, err.splitlines()


def _refused(capsys, requests, tmp_path, *extra, **kw) -> str:
    """The one line ``stepsim serve`` refuses with (exit status 2, no output folder)."""
    status, lines = _serve(capsys, requests, tmp_path, *extra, **kw)
    assert (status, len(lines)) == (2, 1), lines
    assert not (tmp_path / "out").exists()
    return lines[0]


# --- request files ----------------------------------------------------------------------------------------
CSV_CASES = [  # (file bytes, message after "<file>: "); * changed by the audit
    (gzip.compress(_csv_text([HEADER, *ROWS])),  # *
     "not a CSV text file: it is gzip-compressed; decompress it first (gunzip)"),
    (bytes(range(128, 256)) * 4, "not a CSV text file: its first bytes are not UTF-8 text "  # *
                                 "(b'\\x80\\x81\\x82\\x83\\x84\\x85\\x86\\x87')"),
    ("\r\n".join([HEADER, *ROWS]).encode("utf-16"), "not a CSV text file: it is UTF-16 text; save it as UTF-8"),  # *
    (b"PAR1....", "not a CSV text file: it is a Parquet file; name it .parquet"),  # *
    (b"", "empty file (0 bytes; expected a CSV header and rows)"),  # *
    (HEADER.encode(), "empty trace (0 rows)"),  # * a header without a line break
    (_csv_text([HEADER]), "empty trace (0 rows)"),
    (_csv_text([HEADER, ROWS[0], "2023-11-16 18:15:50.9951690,nan,109"]),  # * was "missing value (null)"
     "row 1, column 'ContextTokens': invalid value 'nan' (expected int64)"),
    (_csv_text(["GeneratedTokens,TIMESTAMP,ContextTokens", "44,2023-11-16 18:15:46.6805900,374",  # * was 'TIMESTAMP'
                "abc,2023-11-16 18:15:50.9951690,396"]),
     "row 1, column 'GeneratedTokens': invalid value 'abc' (expected int64)"),
    (_csv_text([HEADER, ROWS[0].replace(",", "+00:00,", 1)]),  # *
     "row 0, column 'TIMESTAMP': cannot convert to timestamp[ns]: expected no zone offset in "
     "'2023-11-16 18:15:46.6805900+00:00'"),
    (_csv_text(ROWS), "missing column(s) TIMESTAMP, ContextTokens, GeneratedTokens in the CSV header (found: "
                      "2023-11-16 18:15:46.6805900, 374, 44)"),
    (_csv_text(["time,prompt,output", *ROWS]),
     "missing column(s) TIMESTAMP, ContextTokens, GeneratedTokens in the CSV header (found: time, prompt, output)"),
    (_csv_text([HEADER, ROWS[0] + ","]), "row 0: Expected 3 columns, got 4: 2023-11-16 18:15:46.6805900,374,44,"),
    (_csv_text([HEADER, ROWS[0], "2023-11-16 18:15:50.9951690,10"]),
     "row 1: Expected 3 columns, got 2: 2023-11-16 18:15:50.9951690,10"),
    (_csv_text([HEADER, "2023-11-16 18:15:50.9951690,3.5,10"]),
     "row 0, column 'ContextTokens': invalid value '3.5' (expected int64)"),
    (_csv_text([HEADER, "2023-11-16 18:15:50.9951690,1e30,10"]),
     "row 0, column 'ContextTokens': invalid value '1e30' (expected int64)"),
    (_csv_text([HEADER, "2023-11-16 18:15:50.9951690,99999999999999999999,10"]),
     "row 0, column 'ContextTokens': invalid value '99999999999999999999' (expected int64)"),
    (_csv_text([HEADER, "2023-11-16 18:15:50.9951690,3000000000,10"]),
     "row 0, column 'ContextTokens': value 3000000000 does not fit int32"),  # * 'context_tokens'
    (_csv_text([HEADER, "2023-11-16 18:15:50.9951690,,10"]),
     "row 0, column 'ContextTokens': missing value (null)"),  # * 'context_tokens'
    (_csv_text([HEADER, "2023-11-16 18:15:50.9951690,10,-1"]),
     "row 0, column 'GeneratedTokens': negative value -1"),  # * 'generated_tokens'
    (_csv_text([HEADER, "2023-11-16 18:15:50.9951690,10,2", "2023-11-16 18:15:49.0000000,10,2"]),
     "row 1, column 'TIMESTAMP': arrival is 1.995169 s before the previous row's (requests must be sorted by arrival)"),
    (_csv_text([HEADER, "2023-11-16 18:15:50.9951690,0,10"]),
     "row 0, column 'ContextTokens': a prompt of 0 tokens (a request has at least 1)"),
    (_csv_text([HEADER, "yesterday,100,10"]), "row 0, column 'TIMESTAMP': invalid value 'yesterday' "
                                              "(expected timestamp[ns])"),
    (_csv_text([HEADER, "1700000000,100,10"]), "row 0, column 'TIMESTAMP': invalid value '1700000000' "
                                               "(expected timestamp[ns])"),
]


@pytest.mark.parametrize("data, message", CSV_CASES, ids=range(len(CSV_CASES)))
def test_bad_csv_request_files_are_one_line(tmp_path, capsys, data, message):
    path = tmp_path / "t.csv"
    path.write_bytes(data)
    assert _refused(capsys, path, tmp_path) == f"{E}{path}: {message}"
    with pytest.raises(TraceError) as e:  # the same typed error in Python
        read_requests(path)
    assert str(e.value) == f"{path}: {message}"


@pytest.mark.parametrize("name, hint", [("t.csv.gz", "'.gz'; decompress it first"), ("t.txt", "'.txt'"),
                                        ("t.npz", "'.npz'"), ("t", "'a file without a suffix'")])
def test_request_files_of_other_suffixes_are_one_line(tmp_path, capsys, name, hint):
    # * was detect_format's line, which points at `stepsim trace ... --format`, a flag serve does not have
    path = tmp_path / name
    path.write_bytes(gzip.compress(_csv_text([HEADER, *ROWS])))
    assert _refused(capsys, path, tmp_path) == (f"{E}{path}: a request trace is an Azure CSV (.csv), Parquet "
                                                f"(.parquet, .pq) or Arrow (.arrow, .feather, .ipc) file, not {hint}")


def test_missing_and_folder_request_paths_are_one_line(tmp_path, capsys):
    assert _refused(capsys, tmp_path / "none.csv", tmp_path) == f"{E}{tmp_path}/none.csv: no such file"
    (tmp_path / "dir.csv").mkdir()
    assert _refused(capsys, tmp_path / "dir.csv", tmp_path) == (f"{E}{tmp_path}/dir.csv: a request trace is one "
                                                                "file, not a folder")


@pytest.mark.parametrize("lines", [
    ["\ufeff" + HEADER, *ROWS],  # a UTF-8 byte-order mark
    ["ContextTokens,TIMESTAMP,GeneratedTokens", *(",".join([r.split(",")[1], r.split(",")[0], r.split(",")[2]])
                                                  for r in ROWS)],
    [HEADER + ",Note", *(r + ",x" for r in ROWS)],  # an extra column
    [HEADER, ROWS[0], "", ROWS[1], ROWS[2], "", ""],  # blank lines, trailing ones too
    [HEADER, *('"' + r.replace(",", '","') + '"' for r in ROWS)],  # quoted fields
    [HEADER, *(r.replace(" ", "T", 1) for r in ROWS)],  # ISO 8601 'T'
    [HEADER + ",", *(r + "," for r in ROWS)],  # a trailing comma on every line (an empty last column)
])
def test_csv_variants_read_as_the_plain_file(tmp_path, lines):
    plain = tmp_path / "plain.csv"
    plain.write_bytes(_csv_text([HEADER, *ROWS]))
    variant = tmp_path / "variant.csv"
    variant.write_bytes(_csv_text(lines))
    a, b = read_requests(plain), read_requests(variant)
    assert a.arrival_s.tolist() == b.arrival_s.tolist() == [0.0, 4.314579, 4.519410]
    assert (b.prompt_tokens.tolist(), b.output_tokens.tolist(), b.request_id.tolist()) == \
        ([374, 396, 100], [44, 109, 10], [1, 2, 3])


def _columns(**over):
    base = {"arrival_s": pa.array([0.0, 0.5, 1.0]), "prompt_tokens": pa.array([10, 20, 30], pa.int64()),
            "output_tokens": pa.array([1, 2, 3], pa.int64())}
    return {**base, **over}


def _write_arrow(path, table, stream=False):
    with pa.OSFile(str(path), "wb") as f, (pa.ipc.new_stream if stream else pa.ipc.new_file)(f, table.schema) as w:
        w.write_table(table)


COLUMNAR_CASES = [  # (name, columns, message after "<file>: "); * changed by the audit
    ("r.parquet", _columns(prompt_tokens=pa.array([10, 2**63 + 5, 30], pa.uint64())),  # * was "negative token count"
     "row 1, column 'prompt_tokens': value 9223372036854775813 does not fit int64"),
    ("r.parquet", _columns(request_id=pa.array([1, 2**64 - 1, 3], pa.uint64())),  # * was wrapped to -1 silently
     "row 1, column 'request_id': value 18446744073709551615 does not fit int64"),
    ("r.parquet", _columns(request_id=pa.array([7, 8, 7], pa.int64())),  # * was accepted
     "row 2, column 'request_id': request id 7 is also row 0's (request ids must be unique)"),
    ("r.parquet", _columns(prompt_tokens=pa.array(["10", "20", "30"])),
     "column 'prompt_tokens' has type string, expected an integer type"),
    ("r.parquet", _columns(arrival_s=pa.array([0, 1, 2], pa.timestamp("ms"))),
     "column 'arrival_s' has type timestamp[ms], expected a numeric type"),
    ("r.parquet", _columns(arrival_s=pa.array([0.0, float("inf"), 2.0])),
     "row 1, column 'arrival_s': arrival inf is not a finite number"),
    ("r.parquet", _columns(arrival_s=pa.array([0.0, None, 2.0])), "row 1, column 'arrival_s': missing value (null)"),
    ("r.parquet", _columns(output_tokens=pa.array([1, 0, 3], pa.int64())),
     "row 1, column 'output_tokens': an output of 0 tokens (a request has at least 1)"),
    # * each replayed with every step lost in rounding: latencies 0 (or a ZeroDivisionError for 1e300)
    ("r.parquet", _columns(arrival_s=pa.array([1.7e18, 1.7e18 + 5e8, 1.7e18 + 1e9])),  # epoch nanoseconds
     f"row 0, column 'arrival_s': arrival 1.7e+18 s is beyond {MAX_TIME}; are the arrivals in epoch milli-, micro- "
     "or nanoseconds? give seconds"),
    ("r.parquet", _columns(arrival_s=pa.array([0.0, 1.7e12, 1.7e12])),  # epoch milliseconds after a first 0
     f"row 1, column 'arrival_s': arrival 1700000000000.0 s is beyond {MAX_TIME}; are the arrivals in epoch milli-, "
     "micro- or nanoseconds? give seconds"),
    ("r.parquet", _columns(arrival_s=pa.array([1e300, 1e300, 1e300])),
     f"row 0, column 'arrival_s': arrival 1e+300 s is beyond {MAX_TIME}; are the arrivals in epoch milli-, micro- or "
     "nanoseconds? give seconds"),
]


@pytest.mark.parametrize("name, columns, message", COLUMNAR_CASES, ids=range(len(COLUMNAR_CASES)))
def test_bad_columnar_request_files_are_one_line(tmp_path, capsys, name, columns, message):
    path = tmp_path / name
    pq.write_table(pa.table(columns), path)
    assert _refused(capsys, path, tmp_path) == f"{E}{path}: {message}"


@pytest.mark.parametrize("over", [
    {"note": pa.array(["a", "b", "c"])},  # an extra column
    {"prompt_tokens": pa.array([10, 20, 30], pa.int8()), "output_tokens": pa.array([1, 2, 3], pa.uint64())},
    {"prompt_tokens": pa.array([10, 20, 30], pa.int64()).dictionary_encode()},
    {"arrival_s": pa.array([0.0, 0.5, 1.0], pa.float32())},
    {"arrival_s": pa.array([0, 0, 1], pa.int32())},  # integer seconds, two requests at once
])
def test_columnar_variants_read_as_the_plain_file(tmp_path, over):
    pq.write_table(pa.table(_columns(**over)), tmp_path / "v.parquet")
    t = read_requests(tmp_path / "v.parquet")
    assert (t.prompt_tokens.tolist(), t.output_tokens.tolist(), t.request_id.tolist()) == ([10, 20, 30], [1, 2, 3],
                                                                                          [0, 1, 2])
    assert t.arrival_s.tolist() == ([0.0, 0.0, 1.0] if "arrival_s" in over and over["arrival_s"].type == pa.int32()
                                    else [0.0, 0.5, 1.0])


def test_misnamed_truncated_and_stream_arrow_files(tmp_path, capsys):
    table = pa.table(_columns())
    pq.write_table(table, tmp_path / "good.parquet")
    _write_arrow(tmp_path / "good.arrow", table)
    shutil.copy(tmp_path / "good.parquet", tmp_path / "parquet.arrow")
    shutil.copy(tmp_path / "good.arrow", tmp_path / "arrow.parquet")
    assert _refused(capsys, tmp_path / "parquet.arrow", tmp_path) == (
        f"{E}{tmp_path}/parquet.arrow: not a readable arrow file: it is a parquet file; name it .parquet")  # *
    assert _refused(capsys, tmp_path / "arrow.parquet", tmp_path) == (
        f"{E}{tmp_path}/arrow.parquet: not a readable parquet file: it is an arrow file; name it .arrow")  # *
    (tmp_path / "cut.parquet").write_bytes((tmp_path / "good.parquet").read_bytes()[:200])
    assert _refused(capsys, tmp_path / "cut.parquet", tmp_path) == (
        f"{E}{tmp_path}/cut.parquet: not a readable parquet file: Parquet magic bytes not found in footer. Either the "
        "file is corrupted or this is not a parquet file.")
    # an Arrow IPC stream (not the file format) reads as the file does (* was "Not an Arrow file")
    _write_arrow(tmp_path / "stream.arrow", table, stream=True)
    a, b = read_requests(tmp_path / "good.arrow"), read_requests(tmp_path / "stream.arrow")
    assert (b.arrival_s.tolist(), b.prompt_tokens.tolist(), b.request_id.tolist()) == \
        (a.arrival_s.tolist(), a.prompt_tokens.tolist(), a.request_id.tolist()) == ([0.0, 0.5, 1.0], [10, 20, 30],
                                                                                   [0, 1, 2])


def test_prompt_plus_output_that_overflows_int64_is_refused(tmp_path, capsys):
    # * 2**62 + 2**62 wrapped to a negative total, passed the fit check and crashed the scheduler (IndexError)
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table(_columns(prompt_tokens=pa.array([10, 2**62, 30], pa.int64()),
                                     output_tokens=pa.array([1, 2**62, 3], pa.int64()))), path)
    message = (f"{path}: row 1: prompt 4611686018427387904 + output 4611686018427387904 tokens exceed the longest "
               "sequence the engine takes, 40960 tokens (the model's max_position_embeddings is 40960); --drop-long "
               "leaves such requests out, --truncate-long shortens their prompts")
    assert _refused(capsys, path, tmp_path) == E + message
    with pytest.raises(TraceValueError) as e:
        stepsim.serve("qwen3-30b-a3b", path, iteration_latency=0.01)
    assert str(e.value) == message


# --- flags --------------------------------------------------------------------------------------------------
FLAG_CASES = [  # (flags, message); * changed by the audit
    (["--arrival", "poisson:1e-320"], "--arrival poisson:1e-320: the arrivals overflow to infinity (the last request "  # *
                                      "would arrive at inf s); give a larger rate or a smaller scale"),
    (["--arrival-scale", "1e308"], "--arrival-scale 1e+308: the arrivals overflow to infinity (the last request "  # *
                                   "would arrive at inf s); give a larger rate or a smaller scale"),
    (["--arrival-scale", "nan"], "--arrival-scale must be a positive number, got nan"),
    (["--arrival-scale", "1e10"], "--arrival-scale 10000000000.0: the last request would arrive at 45194100000.0 s, "  # *
                                  f"beyond {MAX_TIME}; give a larger rate or a smaller scale"),
    (["--arrival", "poisson:1e-12"], "--arrival poisson:1e-12: the last request would arrive at "  # *
                                     f"1719335668023.8298 s, beyond {MAX_TIME}; give a larger rate or a smaller "
                                     "scale"),
    # * inf and NaN times written into summary.json (invalid JSON), exit 0
    (["--iteration-latency", "1e308"], f"--iteration-latency must be at most {MAX_TIME}, got 1e+308"),
    (["--iteration-latency", "nan"], "--iteration-latency must be a positive number of seconds, got nan"),
    (["--iteration-latency", "inf"], "--iteration-latency must be a positive number of seconds, got inf"),
    (["--iteration-latency", "0"], "--iteration-latency must be a positive number of seconds, got 0.0"),
    (["--iteration-latency", "-1"], "--iteration-latency must be a positive number of seconds, got -1.0"),
    (["--arrival-scale", "inf"], "--arrival-scale must be a positive number, got inf"),
    (["--arrival", "gamma:3"], "--arrival 'gamma:3': expected poisson:RATE with RATE in requests per second > 0"),
    (["--arrival", "poisson"], "--arrival 'poisson': expected poisson:RATE with RATE in requests per second > 0"),
    (["--arrival", "poisson:abc"], "--arrival 'poisson:abc': expected poisson:RATE with RATE in requests per second "
                                   "> 0"),
    (["--limit-requests", "-5"], "--limit-requests must be a positive integer, got -5"),
    (["--duration", "nan"], "--duration must be a positive number, got nan"),
    (["--duration", "0"], "--duration must be a positive number, got 0.0"),
    (["--arrival", "poisson:1", "--duration", "1e-9"], "--duration 1e-09: no request arrives in the first 1e-09 s "
                                                       "(the first arrives at 0.6799319039689096 s)"),
    (["--max-seqs", "0"], "--max-seqs must be a positive integer, got 0"),
    (["--max-batch-tokens", "0"], "--max-batch-tokens must be a positive integer, got 0"),
    (["--chunk-tokens", "-1"], "--chunk-tokens must be a positive integer, got -1"),
    (["--scheduler", "sarathi", "--chunk-tokens", "0"], "--chunk-tokens must be a positive integer, got 0"),
    (["--seed", "-1"], "--seed must be an integer >= 0, got -1"),
    (["--slo", "ttft=-2s"], "--slo 'ttft=-2s': ttft must be positive"),  # * was "cannot parse"
    (["--slo", "ttft=1e999s"], "--slo 'ttft=1e999s': ttft 1e999s is not a finite time"),  # * was accepted (Infinity)
    (["--slo", "ttft=0s"], "--slo 'ttft=0s': ttft must be positive"),
    (["--slo", "ttft=2parsecs"], "--slo 'ttft=2parsecs': cannot parse 'ttft=2parsecs'; expected KEY=NUMBER(s|ms) "
                                 "with KEY ttft, tpot or e2e, e.g. ttft=2s,tpot=200ms"),
    (["--slo", "ttfx=2s"], "--slo 'ttfx=2s': cannot parse 'ttfx=2s'; expected KEY=NUMBER(s|ms) with KEY ttft, tpot "
                           "or e2e, e.g. ttft=2s,tpot=200ms"),
    (["--slo", "e2e=2s,e2el=3s"], "--slo 'e2e=2s,e2el=3s': e2e is given twice"),
    (["--slo", ""], "--slo '': cannot parse ''; expected KEY=NUMBER(s|ms) with KEY ttft, tpot or e2e, e.g. "
                    "ttft=2s,tpot=200ms"),
    (["--slo", "ttft=2s,"], "--slo 'ttft=2s,': cannot parse ''; expected KEY=NUMBER(s|ms) with KEY ttft, tpot or "
                            "e2e, e.g. ttft=2s,tpot=200ms"),
    (["--timeline", ""], "--timeline: empty path"),  # *
    (["--timeline", "{d}/a_file/t.json"], "--timeline {d}/a_file/t.json: {d}/a_file is a file, not a folder"),  # *
    (["--hardware", "{d}/clock.toml"], "{d}/clock.toml: hardware 'step-eval': clock_hz must be a positive int, got "  # *
                                       "True"),
    (["--hardware", "{d}/hbm.toml"], "{d}/hbm.toml: hardware 'step-eval': hbm_capacity_bytes must be a positive "
                                     "int, got -5"),
    (["--hardware", "{d}/typo.toml"], "{d}/typo.toml: unknown hardware key 'clok_hz'; known keys: addr_offset, "
                                      "channel_depth, clock_hz, compute_units, hbm_capacity_bytes, hbm_channels, "
                                      "hbm_init_interval, hbm_latency, hbm_outstanding, hbm_start_up, memory_units, "
                                      "name, on_chip_capacity_bytes, peak_flops_per_cycle, pmu_bw"),
]


@pytest.mark.parametrize("flags, message", FLAG_CASES, ids=[" ".join(f[0]) for f in FLAG_CASES])
def test_bad_flags_are_one_line(tmp_path, capsys, flags, message):
    (tmp_path / "a_file").write_text("")
    (tmp_path / "clock.toml").write_text("clock_hz = true\n")
    (tmp_path / "hbm.toml").write_text("hbm_capacity_bytes = -5\n")
    (tmp_path / "typo.toml").write_text("clok_hz = 5\n")
    trace = tmp_path / "t.csv"
    trace.write_bytes(_csv_text([HEADER, *ROWS]))
    flags = [f.format(d=tmp_path) for f in flags]
    assert _refused(capsys, trace, tmp_path, *flags) == E + message.format(d=tmp_path)
    assert not (tmp_path / "a_file" / "t.json").exists() and (tmp_path / "a_file").is_file()


MODEL_CASES = [  # (config edit, message after "model file <file>: "); * changed by the audit
    ({"num_experts": None},  # * was served as a dense model
     "field 'num_experts_per_tok' = 8 but no expert count (num_local_experts / num_experts / n_routed_experts); "
     "give the experts, or leave top-k out for a dense model"),
    ({"vocab_size": None}, "missing field 'vocab_size' (serving needs it for the weights' size)"),  # * "got None"
    ({"num_hidden_layers": None}, "missing field 'num_hidden_layers'"),
    ({"hidden_size": 0}, "field 'hidden_size' must be an integer >= 1, got 0"),
    ({"num_key_value_heads": -4}, "field 'num_key_value_heads' must be an integer >= 1, got -4"),
    ({"num_experts_per_tok": 200}, "field 'num_experts_per_tok' = 200 exceeds the 128 experts"),
    ({"max_position_embeddings": 0}, "max_position_embeddings must be a positive integer for serving, got 0"),
    # * a string read by Python truth: "false" meant true (the LM head left out of the weights)
    ({"tie_word_embeddings": "false"}, "field 'tie_word_embeddings' must be true or false (a JSON boolean), got "
                                       "'false'"),
    ({"tie_word_embeddings": 0}, "field 'tie_word_embeddings' must be true or false (a JSON boolean), got 0"),  # *
    # float dimensions are refused, never truncated
    ({"hidden_size": 2048.5}, "field 'hidden_size' must be an integer >= 1, got 2048.5"),
    ({"head_dim": 128.0}, "field 'head_dim' must be an integer >= 1, got 128.0"),
    ({"max_position_embeddings": 40960.7}, "max_position_embeddings must be a positive integer for serving, got "
                                           "40960.7"),
]


@pytest.mark.parametrize("edit, message", MODEL_CASES, ids=range(len(MODEL_CASES)))
def test_bad_model_files_are_one_line(tmp_path, capsys, edit, message):
    config = json.loads(open(MODEL4).read())
    config.update(edit)
    path = tmp_path / "m.json"
    path.write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    trace = requests_file(tmp_path / "t.parquet", [0.0], 10, 2)
    assert _refused(capsys, trace, tmp_path, model=path) == f"{E}model file {path}: {message}"


def test_json_booleans_in_a_model_file_size_the_lm_head(tmp_path):
    config = json.loads(open(MODEL4).read())
    trace = requests_file(tmp_path / "t.parquet", [0.0], 10, 2)
    weights = {}
    for tie in (True, False, None):
        path = tmp_path / f"m{tie}.json"
        path.write_text(json.dumps({**config, "tie_word_embeddings": tie}))
        weights[tie] = stepsim.serve(path, trace, iteration_latency=0.01).summary["kv_cache"]["weight_bytes"]
    # untied (false or null): the LM head's vocab x hidden bf16 weights on top
    assert weights[False] == weights[None] == weights[True] + config["vocab_size"] * config["hidden_size"] * 2


@pytest.mark.parametrize("dims, message", [  # * 2048.5 was truncated to 2048
    ({"hidden": 2048.5}, "model 'custom': hidden must be a positive int, got 2048.5"),
    ({"top_k": True}, "model 'custom': top_k must be a positive int, got True"),
    ({"experts": "8"}, "model 'custom': experts must be a positive int, got '8'"),
])
def test_custom_moe_dimensions_are_never_truncated(dims, message):
    from stepsim.models.presets import moe_model

    with pytest.raises(ConfigError) as e:
        moe_model("custom", **{"hidden": 64, "intermediate": 128, "experts": 8, "top_k": 2, **dims})
    assert str(e.value) == message


@pytest.mark.parametrize("text, message", [
    ("[1, 2]", "expected a JSON object of config fields, got list"),
    ('{"hidden_size": 2048,', "not valid JSON: Expecting property name enclosed in double quotes (line 1, column 22)"),
])
def test_model_files_that_are_not_config_objects(tmp_path, capsys, text, message):
    path = tmp_path / "m.json"
    path.write_text(text)
    trace = requests_file(tmp_path / "t.parquet", [0.0], 10, 2)
    assert _refused(capsys, trace, tmp_path, model=path) == f"{E}model file {path}: {message}"


def _routing(path, tokens=8, layers=4, top_k=8, experts=128, seed=0, **arrays):
    rng = np.random.default_rng(seed)
    ids = np.stack([np.stack([rng.choice(experts, top_k, replace=False) for _ in range(layers)])
                    for _ in range(tokens)]).astype(np.int32)
    if arrays:
        np.savez(path, **{name: ids for name in arrays})
    else:
        np.save(path, ids)
    return ids


def test_bad_routing_dumps_are_one_line(tmp_path, capsys):
    trace = requests_file(tmp_path / "t.parquet", [0.0], 10, 2)
    exact = ("--fidelity", "exact")

    def refused(routing):
        return _refused(capsys, trace, tmp_path, "--routing", str(routing), model=MODEL4, latency=exact)

    assert refused("uniform") == (f"{E}--routing 'uniform': expected synthetic or a routed-experts dump "  # *
                                  "[tokens, layers, top_k] (.npy, .npz, .safetensors)")
    assert refused(tmp_path / "none.npy") == f"{E}--routing {tmp_path}/none.npy: no such file"  # *
    (tmp_path / "folder.npy").mkdir()
    assert refused(tmp_path / "folder.npy") == f"{E}--routing {tmp_path}/folder.npy: a folder, not a file"  # *
    _routing(tmp_path / "two.npz", a=1, b=1)
    assert refused(tmp_path / "two.npz") == (f"{E}{tmp_path}/two.npz: holds several arrays (a, b); --routing reads "  # *
                                             "the one named 'routed_experts'; name it so")
    _routing(tmp_path / "layers2.npy", layers=2)
    assert refused(tmp_path / "layers2.npy") == (f"{E}--routing {tmp_path}/layers2.npy: the dump has 2 layers; the "
                                                 "model has 4")
    _routing(tmp_path / "top6.npy", top_k=6)
    assert refused(tmp_path / "top6.npy") == (f"{E}{tmp_path}/top6.npy: array 'array' has top_k = 6 (last axis), but "
                                              f"model '{MODEL4}' routes each token to 8 experts")
    ids = _routing(tmp_path / "ok.npy")
    ids[3, 1, 2] = 128
    np.save(tmp_path / "big.npy", ids)
    assert refused(tmp_path / "big.npy") == (f"{E}{tmp_path}/big.npy: array 'array': row 3, layer 1: expert id 128 "
                                             "(slot 2) outside 0..127")
    ids[3, 1, 2] = -1
    np.save(tmp_path / "neg.npy", ids)
    assert refused(tmp_path / "neg.npy") == (f"{E}{tmp_path}/neg.npy: array 'array': row 3, layer 1: expert id -1 "
                                             "(slot 2) outside 0..127")
    np.save(tmp_path / "empty.npy", np.zeros((0, 4, 8), np.int32))
    assert refused(tmp_path / "empty.npy") == (f"{E}{tmp_path}/empty.npy: array 'array' has shape [0, 4, 8]: an empty "
                                               "axis (expected [tokens, layers, top_k], each at least 1)")
    # Python callers get the same typed errors, also for fast (* a missing dump was a bare FileNotFoundError)
    with pytest.raises(ConfigError) as e:
        stepsim.serve(MODEL4, trace, fidelity="fast", schedule="paper", routing=tmp_path / "none.npy",
                      calibration_cache=tmp_path / "cache")
    assert str(e.value) == f"--routing {tmp_path}/none.npy: no such file"
    assert not (tmp_path / "cache").exists()


# --- what a latency provider returns: checked at every step, one typed line naming the step ------------------
class _Provider:
    """A Python caller's provider: ``costs`` for the first steps, then 10 ms steps."""

    mode, error = "mine", None

    def __init__(self, *costs, then=IterationCost(0.01)):
        self.costs, self.then = list(costs), then

    def __call__(self, batch):
        return self.costs.pop(0) if self.costs else self.then


PROVIDER_CASES = [  # (costs of the first steps, message); * each was accepted: latencies 0, NaN or negative
    ((IterationCost(0.0),), "step 0 (at 0.0 s): seconds must be a positive finite number, got 0.0"),
    ((IterationCost(float("nan")),), "step 0 (at 0.0 s): seconds must be a positive finite number, got nan"),
    ((IterationCost(-0.01),), "step 0 (at 0.0 s): seconds must be a positive finite number, got -0.01"),
    ((IterationCost(float("inf")),), "step 0 (at 0.0 s): seconds must be a positive finite number, got inf"),
    ((IterationCost("0.01"),), "step 0 (at 0.0 s): seconds must be a positive finite number, got '0.01'"),
    ((IterationCost(True),), "step 0 (at 0.0 s): seconds must be a positive finite number, got True"),
    ((0.01,), "step 0 (at 0.0 s): returned 0.01 (float); expected an IterationCost (seconds, cycles)"),
    ((None,), "step 0 (at 0.0 s): returned None (NoneType); expected an IterationCost (seconds, cycles)"),
    ((IterationCost(0.01), IterationCost(0.0)), "step 1 (at 0.01 s): seconds must be a positive finite number, got "
                                                "0.0"),
    ((IterationCost(1e9), IterationCost(1e-9)), "step 1 (at 1000000000.0 s): a step of 1e-09 s is lost in rounding "
                                                "(it does not move time on)"),
    ((IterationCost(4e9), IterationCost(1e9)), "step 1 (at 4000000000.0 s): the step of 1000000000.0 s would end "
                                               f"beyond {MAX_TIME}"),
    ((IterationCost(0.01, {"moe": -5}),), "step 0 (at 0.0 s): cycles['moe'] must be an int >= 0, got -5"),
    ((IterationCost(0.01, {"moe": 1.5}),), "step 0 (at 0.0 s): cycles['moe'] must be an int >= 0, got 1.5"),
]


@pytest.mark.parametrize("costs, message", PROVIDER_CASES, ids=range(len(PROVIDER_CASES)))
def test_a_providers_bad_cost_is_one_typed_line_naming_the_step(tmp_path, costs, message):
    trace = requests_file(tmp_path / "t.parquet", [0.0, 0.5], 10, 3)
    with pytest.raises(LatencyProviderError) as e:
        stepsim.serve("qwen3-30b-a3b", trace, provider=_Provider(*costs), out=tmp_path / "out")
    assert str(e.value) == f"latency provider 'mine': {message}"
    assert not (tmp_path / "out").exists()


def test_a_provider_of_good_costs_replays(tmp_path):  # the check passes what it should: numpy numbers too
    trace = requests_file(tmp_path / "t.parquet", [0.0, 0.5], 10, 3)
    provider = _Provider(IterationCost(np.float64(0.02), {"moe": np.int64(7)}),
                         then=IterationCost(0.01, {"moe": 3}))
    result = stepsim.serve("qwen3-30b-a3b", trace, provider=provider)
    assert result.iterations.column("duration_s").to_pylist() == [0.02] + [0.01] * 5
    assert result.iterations.column("cycles_moe").to_pylist() == [7] + [3] * 5


def test_steps_that_run_past_the_time_range_are_refused_and_write_nothing(tmp_path, capsys):
    # * 1e308 s steps summed to inf: summary.json held Infinity and NaN (invalid JSON), exit 0; a step beyond the
    # range is refused by the flag's check, steps that add up beyond it by the replay, naming the step
    trace = tmp_path / "t.csv"
    trace.write_bytes(_csv_text([HEADER, *ROWS]))
    assert _refused(capsys, trace, tmp_path, "--iteration-latency", "1e9") == (
        f"{E}latency provider 'iteration-latency': step 4 (at 4000000000.0 s): the step of 1000000000.0 s would end "
        f"beyond {MAX_TIME}")


def test_a_summary_with_nan_is_never_written(tmp_path):
    from stepsim.serve.output import write_outputs

    table = pa.table({"a": [1]})
    with pytest.raises(SimulationError) as e:
        write_outputs(tmp_path / "out", table, table, {"ttft_s": {"mean": 0.5, "p99": float("nan")}}, {})
    assert str(e.value) == "summary.json: ttft_s.p99 is nan; a serve run's figures are finite numbers (nothing written)"
    assert not (tmp_path / "out").exists()


# --- serving sweeps: what serve refuses without a run is refused before any task ------------------------------
SWEEP = """workload = "serve"
out = "out"
[fixed]
model = "qwen3-30b-a3b"
requests = "t.parquet"
iteration_latency = 0.01
{extra}
[axes]
max_seqs = [1, 4]
"""


@pytest.mark.parametrize("extra, message", [  # * every case was a failed row (exit 1) or "cannot hash {...}"
    ("arrival_scale = nan", "{f} (task max_seqs=1): arrival_scale must be a finite number, got nan"),
    ("duration = inf", "{f} (task max_seqs=1): duration must be a finite number, got inf"),
    ("seed = -3", "{f} (task max_seqs=1): --seed must be an integer >= 0, got -3"),
    ('arrival = "poisson:2"\narrival_scale = 2.0', "{f} (task max_seqs=1): --arrival and --arrival-scale both set "
                                                   "the arrivals; give one"),
    ("arrival_scale = 0", "{f} (task max_seqs=1): --arrival-scale must be a positive number, got 0"),
    ("limit_requests = -1", "{f} (task max_seqs=1): --limit-requests must be a positive integer, got -1"),
    ("chunk_tokens = -1", "{f} (task max_seqs=1): --chunk-tokens must be a positive integer, got -1"),
    ('fidelity = "exact"', "{f} (task max_seqs=1): --iteration-latency and --fidelity both price the steps; give one"),
    ('routing = "synthetic"', "{f} (task max_seqs=1): --routing is for the engine-backed latency (--fidelity "
                              "exact|fast); --iteration-latency does not simulate layers"),
    ('hardware = "tpu"', "{f} (task max_seqs=1): --hardware must be a preset (sn40l, step-eval, step-hdl) or a .toml "
                         "file, got 'tpu'"),
])
def test_bad_serving_sweep_knobs_are_one_line_before_any_task(tmp_path, capsys, extra, message):
    requests_file(tmp_path / "t.parquet", [0.0, 0.5], 10, 2)
    path = tmp_path / "s.toml"
    path.write_text(SWEEP.format(extra=extra))
    assert main(["sweep", str(path), "--no-progress"]) == 2
    assert capsys.readouterr().err == E + message.format(f=path) + "\n"
    assert not (tmp_path / "out").exists()


def test_a_sweep_with_an_unknown_model_is_refused_before_any_task(tmp_path, capsys):
    requests_file(tmp_path / "t.parquet", [0.0, 0.5], 10, 2)
    path = tmp_path / "s.toml"
    path.write_text(SWEEP.format(extra="").replace('"qwen3-30b-a3b"', '"gpt-9"'))
    assert main(["sweep", str(path), "--no-progress"]) == 2  # * was two failed rows, exit 1
    assert capsys.readouterr().err == (
        f"{E}{path} (task max_seqs=1): unknown model 'gpt-9'; expected one of "
        "deepseek-moe-16b, deepseek-v3, gpt-oss-120b, gpt-oss-20b, llama-3.1-8b, llama-4-maverick, llama-4-scout, mixtral-8x7b, qwen3-235b-a22b, "
        "qwen3-30b-a3b (aliases deepseek, deepseek-r1, deepseekr1, deepseekv3, deepseekv316b, gptoss120b, gptoss20b, "
        "llama, llama4-maverick, llama4-scout, mixtral, mixtral8x7b, qwen, qwen235b, qwen3-235b, qwen30b) or a Hugging Face config.json path\n")


def test_a_sweep_file_with_a_misspelled_workload_names_serve(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text(SWEEP.format(extra="").replace('"serve"', '"serv"'))
    assert main(["sweep", str(path)]) == 2
    assert capsys.readouterr().err == (f"{E}{path}: unknown workload 'serv' (expected one of moe, swiglu, attention, "
                                       "prefill_attention, mla_attention, mla_prefill, sliding_attention, decoder, collective), or serve for a serving sweep\n")


# --- stepsim compare on damaged serve folders ------------------------------------------------------------------
def test_compare_of_damaged_serve_folders_is_one_line(tmp_path, capsys):
    trace = requests_file(tmp_path / "t.parquet", [0.0, 0.5], 10, 2)
    good = tmp_path / "good"
    stepsim.serve("qwen3-30b-a3b", trace, iteration_latency=0.01, out=good)

    def damaged(name, edit):
        folder = tmp_path / name
        shutil.copytree(good, folder)
        edit(folder)
        assert main(["compare", str(good), str(folder)]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and err.count("\n") == 1
        return err.rstrip("\n")

    # * each of the first three was a traceback (exit 1)
    assert damaged("cut", lambda f: (f / "requests.parquet").write_bytes(b"PAR1")) == (
        f"{E}{tmp_path}/cut/requests.parquet: not a readable Parquet file (ArrowInvalid: Parquet file size is 4 bytes, "
        "smaller than the minimum file footer (8 bytes))")
    assert damaged("json", lambda f: (f / "summary.json").write_text('{"requests": ')) == (
        f"{E}{tmp_path}/json/summary.json: not a readable serve summary (JSONDecodeError: Expecting value: line 1 "
        "column 14 (char 13))")
    assert damaged("list", lambda f: (f / "summary.json").write_text("[1]")) == (
        f"{E}{tmp_path}/list/summary.json: holds a JSON list, not a serve summary object")
    # * these said "no records (part-*.parquet) in this folder"
    assert damaged("nosum", lambda f: (f / "summary.json").unlink()) == (
        f"{E}{tmp_path}/nosum: an incomplete stepsim serve folder (no summary.json); run stepsim serve --out again")
    assert damaged("noreq", lambda f: (f / "requests.parquet").unlink()) == (
        f"{E}{tmp_path}/noreq: an incomplete stepsim serve folder (no requests.parquet); run stepsim serve --out "
        "again")


# --- faults -----------------------------------------------------------------------------------------------------
def test_a_full_disk_leaves_an_earlier_runs_folder_as_it_was(tmp_path, capsys, monkeypatch):
    trace = requests_file(tmp_path / "t.parquet", [0.0, 0.5], 10, 2)
    out = tmp_path / "out"
    assert main(["serve", "--model", "qwen3-30b-a3b", "--requests", str(trace), "--iteration-latency", "0.01",
                 "--out", str(out)]) == 0
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    fsync = os.fsync

    def full_at_iterations(fd):  # the disk fills while iterations.parquet is flushed, after requests.parquet
        if "iterations.parquet" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return fsync(fd)

    monkeypatch.setattr(os, "fsync", full_at_iterations)
    argv = ["serve", "--model", "qwen3-30b-a3b", "--requests", str(trace), "--iteration-latency", "0.02",
            "--timeline", str(tmp_path / "t.json")]
    # * requests.parquet of this run used to be renamed in beside the earlier run's summary.json
    assert main([*argv, "--out", str(out)]) == 2
    assert capsys.readouterr().err == f"{E}cannot write {out}: {os.strerror(errno.ENOSPC)}\n"
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the earlier run, whole, no temp file
    assert not (tmp_path / "t.json").exists()
    # a new folder is not left behind empty (* it was)
    assert main([*argv, "--out", str(tmp_path / "new" / "run")]) == 2
    assert capsys.readouterr().err == f"{E}cannot write {tmp_path}/new/run: {os.strerror(errno.ENOSPC)}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "t.parquet"]


def test_a_corrupt_calibration_cache_is_recalibrated_never_reused(tmp_path, capsys, monkeypatch):
    from stepsim.serve.calibration_cache import load_calibration

    trace = tmp_path / "t.csv"
    trace.write_bytes(_csv_text([HEADER, *ROWS]))
    cache = tmp_path / "cache"
    monkeypatch.setenv("STEPSIM_SERVE_CACHE", str(cache))
    model = tmp_path / "small.json"  # the small model of the fast tests: two calibrations, each of a few seconds
    model.write_text(json.dumps(SMALL))
    argv = ["serve", "--model", str(model), "--requests", str(trace), "--fidelity", "fast", "--schedule", "paper",
            "--jobs", "1"]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 0
    capsys.readouterr()
    (file,) = cache.iterdir()
    intact = file.read_bytes()
    key = file.stem
    assert load_calibration(cache, key)["key"] == key
    # * each of these was a traceback (JSONDecodeError, TypeError, UnicodeDecodeError) or, for another key's file
    # copied here, a silent reuse
    record = json.loads(intact)
    edited = dict(record, theta={**record["theta"], "ffn": [v + 1 for v in record["theta"]["ffn"]]})
    other = dict(record, key="0" * 64)
    from stepsim.serve.calibration_cache import _checksum

    other["sha256"] = _checksum(other)
    for content, problem in [
        (intact[:700], "unreadable (JSONDecodeError: "),
        (b"[]", "holds a JSON list, not a calibration record"),
        (b"\xff\xfe", "unreadable (UnicodeDecodeError: "),
        (json.dumps(edited).encode(), "its checksum does not match its content"),
        (json.dumps(other).encode(), f"it holds the calibration {'0' * 16}..., not {key[:16]}..."),
    ]:
        file.write_bytes(content)
        with pytest.warns(StepsimWarning) as w:
            assert load_calibration(cache, key) is None
        assert str(w[0].message).startswith(f"calibration cache file {file}: {problem}")
        assert str(w[0].message).endswith("; calibrating again (the file will be replaced)")
    # a run on the truncated file calibrates again, says so in one line, writes the same bytes and a good file
    file.write_bytes(intact[:700])
    assert main([*argv, "--out", str(tmp_path / "b")]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"stepsim: warning: calibration cache file {file}: unreadable")
    again = load_calibration(cache, key)  # a good file again: the same fit (its stats hold wall times)
    assert {k: again[k] for k in ("key", "theta", "error", "forms")} == {k: record[k] for k in ("key", "theta",
                                                                                                "error", "forms")}
    for name in ("requests.parquet", "iterations.parquet"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    # a cache folder that cannot be one is refused before any work (* after the calibration, as "File exists")
    refuses_a_cache_folder_at_a_file([*argv, "--out", str(tmp_path / "c")], "STEPSIM_SERVE_CACHE", trace, capsys,
                                     monkeypatch)
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("kw, message", [  # * each was an AttributeError or TypeError from deep inside
    ({"slo": 5}, "--slo must be a string such as 'ttft=2s,tpot=200ms', got 5"),
    ({"slo": b"ttft=2s"}, "--slo must be a string such as 'ttft=2s,tpot=200ms', got b'ttft=2s'"),
    ({"arrival": ["poisson:3"]}, "--arrival must be a string such as 'poisson:4', got ['poisson:3']"),
    ({"model": None}, "model must be a preset name or a config.json path (str or Path), got None"),
    ({"model": 5}, "model must be a preset name or a config.json path (str or Path), got 5"),
    ({"requests": None}, "requests must be a request trace's path (str or Path), got None"),
    ({"out": 5}, "out must be a folder path (str or Path), got 5"),
    ({"block_size": "16"}, "block size must be at least 1 token, got '16'"),
    ({"hbm_bytes": "x"}, "hbm_bytes must be a positive integer (bytes), got 'x'"),
    ({"hbm_bytes": -5}, "hbm_bytes must be a positive integer (bytes), got -5"),  # * was "(-0.00 GB)" short
    ({"hbm_bytes": 6.8e10}, "hbm_bytes must be a positive integer (bytes), got 68000000000.0"),  # * was accepted
    ({"out": "{d}/a_file"}, "--out {d}/a_file: is a file; give a folder (stepsim writes several files into it)"),  # *
    # already typed, no test before
    ({"limit_requests": "5"}, "--limit-requests must be a positive integer, got '5'"),
    ({"max_seqs": 2.5}, "--max-seqs must be a positive integer, got 2.5"),
    ({"seed": 1.5}, "--seed must be an integer >= 0, got 1.5"),
    ({"iteration_latency": "0.01"}, "--iteration-latency must be a positive number of seconds, got '0.01'"),
    ({"scheduler": None}, "--scheduler None: expected one of vllm, sarathi, orca"),
])
def test_python_callers_get_the_same_typed_errors(tmp_path, kw, message):
    (tmp_path / "a_file").write_text("")
    args = {"model": "qwen3-30b-a3b", "requests": requests_file(tmp_path / "t.parquet", [0.0], 10, 2),
            "iteration_latency": 0.01, **{k: v.format(d=tmp_path) if k == "out" and isinstance(v, str) else v
                                          for k, v in kw.items()}}
    with pytest.raises((ConfigError, ArgumentError)) as e:  # ArgumentError: the --out check the CLI makes too
        stepsim.serve(args.pop("model"), args.pop("requests"), **args)
    assert str(e.value) == message.format(d=tmp_path)


STOPS = [(KeyboardInterrupt, 130, "stepsim: interrupted\n"), (Terminated, 143, "stepsim: terminated\n")]


@pytest.mark.parametrize(("exc", "status", "err"), STOPS)
def test_a_run_stopped_while_writing_leaves_the_earlier_run_whole(tmp_path, monkeypatch, capsys, exc, status, err):
    import stepsim.serve.output as output

    trace = requests_file(tmp_path / "t.parquet", [0.0, 0.5], 10, 2)
    argv = ["serve", "--model", "qwen3-30b-a3b", "--requests", str(trace), "--out", str(tmp_path / "out")]
    assert main([*argv, "--iteration-latency", "0.01"]) == 0
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    real, written = output.write_parquet_atomic, []

    def stop_at_the_second(table, path, *a, **kw):  # requests.parquet is written (not yet renamed) when it comes
        if written:
            raise exc
        written.append(real(table, path, *a, **kw))
        return written[-1]

    monkeypatch.setattr(output, "write_parquet_atomic", stop_at_the_second)
    assert main([*argv, "--iteration-latency", "0.02"]) == status
    assert capsys.readouterr().err == err
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == before  # no temp file either


@pytest.mark.parametrize(("exc", "status", "err"), STOPS)
def test_a_run_stopped_while_calibrating_writes_no_cache_and_no_output(tmp_path, monkeypatch, capsys, exc, status,
                                                                        err):
    import stepsim.serve.api as api

    def stopped(*a, **kw):  # the first replay is the calibration's pilot
        raise exc

    monkeypatch.setattr(api, "replay", stopped)
    trace = requests_file(tmp_path / "t.parquet", [0.0, 0.5], 10, 2)
    monkeypatch.setenv("STEPSIM_SERVE_CACHE", str(tmp_path / "cache"))
    assert main(["serve", "--model", MODEL4, "--requests", str(trace), "--fidelity", "fast", "--schedule", "paper", "--jobs", "1",
                 "--out", str(tmp_path / "out")]) == status
    assert capsys.readouterr().err == err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.parquet"]


def test_sigterm_stops_exact_serving_on_workers_at_once(tmp_path):
    """SIGTERM to the process group while an exact `serve --jobs 2` maps its buckets on its workers (an empty
    mapping cache: searches of minutes): one line and status 143 within seconds, no process of the group left, no
    output. Closing the pool used to wait for the searches running (a Ctrl-C: 114 s, seen by script); Ctrl-C takes
    the same path (tests/mapping/test_map_cli.py sends it to `map --buckets`' workers)."""
    import sys

    from process_group import stopped_with_its_workers

    trace = requests_file(tmp_path / "t.parquet", [0.0, 0.5, 1.0, 1.5], 300, 20)
    env = {**os.environ, "STEPSIM_MAPPING_CACHE": str(tmp_path / "cache")}
    command = [sys.executable, "-m", "stepsim", "serve", "--model", "qwen3-30b-a3b", "--requests", str(trace),
               "--fidelity", "exact", "--jobs", "2", "--out", str(tmp_path / "out")]
    assert stopped_with_its_workers(command, "SIGTERM", cwd=tmp_path, env=env) == (143, "stepsim: terminated\n", "")
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.rglob("*") if p.suffix not in (".json", ".parquet") and p.name != "cache"] == []


def test_a_timeline_inside_a_new_out_folder_is_published_with_it(tmp_path, capsys):
    from stepsim.serve.timeline import read_timeline

    trace = requests_file(tmp_path / "t.parquet", [0.0, 0.5], 10, 2)
    out = tmp_path / "new" / "run"
    argv = ["serve", "--model", "qwen3-30b-a3b", "--requests", str(trace), "--iteration-latency", "0.01",
            "--out", str(out)]
    assert main([*argv, "--timeline", str(out / "tl" / "t.json")]) == 0
    capsys.readouterr()
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "iterations.parquet", "latency_cdf.png", "over_time.png", "requests.parquet", "summary.json", "tl/t.json"]
    names = [name for name, _ in read_timeline(out / "tl" / "t.json")["tracks"].values()]
    assert names[:3] == ["requests", "request 0", "request 1"]
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == ["run"]  # no staging folder left
    # a timeline that would replace one of the run's own files is refused before the run
    assert _refused(capsys, trace, tmp_path, "--timeline", str(tmp_path / "out" / "summary.json")) == (
        f"{E}--timeline {tmp_path}/out/summary.json: is one of the files --out writes (requests.parquet, "
        "iterations.parquet, summary.json, latency_cdf.png, over_time.png)")


def test_the_calibration_key_follows_the_vocabulary(tmp_path, monkeypatch):
    # * two model files differing only in vocab_size (the LM head's bytes price every step, and the held-out error)
    # shared one cached calibration when their KV blocks came out equal: vocab_size is not in the model's repr
    import stepsim.serve.api as api
    from stepsim.serve.calibration_cache import calibration_key

    class Stop(Exception):
        pass

    keys = []

    def capture(*a, key_parts, **kw):
        keys.append(key_parts)
        raise Stop

    monkeypatch.setattr(api, "fast_provider", capture)
    trace = requests_file(tmp_path / "t.parquet", [0.0, 0.5], 10, 2)
    config = json.loads(open(MODEL4).read())
    for vocab in (151936, 151937):  # the same file, edited
        (tmp_path / "m.json").write_text(json.dumps({**config, "vocab_size": vocab}))
        with pytest.raises(Stop):
            stepsim.serve(str(tmp_path / "m.json"), trace, fidelity="fast", schedule="paper", calibration_cache=tmp_path / "c")
    assert [k["vocab"] for k in keys] == [151936, 151937]
    assert keys[0]["kv_blocks"] == keys[1]["kv_blocks"] and keys[0]["model"] == keys[1]["model"]
    assert calibration_key(keys[0]) != calibration_key(keys[1])


@pytest.mark.parametrize("command", ["serve", "plan"])
def test_a_mapping_cache_that_cannot_be_one_is_refused_before_any_work(tmp_path, capsys, monkeypatch, command):
    """Mapped layers (the default on sn40l) keep their schedules and simulated costs in the mapping cache: a folder
    that is a file, or under one, was a traceback when the first schedule was saved, after the mapping's minutes."""
    trace = tmp_path / "t.csv"
    trace.write_bytes(_csv_text([HEADER, *ROWS]))
    monkeypatch.setenv("STEPSIM_SERVE_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "small.json"
    model.write_text(json.dumps(SMALL))
    argv = ["serve", "--model", str(model), "--requests", str(trace), "--fidelity", "exact"] if command == "serve" \
        else ["plan", "--model", str(model), "--requests", str(trace), "--slo", "ttft=1s,tpot=1s", "--no-verify"]
    refuses_a_cache_folder_at_a_file([*argv, "--out", str(tmp_path / "out")], "STEPSIM_MAPPING_CACHE", trace, capsys,
                                     monkeypatch)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small.json", "t.csv"]
