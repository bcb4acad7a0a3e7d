"""The edge audit of issue 44, kept as a test: every command (the newest included: map, run / metrics --schedule,
serve --system / --hardware / --drop-long / --truncate-long, reproduce serving-validation, models show of the
frontier presets, .onnx paths, compare, sweep, optimize) given what a hostile but fair user gives it, by the
issue's classes: wrong types, numbers out of range (0, negative, NaN, inf, 1e308, beyond int32), malformed files
(cut Parquet / Arrow, a CSV repeating a column, empty files, binary garbage, a folder for a file), special files (a
named pipe, /dev/zero), paths with ``../`` and quotes, missing keys, unknown keys, bad enum values.

Each case asserts the exit status, the exact last line (of stderr; of stdout for the few runs that succeed), no
traceback, and that an error leaves nothing in the folder (nothing half-written). The cases run in-process
(``stepsim.cli.main``) in one folder holding every input (``audit_files.py``), built once for the module; a case
that succeeds has its outputs removed after. ``{d}`` in a line is that folder.

Audit (branch audit44): 434 cases run before the fixes, 410 clean (94 %); the 24 defects are the cases marked
``# *``, by class: 4 hangs or failures after long work (a pipe or /dev/zero as ``--schedule`` blocked or filled
the memory; ``report --png x.txt`` or ``/proc/x.png`` failed only after a minute of simulation), 2 tracebacks
(``--slo ttft=1e308s``: an OverflowError from the figure; ``optimize --space`` of binary bytes: UnicodeDecodeError),
5 silent acceptances (``optimize model.onnx --max-compute 0``; ``models show`` of a ``"false"`` string, an infinite
context and dimensions of 1e30; ``trace synth --alpha inf``, which drew NaN probabilities), 6 wrong messages
(compare of a pipe or a device said "no such file"; a new ``reproduce serving-validation --out`` folder failed with
"No such file or directory", and its --traces / --jobs / --fifo-depths were ignored), 7 leftovers (a sweep or
optimize whose task value is refused left an empty output folder). Each is fixed at its mechanism; 18 more cases
were added after (452 in all; 436 here, the rest are valid runs of seconds to minutes). After the fixes: 0
tracebacks, 0 hangs, 0 silent acceptances, 0 leftovers.
"""

from __future__ import annotations

import shlex
import shutil

import pytest
from audit_files import write_audit_files, write_audit_products

from stepsim.cli import main

E = "stepsim: error: "

#: (command line, exit status, the exact last line: stderr, or stdout for status 0)
CASES = [
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0', 2,
     E + '--iteration-latency must be a positive number of seconds, got 0.0'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency -1', 2,
     E + '--iteration-latency must be a positive number of seconds, got -1.0'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency nan', 2,
     E + '--iteration-latency must be a positive number of seconds, got nan'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency inf', 2,
     E + '--iteration-latency must be a positive number of seconds, got inf'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 1e308', 2,
     E + '--iteration-latency must be at most 2**32 s (about 136 years; beyond it float64 seconds are coarser '
         'than a microsecond), got 1e+308'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency abc', 2,
     "stepsim serve: error: argument --iteration-latency: invalid float value: 'abc'"),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --arrival-scale 0', 2,
     E + '--arrival-scale must be a positive number, got 0.0'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --arrival-scale -1', 2,
     E + '--arrival-scale must be a positive number, got -1.0'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --arrival-scale nan', 2,
     E + '--arrival-scale must be a positive number, got nan'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --arrival-scale inf', 2,
     E + '--arrival-scale must be a positive number, got inf'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --arrival-scale 1e308', 2,
     E + '--arrival-scale 1e+308: the arrivals overflow to infinity (the last request would arrive at inf s); '
         'give a larger rate or a smaller scale'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --arrival poisson:0', 2,
     E + "--arrival 'poisson:0': expected poisson:RATE with RATE in requests per second > 0"),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --arrival poisson:-1', 2,
     E + "--arrival 'poisson:-1': expected poisson:RATE with RATE in requests per second > 0"),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --arrival poisson:nan', 2,
     E + "--arrival 'poisson:nan': expected poisson:RATE with RATE in requests per second > 0"),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --arrival poisson:inf', 2,
     E + "--arrival 'poisson:inf': expected poisson:RATE with RATE in requests per second > 0"),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --arrival poisson:1e-308', 2,
     E + '--arrival poisson:1e-308: the last request would arrive at 1.7193356680238295e+308 s, beyond 2**32 s '
         '(about 136 years; beyond it float64 seconds are coarser than a microsecond); give a larger rate or a '
         'smaller scale'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --arrival poisson', 2,
     E + "--arrival 'poisson': expected poisson:RATE with RATE in requests per second > 0"),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --arrival uniform:5', 2,
     E + "--arrival 'uniform:5': expected poisson:RATE with RATE in requests per second > 0"),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --limit-requests 0', 2,
     E + '--limit-requests must be a positive integer, got 0'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --limit-requests -1', 2,
     E + '--limit-requests must be a positive integer, got -1'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --limit-requests 1e3', 2,
     "stepsim serve: error: argument --limit-requests: invalid int value: '1e3'"),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --duration 0', 2,
     E + '--duration must be a positive number, got 0.0'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --duration nan', 2,
     E + '--duration must be a positive number, got nan'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --duration inf', 2,
     E + '--duration must be a positive number, got inf'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --duration -5', 2,
     E + '--duration must be a positive number, got -5.0'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --max-seqs 0', 2,
     E + '--max-seqs must be a positive integer, got 0'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --max-seqs -3', 2,
     E + '--max-seqs must be a positive integer, got -3'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --max-batch-tokens 0', 2,
     E + '--max-batch-tokens must be a positive integer, got 0'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --chunk-tokens -1', 2,
     E + '--chunk-tokens must be a positive integer, got -1'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --scheduler sarathi --chunk-tokens 0', 2,
     E + '--chunk-tokens must be a positive integer, got 0'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --seed -1', 2,
     E + '--seed must be an integer >= 0, got -1'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --jobs 0', 2,
     E + '--jobs is for the engine-backed latency (--fidelity exact|fast); --iteration-latency does not '
         'simulate layers'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --scheduler fifo', 2,
     "stepsim serve: error: argument --scheduler: invalid choice: 'fifo' (choose from 'vllm', 'sarathi', "
     "'orca')"),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --fidelity exact', 2,
     E + '--iteration-latency and --fidelity both price the steps; give one'),
    ('serve --model small.json --requests req.csv --out o --fidelity medium', 2,
     "stepsim serve: error: argument --fidelity: invalid choice: 'medium' (choose from 'exact', 'fast')"),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --schedule fastest', 2,
     "stepsim serve: error: argument --schedule: invalid choice: 'fastest' (choose from 'paper', 'auto')"),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --schedule auto', 2,
     E + '--schedule auto maps the layers the engine prices: it needs --fidelity exact or fast'),
    ('serve --model small.json --requests req.csv --out o', 2,
     E + 'stepsim serve needs --iteration-latency SECONDS or --fidelity exact|fast'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --slo ttft=nan', 2,
     E + "--slo 'ttft=nan': cannot parse 'ttft=nan'; expected KEY=NUMBER(s|ms) with KEY ttft, tpot or e2e, "
         'e.g. ttft=2s,tpot=200ms'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --slo ttft=infs', 2,
     E + "--slo 'ttft=infs': cannot parse 'ttft=infs'; expected KEY=NUMBER(s|ms) with KEY ttft, tpot or e2e, "
         'e.g. ttft=2s,tpot=200ms'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --slo ttft=-1s', 2,
     E + "--slo 'ttft=-1s': ttft must be positive"),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --slo ttft=0s', 2,
     E + "--slo 'ttft=0s': ttft must be positive"),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --slo ttft=2', 2,
     E + "--slo 'ttft=2': cannot parse 'ttft=2'; expected KEY=NUMBER(s|ms) with KEY ttft, tpot or e2e, e.g. "
         'ttft=2s,tpot=200ms'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --slo ttf=2s', 2,
     E + "--slo 'ttf=2s': cannot parse 'ttf=2s'; expected KEY=NUMBER(s|ms) with KEY ttft, tpot or e2e, e.g. "
         'ttft=2s,tpot=200ms'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --slo ttft=2s,ttft=3s', 2,
     E + "--slo 'ttft=2s,ttft=3s': ttft is given twice"),
    ("serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --slo ''", 2,
     E + "--slo '': cannot parse ''; expected KEY=NUMBER(s|ms) with KEY ttft, tpot or e2e, e.g. "
         'ttft=2s,tpot=200ms'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --slo ttft=1e308s', 2,
     E + "--slo 'ttft=1e308s': ttft must be at most 2**32 s (about 136 years; beyond it float64 seconds are "
         'coarser than a microsecond)'),  # *
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --slo ttft=2h', 2,
     E + "--slo 'ttft=2h': cannot parse 'ttft=2h'; expected KEY=NUMBER(s|ms) with KEY ttft, tpot or e2e, e.g. "
         'ttft=2s,tpot=200ms'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --drop-long --truncate-long', 2,
     'stepsim serve: error: argument --truncate-long: not allowed with argument --drop-long'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --system torus-4', 2,
     E + "--system: unknown system preset 'torus-4'; known presets: fully-connected-8, ring-2, ring-4, ring-8, "
         'sn40l-16, sn40l-8, switch-8, torus-4x4'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --system ring-0', 2,
     E + "--system: unknown system preset 'ring-0'; known presets: fully-connected-8, ring-2, ring-4, ring-8, "
         'sn40l-16, sn40l-8, switch-8, torus-4x4'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --system ring-1000000', 2,
     E + "--system: unknown system preset 'ring-1000000'; known presets: fully-connected-8, ring-2, ring-4, "
         'ring-8, sn40l-16, sn40l-8, switch-8, torus-4x4'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --system sys_topology.toml', 2,
     E + "--system: sys_topology.toml: missing key 'link_bandwidth'"),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --system sys_chips_nan.toml', 2,
     E + '--system: sys_chips_nan.toml: chips must be an int in 1..2147483647 (chips), got nan'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --system sys_chips_zero.toml', 2,
     E + '--system: sys_chips_zero.toml: chips must be an int in 1..2147483647 (chips), got 0'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --system sys_unknown.toml', 2,
     E + "--system: sys_unknown.toml: unknown system key 'link_bandwith'; known keys: chips, dimension, "
         'hardware, link, link_bandwidth, link_latency, name, topology'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --system dir.toml', 2,
     E + "--system: cannot read system file dir.toml: [Errno 21] Is a directory: 'dir.toml'"),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --system empty.toml', 2,
     E + "--system: empty.toml: missing key 'chips'"),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --system junk.toml', 2,
     E + "--system: cannot read system file junk.toml: 'utf-8' codec can't decode byte 0x80 in position 128: "
         'invalid start byte'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --hardware step-fast', 2,
     E + "--hardware must be a preset (sn40l, step-eval, step-hdl) or a .toml file, got 'step-fast'"),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --hardware hw_nan.toml', 2,
     E + "hw_nan.toml: hardware 'sn40l': clock_hz must be a positive int, got nan"),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --hardware hw_inf.toml', 2,
     E + "hw_inf.toml: hardware 'sn40l': clock_hz must be a positive int, got inf"),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --hardware hw_string.toml', 2,
     E + "hw_string.toml: hardware 'sn40l': hbm_channels must be a positive int, got '8'"),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --hardware hw_float.toml', 2,
     E + "hw_float.toml: hardware 'sn40l': hbm_channels must be a positive int, got 8.5"),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --hardware hw_big.toml', 2,
     E + "hw_big.toml: hardware 'sn40l': hbm_capacity_bytes must be a positive int, got 1e+308"),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --system ring-2 --hardware step-fast', 2,
     E + "--hardware must be a preset (sn40l, step-eval, step-hdl) or a .toml file, got 'step-fast'"),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --routing missing.npy', 2,
     E + '--routing is for the engine-backed latency (--fidelity exact|fast); --iteration-latency does not '
         'simulate layers'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --routing junk.npy', 2,
     E + '--routing is for the engine-backed latency (--fidelity exact|fast); --iteration-latency does not '
         'simulate layers'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --timeline o2/t.txt', 2,
     E + '--timeline o2/t.txt: unknown trace format (use .pftrace or .perfetto-trace for Perfetto protobuf, '
         '.json or .json.gz for Chrome JSON)'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --executor ray', 2,
     "stepsim serve: error: argument --executor: invalid choice: 'ray' (choose from 'dask')"),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --address tcp://x:1', 2,
     E + '--address is only for --executor dask'),
    ('serve --model small.json --requests cut_end.parquet --out o --iteration-latency 0.02', 2,
     E + 'cut_end.parquet: not a readable parquet file: Parquet magic bytes not found in footer. Either the '
         'file is corrupted or this is not a parquet file.'),
    ('serve --model small.json --requests cut_end.arrow --out o --iteration-latency 0.02', 2,
     E + 'cut_end.arrow: not a readable arrow file: Expected to read 1330795073 metadata bytes, but only read '
         '477'),
    ('serve --model small.json --requests empty.parquet --out o --iteration-latency 0.02', 2,
     E + 'empty.parquet: not a readable parquet file: Parquet file size is 0 bytes'),
    ('serve --model small.json --requests empty.arrow --out o --iteration-latency 0.02', 2,
     E + 'empty.arrow: not a readable arrow file: Tried reading schema message, was null or length 0'),
    ('serve --model small.json --requests empty.csv --out o --iteration-latency 0.02', 2,
     E + 'empty.csv: empty file (0 bytes; expected a CSV header and rows)'),
    ('serve --model small.json --requests junk.parquet --out o --iteration-latency 0.02', 2,
     E + 'junk.parquet: not a readable parquet file: Parquet magic bytes not found in footer. Either the file '
         'is corrupted or this is not a parquet file.'),
    ('serve --model small.json --requests junk.arrow --out o --iteration-latency 0.02', 2,
     E + 'junk.arrow: not a readable arrow file: Expected to read 50462976 metadata bytes, but only read 1020'),
    ('serve --model small.json --requests junk.csv --out o --iteration-latency 0.02', 2,
     E + 'junk.csv: not a CSV text file: its first bytes are not UTF-8 text '
         "(b'\\x00\\x01\\x02\\x03\\x04\\x05\\x06\\x07')"),
    ('serve --model small.json --requests dir.parquet --out o --iteration-latency 0.02', 2,
     E + 'dir.parquet: a request trace is one file, not a folder'),
    ('serve --model small.json --requests dir.csv --out o --iteration-latency 0.02', 2,
     E + 'dir.csv: a request trace is one file, not a folder'),
    ('serve --model small.json --requests pipe.parquet --out o --iteration-latency 0.02', 2,
     E + 'pipe.parquet: is a named pipe, not a regular file; give a request trace file (reading it could wait '
         'forever)'),
    ('serve --model small.json --requests zero.parquet --out o --iteration-latency 0.02', 2,
     E + 'zero.parquet: is a character device, not a regular file; give a request trace file (reading it could '
         'wait forever)'),
    ('serve --model small.json --requests dup.csv --out o --iteration-latency 0.02', 2,
     E + "dup.csv: column 'GeneratedTokens' appears twice in the CSV header (columns 3 and 4)"),
    ('serve --model small.json --requests header_only.csv --out o --iteration-latency 0.02', 2,
     E + 'header_only.csv: empty trace (0 rows)'),
    ('serve --model small.json --requests neg.csv --out o --iteration-latency 0.02', 2,
     E + "neg.csv: row 0, column 'ContextTokens': negative value -374"),
    ('serve --model small.json --requests zero_out.csv --out o --iteration-latency 0.02', 2,
     E + "zero_out.csv: row 0, column 'GeneratedTokens': an output of 0 tokens (a request has at least 1)"),
    ('serve --model small.json --requests nan_arrival.parquet --out o --iteration-latency 0.02', 2,
     E + "nan_arrival.parquet: row 1, column 'arrival_s': arrival nan is not a finite number"),
    ('serve --model small.json --requests inf_arrival.parquet --out o --iteration-latency 0.02', 2,
     E + "inf_arrival.parquet: row 1, column 'arrival_s': arrival inf is not a finite number"),
    ('serve --model small.json --requests float_tokens.parquet --out o --iteration-latency 0.02', 2,
     E + "float_tokens.parquet: column 'prompt_tokens' has type double, expected an integer type"),
    ('serve --model small.json --requests str_tokens.parquet --out o --iteration-latency 0.02', 2,
     E + "str_tokens.parquet: column 'prompt_tokens' has type string, expected an integer type"),
    ('serve --model small.json --requests missing.csv --out o --iteration-latency 0.02', 2,
     E + 'missing.csv: no such file'),
    ('serve --model small.json --requests req.npz --out o --iteration-latency 0.02', 2, E + 'req.npz: no such file'),
    ('serve --model small.json --requests ../../../../../../../../../../etc/passwd --out o --iteration-latency 0.02', 2,
     E + '../../../../../../../../../../etc/passwd: a request trace is an Azure CSV (.csv), Parquet (.parquet, .pq) or Arrow '
         "(.arrow, .feather, .ipc) file, not 'a file without a suffix'"),
    ('serve --model small.json --requests a_file --out o --iteration-latency 0.02', 2,
     E + 'a_file: a request trace is an Azure CSV (.csv), Parquet (.parquet, .pq) or Arrow (.arrow, .feather, '
         ".ipc) file, not 'a file without a suffix'"),
    ('serve --model small.json --requests req.csv --out /proc/x --iteration-latency 0.02', 2,
     E + '--out /proc/x: cannot write under /proc'),
    ('serve --model small.json --requests req.csv --out a_file --iteration-latency 0.02', 2,
     E + '--out a_file: is a file; give a folder (stepsim writes several files into it)'),
    ('serve --model small.json --requests req.csv --out o.parquet --iteration-latency 0.02', 2,
     E + '--out o.parquet: give a folder, not a .parquet file name (this command writes several files into it)'),
    ("serve --model small.json --requests req.csv --out '' --iteration-latency 0.02", 2, E + '--out: empty path'),
    ('serve --model m_false.json --requests req.csv --out o --iteration-latency 0.02', 2,
     E + "model file m_false.json: field 'tie_word_embeddings' must be true or false (a JSON boolean), got "
         "'false'"),
    ('serve --model m_float.json --requests req.csv --out o --iteration-latency 0.02', 2,
     E + "model file m_float.json: field 'hidden_size' must be an integer >= 1, got 256.5"),
    ('serve --model m_negative.json --requests req.csv --out o --iteration-latency 0.02', 2,
     E + "model file m_negative.json: field 'num_experts' must be an integer >= 0, got -16"),
    ('serve --model m_zero.json --requests req.csv --out o --iteration-latency 0.02', 2,
     E + "model file m_zero.json: field 'num_hidden_layers' must be an integer >= 1, got 0"),
    ('serve --model m_string.json --requests req.csv --out o --iteration-latency 0.02', 2,
     E + "model file m_string.json: field 'hidden_size' must be an integer >= 1, got '256'"),
    ('serve --model m_huge.json --requests req.csv --out o --iteration-latency 0.02', 2,
     E + "model file m_huge.json: field 'hidden_size' must be at most 2,147,483,647 (2**31 - 1), got "
         '1000000000000000000000000000000'),
    ('serve --model m_nan.json --requests req.csv --out o --iteration-latency 0.02', 2,
     E + "model file m_nan.json: field 'hidden_size' must be an integer >= 1, got nan"),
    ('serve --model m_inf.json --requests req.csv --out o --iteration-latency 0.02', 2,
     E + 'model file m_inf.json: max_position_embeddings must be a positive integer for serving, got inf'),
    ('serve --model m_topk.json --requests req.csv --out o --iteration-latency 0.02', 2,
     E + "model file m_topk.json: field 'num_experts_per_tok' = 32 exceeds the 16 experts"),
    ('serve --model m_heads.json --requests req.csv --out o --iteration-latency 0.02', 2,
     E + "model file m_heads.json: field 'num_key_value_heads' = 3 does not divide num_attention_heads = 4"),
    ('serve --model m_list.json --requests req.csv --out o --iteration-latency 0.02', 2,
     E + 'model file m_list.json: expected a JSON object of config fields, got list'),
    ('serve --model m_null.json --requests req.csv --out o --iteration-latency 0.02', 2,
     E + "model file m_null.json: missing field 'hidden_size'"),
    ('serve --model m_bool.json --requests req.csv --out o --iteration-latency 0.02', 2,
     E + "model file m_bool.json: field 'num_experts' must be an integer >= 0, got True"),
    ('serve --model m_missing.json --requests req.csv --out o --iteration-latency 0.02', 2,
     E + "model file m_missing.json: missing field 'num_attention_heads'"),
    ('serve --model empty.json --requests req.csv --out o --iteration-latency 0.02', 2,
     E + 'model file empty.json: not valid JSON: Expecting value (line 1, column 1)'),
    ('serve --model junk.json --requests req.csv --out o --iteration-latency 0.02', 2,
     E + "model file junk.json: cannot read: 'utf-8' codec can't decode byte 0x80 in position 128: invalid "
         'start byte'),
    ('serve --model dir.json --requests req.csv --out o --iteration-latency 0.02', 2,
     E + "model file dir.json: cannot read: [Errno 21] Is a directory: 'dir.json'"),
    ('serve --model pipe.json --requests req.csv --out o --iteration-latency 0.02', 2,
     E + 'pipe.json: is a named pipe, not a regular file; give a model config.json file (reading it could wait '
         'forever)'),
    ('serve --model zero.json --requests req.csv --out o --iteration-latency 0.02', 2,
     E + 'zero.json: is a character device, not a regular file; give a model config.json file (reading it '
         'could wait forever)'),
    ('serve --model dangling.json --requests req.csv --out o --iteration-latency 0.02', 2,
     E + 'model file dangling.json: no such file'),
    ('serve --model gpt5 --requests req.csv --out o --iteration-latency 0.02', 2,
     E + "unknown model 'gpt5'; expected one of deepseek-moe-16b, deepseek-v3, gpt-oss-120b, gpt-oss-20b, "
         'llama-3.1-8b, llama-4-maverick, llama-4-scout, mixtral-8x7b, qwen3-235b-a22b, qwen3-30b-a3b (aliases deepseek, deepseek-r1, '
         'deepseekr1, deepseekv3, deepseekv316b, gptoss120b, gptoss20b, llama, llama4-maverick, llama4-scout, mixtral, mixtral8x7b, qwen, '
         'qwen235b, qwen3-235b, qwen30b) or a Hugging Face config.json path'),
    ('serve --model deepseek-v3 --requests req.csv --out o --iteration-latency 0.02', 2,
     E + "the model's weights (1342.05 GB) do not fit in HBM (68.72 GB): 1273.33 GB short; serve it on several "
         'chips with --system FILE'),
    ('serve --model gpt-oss-120b --requests req.csv --out o --iteration-latency 0.02', 2,
     E + "the model's weights (233.66 GB) do not fit in HBM (68.72 GB): 164.94 GB short; serve it on several "
         'chips with --system FILE'),
    ('serve --model custom --requests req.csv --out o --iteration-latency 0.02', 2,
     E + "unknown model 'custom'; expected one of deepseek-moe-16b, deepseek-v3, gpt-oss-120b, gpt-oss-20b, "
         'llama-3.1-8b, llama-4-maverick, llama-4-scout, mixtral-8x7b, qwen3-235b-a22b, qwen3-30b-a3b (aliases deepseek, deepseek-r1, '
         'deepseekr1, deepseekv3, deepseekv316b, gptoss120b, gptoss20b, llama, llama4-maverick, llama4-scout, mixtral, mixtral8x7b, qwen, '
         'qwen235b, qwen3-235b, qwen30b) or a Hugging Face config.json path'),
    ('map ffn --model llama --shape 0', 2, E + '--shape must be an int >= 1 (tokens), got 0'),
    ('map ffn --model llama --shape -1', 2, E + '--shape must be an int >= 1 (tokens), got -1'),
    ('map ffn --model llama --shape abc', 2, "stepsim map: error: argument --shape: invalid int value: 'abc'"),
    ('map ffn --model llama --shape 1e3', 2, "stepsim map: error: argument --shape: invalid int value: '1e3'"),
    ('map ffn --model llama --shape 99999999999999999999', 2,
     E + "--shape 99,999,999,999,999,999,999: at most 65,536 (a serving step's tokens or requests)"),
    ('map ffn --model llama --shape 2147483648', 2,
     E + "--shape 2,147,483,648: at most 65,536 (a serving step's tokens or requests)"),
    ('map decode --model qwen --shape 0', 2, E + '--shape must be an int >= 1 (requests), got 0'),
    ('map attention --model llama --shape 1', 2,
     "stepsim map: error: argument kind: invalid choice: 'attention' (choose from 'ffn', 'decode', 'prefill', "
     "'projection')"),
    ('map ffn --model gpt5 --shape 1', 2,
     E + "unknown model 'gpt5'; expected one of deepseek-moe-16b, deepseek-v3, gpt-oss-120b, gpt-oss-20b, "
         'llama-3.1-8b, llama-4-maverick, llama-4-scout, mixtral-8x7b, qwen3-235b-a22b, qwen3-30b-a3b (aliases deepseek, deepseek-r1, '
         'deepseekr1, deepseekv3, deepseekv316b, gptoss120b, gptoss20b, llama, llama4-maverick, llama4-scout, mixtral, mixtral8x7b, qwen, '
         'qwen235b, qwen3-235b, qwen30b) or a Hugging Face config.json path'),
    ('map ffn --model m_nan.json --shape 1', 2,
     E + "model file m_nan.json: field 'hidden_size' must be an integer >= 1, got nan"),
    ('map ffn --model m_float.json --shape 1', 2,
     E + "model file m_float.json: field 'hidden_size' must be an integer >= 1, got 256.5"),
    ('map ffn --model junk.json --shape 1', 2,
     E + "model file junk.json: cannot read: 'utf-8' codec can't decode byte 0x80 in position 128: invalid "
         'start byte'),
    ('map ffn --model pipe.json --shape 1', 2,
     E + 'pipe.json: is a named pipe, not a regular file; give a model config.json file (reading it could wait '
         'forever)'),
    ('map ffn --model llama --shape 1 --hardware step-fast', 2,
     E + "--hardware must be a preset (sn40l, step-eval, step-hdl) or a .toml file, got 'step-fast'"),
    ('map ffn --model llama --shape 1 --hardware hw_nan.toml', 2,
     E + "hw_nan.toml: hardware 'sn40l': clock_hz must be a positive int, got nan"),
    ('map ffn --model llama --shape 1 --hardware zero.toml', 2,
     E + 'zero.toml: is a character device, not a regular file; give a hardware file (reading it could wait '
         'forever)'),
    ('map ffn --model llama --shape 1 --out /proc/s.json', 2, E + '--out /proc/s.json: cannot write under /proc'),
    ('map ffn --model llama --shape 1 --out a_file/s.json', 2,
     E + '--out a_file/s.json: a_file is a file, not a folder'),
    ('map ffn --model llama --shape 1 --out dir.json', 2, E + '--out dir.json: is a folder; give a file name'),
    ('map ffn --model deepseek-v3 --shape 1', 2,
     E + "model 'deepseek-v3' uses multi-head latent attention (MLA) and sigmoid routing limited to 4 of 8 "
         'expert groups, which stepsim map does not model yet (issue 43)'),
    ('run moe --schedule fastest', 2,
     E + "--schedule: cannot read schedule file fastest: [Errno 2] No such file or directory: 'fastest'"),
    ('run moe --schedule missing.json', 2,
     E + '--schedule: cannot read schedule file missing.json: [Errno 2] No such file or directory: '
         "'missing.json'"),
    ('run moe --schedule empty.json', 2,
     E + '--schedule: cannot read schedule file empty.json: not JSON (Expecting value: line 1 column 1 (char 0)); '
         'a schedule file is the JSON `stepsim map --out` writes'),
    ('run moe --schedule junk.json', 2,
     E + "--schedule: cannot read schedule file junk.json: 'utf-8' codec can't decode byte 0x80 in position "
         '128: invalid start byte'),
    ('run moe --schedule dir.json', 2,
     E + "--schedule: cannot read schedule file dir.json: [Errno 21] Is a directory: 'dir.json'"),
    ('run moe --schedule pipe.json', 2,
     E + '--schedule: pipe.json: is a named pipe, not a regular file; give a schedule file (reading it could '
         'wait forever)'),  # *
    ('run moe --schedule zero.json', 2,
     E + '--schedule: zero.json: is a character device, not a regular file; give a schedule file (reading it '
         'could wait forever)'),  # *
    ('run moe --schedule s_missing_key.json', 2,
     E + "--schedule: s_missing_key.json: schedule 0: a schedule needs 'kind' and 'knobs'"),
    ('run moe --schedule s_unknown_key.json', 2,
     E + '--schedule: s_unknown_key.json: schedule 0: unknown schedule key(s) knobz'),
    ('run moe --schedule s_wrong_kind.json', 2,
     E + "--schedule: s_wrong_kind.json: schedule 0: schedule kind must be one of ffn, decode, prefill, got 'conv'"),
    ('run moe --schedule s_bad_type.json', 2,
     E + "--schedule: s_bad_type.json: schedule 0: schedule knob 'tile_n' must be a positive int, got '64'"),
    ('run moe --schedule s_nan.json', 2,
     E + "--schedule: s_nan.json: schedule 0: schedule knob 'tile_f' must be a positive int, got nan"),
    ('run moe --schedule s_list.json', 2, E + "--schedule s_list.json: regions 32 must divide the model's 8 experts"),
    ('metrics moe --schedule s_decode.json', 2,
     E + "--schedule s_decode.json: its schedule is of kind 'decode'; this moe run needs kind 'ffn' (stepsim "
         'map ffn --out FILE)'),
    ('metrics swiglu --schedule auto', 2,
     E + "--schedule auto: the mapper does not cover workload 'swiglu'; it maps moe (kind ffn), attention "
         '(kind decode); give --schedule paper'),
    ('metrics swiglu --schedule good_sched.json', 2,
     E + "--schedule FILE: the mapper does not cover workload 'swiglu'; it maps moe (kind ffn), attention "
         '(kind decode); give --schedule paper'),
    ('metrics attention --schedule good_sched.json', 2,
     E + "--schedule good_sched.json: its schedule is of kind 'ffn'; this attention run needs kind 'decode' "
         '(stepsim map decode --out FILE)'),
    ('metrics moe --model mixtral --schedule good_sched.json', 2,
     E + "--schedule good_sched.json: regions 32 must divide the model's 8 experts"),
    ('models show deepseek-v3', 0,
     'layer-list features       multi-head latent attention (MLA), sigmoid routing limited to 4 of 8 '
     'expert groups (served and planned layer group by layer group; run and map refuse them)'),
    ('models show gpt-oss-120b --json', 0, '}'),
    ('models show qwen3-235b-a22b', 0, 'parameters                235093610496'),
    ('models show gpt-oss-20b', 0,
     'layer-list features       sliding-window attention (12 of 24 layers), attention sinks '
     '(served and planned layer group by layer group; run and map refuse them)'),
    ('models show deepseek-r1 --json', 0, '}'),
    ('models show m_false.json', 2,
     E + "model file m_false.json: field 'tie_word_embeddings' must be true or false (a JSON boolean), got "
         "'false'"),  # *
    ('models show m_float.json', 2,
     E + "model file m_float.json: field 'hidden_size' must be an integer >= 1, got 256.5"),
    ('models show m_negative.json', 2,
     E + "model file m_negative.json: field 'num_experts' must be an integer >= 0, got -16"),
    ('models show m_zero.json', 2,
     E + "model file m_zero.json: field 'num_hidden_layers' must be an integer >= 1, got 0"),
    ('models show m_string.json', 2,
     E + "model file m_string.json: field 'hidden_size' must be an integer >= 1, got '256'"),
    ('models show m_huge.json', 2,
     E + "model file m_huge.json: field 'hidden_size' must be at most 2,147,483,647 (2**31 - 1), got "
         '1000000000000000000000000000000'),  # *
    ('models show m_nan.json', 2, E + "model file m_nan.json: field 'hidden_size' must be an integer >= 1, got nan"),
    ('models show m_inf.json', 2,
     E + 'model file m_inf.json: max_position_embeddings must be a positive integer for serving, got inf'),  # *
    ('models show m_topk.json', 2,
     E + "model file m_topk.json: field 'num_experts_per_tok' = 32 exceeds the 16 experts"),
    ('models show m_heads.json', 2,
     E + "model file m_heads.json: field 'num_key_value_heads' = 3 does not divide num_attention_heads = 4"),
    ('models show m_list.json', 2, E + 'model file m_list.json: expected a JSON object of config fields, got list'),
    ('models show m_null.json', 2, E + "model file m_null.json: missing field 'hidden_size'"),
    ('models show m_bool.json', 2, E + "model file m_bool.json: field 'num_experts' must be an integer >= 0, got True"),
    ('models show m_missing.json', 2, E + "model file m_missing.json: missing field 'num_attention_heads'"),
    ('models show empty.json', 2, E + 'model file empty.json: not valid JSON: Expecting value (line 1, column 1)'),
    ('models show junk.json', 2,
     E + "model file junk.json: cannot read: 'utf-8' codec can't decode byte 0x80 in position 128: invalid "
         'start byte'),
    ('models show dir.json', 2, E + "model file dir.json: cannot read: [Errno 21] Is a directory: 'dir.json'"),
    ('models show pipe.json', 2,
     E + 'pipe.json: is a named pipe, not a regular file; give a model config.json file (reading it could wait '
         'forever)'),
    ('models show dangling.json', 2, E + 'model file dangling.json: no such file'),
    ("models show ''", 2,
     E + "unknown model ''; expected one of deepseek-moe-16b, deepseek-v3, gpt-oss-120b, gpt-oss-20b, "
         'llama-3.1-8b, llama-4-maverick, llama-4-scout, mixtral-8x7b, qwen3-235b-a22b, qwen3-30b-a3b (aliases deepseek, deepseek-r1, '
         'deepseekr1, deepseekv3, deepseekv316b, gptoss120b, gptoss20b, llama, llama4-maverick, llama4-scout, mixtral, mixtral8x7b, qwen, '
         'qwen235b, qwen3-235b, qwen30b) or a Hugging Face config.json path'),
    ('models list --json', 0, ']'),
    ('models delete qwen', 2,
     "stepsim models: error: argument SUBCOMMAND: invalid choice: 'delete' (choose from 'list', 'show')"),
    ('run empty.onnx', 2, E + 'empty.onnx: invalid ONNX model (The model does not have an ir_version set properly.)'),
    ('run junk.onnx', 2,
     E + "junk.onnx: not a readable ONNX model (Error parsing message with type 'onnx.ModelProto': Wire format "
         'was corrupt)'),
    ('run dir.onnx', 2, E + 'dir.onnx: a folder, not an ONNX file'),
    ('run pipe.onnx', 2, E + 'pipe.onnx: not a regular file (a pipe, socket or device), not an ONNX file'),
    ('run zero.onnx', 2, E + 'zero.onnx: not a regular file (a pipe, socket or device), not an ONNX file'),
    ('run missing.onnx', 2, E + 'missing.onnx: no such ONNX file'),
    ('metrics junk.onnx', 2,
     E + "junk.onnx: not a readable ONNX model (Error parsing message with type 'onnx.ModelProto': Wire format "
         'was corrupt)'),
    ('graph show junk.onnx', 2,
     E + "junk.onnx: not a readable ONNX model (Error parsing message with type 'onnx.ModelProto': Wire format "
         'was corrupt)'),
    ('graph show empty.onnx', 2,
     E + 'empty.onnx: invalid ONNX model (The model does not have an ir_version set properly.)'),
    ('size-fifos junk.onnx --out d.toml', 2,
     E + "junk.onnx: not a readable ONNX model (Error parsing message with type 'onnx.ModelProto': Wire format "
         'was corrupt)'),
    ('optimize junk.onnx --out opt', 2,
     E + "junk.onnx: not a readable ONNX model (Error parsing message with type 'onnx.ModelProto': Wire format "
         'was corrupt)'),
    ('optimize empty.onnx --out opt', 2,
     E + 'empty.onnx: invalid ONNX model (The model does not have an ir_version set properly.)'),
    ('metrics block.onnx --tile-m 0', 2, E + '--tile-m must be an int >= 1, got 0'),
    ('metrics block.onnx --tile-m -4', 2, E + '--tile-m must be an int >= 1, got -4'),
    ('metrics block.onnx --tile-m 3', 2,
     E + "--tile-m does not apply to workload 'program' (it applies to: swiglu, prefill_attention, mla_prefill)"),
    ('metrics block.onnx --tile-n 0', 2, E + '--tile-n must be an int >= 1, got 0'),
    ("metrics block.onnx --spill ',,'", 2,
     E + "--spill ',,': an empty name in the list; expected NAME[,NAME...], each a value or VALUE->CONSUMER"),
    ("metrics block.onnx --spill 'nothing'", 2,
     E + "--spill: 'nothing' is no edge of model 'llama_block'; its edges' values: sq, ms, mse, rms, inv, xn, "
         'h, gate, silu, up, z, down (a value spills all its edges, VALUE->CONSUMER one)'),
    ("metrics block.onnx --spill 'h->nobody'", 2,
     E + "--spill: 'h->nobody' is no edge of model 'llama_block'; its edges' values: sq, ms, mse, rms, inv, "
         'xn, h, gate, silu, up, z, down (a value spills all its edges, VALUE->CONSUMER one)'),
    ('metrics block.onnx --ep 2', 2, E + "--ep does not apply to workload 'program' (it applies to: moe, decoder)"),
    ('metrics block.onnx --tp 2', 2,
     E + "--tp does not apply to workload 'program' (it applies to: moe, swiglu, decoder)"),
    ('metrics block.onnx --model mixtral', 2,
     E + "--model does not apply to workload 'program' (it applies to: moe, prefill_attention, mla_attention, mla_prefill, "
         'sliding_attention, decoder)'),
    ('metrics block.onnx --trace junk.npz', 2,
     E + "junk.npz: a routing trace was given but model 'llama_block' has no MoE block (TopK of router "
         'probabilities, expert selection, weighted sum)'),
    ('metrics block.onnx --no-fuse --spill h', 0, '  z->down: fusion is off (--no-fuse; fuse=False in the API)'),
    ('metrics block.onnx --strategy coarse', 2,
     E + "--strategy does not apply to workload 'program' (it applies to: attention, decoder)"),
    ('optimize block.onnx --out opt --max-chips 4', 2,
     E + '--max-chips does not apply to optimize of an .onnx model: the tile search runs on one chip (no '
         'tensor or expert parallelism of a lowered model)'),
    ('optimize block.onnx --out opt --space space_unknown.toml', 2,
     E + '--space does not apply to optimize of an .onnx model: the tile search builds its own space from the '
         "model's shapes (tile_m x tile_n, fusion)"),
    ('optimize block.onnx --out opt --system ring-2', 2,
     E + "--system does not apply to workload 'program' (it applies to: moe, swiglu, decoder, collective)"),
    ('optimize block.onnx --out opt --model mixtral', 2,
     E + "--model does not apply to workload 'program' (it applies to: moe, prefill_attention, mla_attention, mla_prefill, "
         'sliding_attention, decoder)'),
    ('optimize block.onnx --out opt --max-compute 0', 2,
     E + '--max-compute does not apply to optimize of an .onnx model: every tiling of a lowered model '
         'allocates the same compute (compute_bw per node)'),  # *
    ('run block.onnx --check', 2, E + '--check needs --functional (it compares the values a functional run stored)'),
    ('run block.onnx --functional --check --tile-m 999999999999', 2,
     E + '--tile-m must be at most 2,147,483,647 (2**31 - 1), got 999999999999'),
    ('compare missing_a missing_b', 2, E + 'missing_a: no such file or folder'),
    ('compare junk.parquet junk.parquet', 2,
     E + 'junk.parquet: not a Parquet file of records (ArrowInvalid: Could not open Parquet input source '
         "'junk.parquet': Parquet magic bytes not found in footer. Either the file is corrupted or this is not "
         'a parquet file.)'),
    ('compare empty.parquet empty.parquet', 2,
     E + 'empty.parquet: not a Parquet file of records (ArrowInvalid: Could not open Parquet input source '
         "'empty.parquet': Parquet file size is 0 bytes)"),
    ('compare dir.parquet dir.parquet', 2,
     E + 'dir.parquet: no records (part-*.parquet) in this folder; give a `stepsim run --out`, `stepsim sweep` '
         'or `stepsim serve --out` folder or a Parquet file'),
    ('compare cut_end.parquet cut_end.parquet', 2,
     E + 'cut_end.parquet: not a Parquet file of records (ArrowInvalid: Could not open Parquet input source '
         "'cut_end.parquet': Parquet magic bytes not found in footer. Either the file is corrupted or this is "
         'not a parquet file.)'),
    ('compare pipe.parquet pipe.parquet', 2,
     E + 'pipe.parquet: is a named pipe, not a regular file; give a records file (reading it could wait '
         'forever)'),  # *
    ('compare zero.parquet zero.parquet', 2,
     E + 'zero.parquet: is a character device, not a regular file; give a records file (reading it could wait '
         'forever)'),  # *
    ('compare a_file a_file', 2,
     E + "a_file: not a Parquet file of records (ArrowInvalid: Could not open Parquet input source 'a_file': "
         'Parquet magic bytes not found in footer. Either the file is corrupted or this is not a parquet '
         'file.)'),
    ('compare req.parquet req.parquet', 2,
     E + 'req.parquet: not a table of stepsim records (no run_id / cycles column)'),
    ('compare run1 run1 --threshold nan', 2, E + '--threshold must be a finite ratio >= 0 (0.01 = 1 %), got nan'),
    ('compare run1 run1 --threshold -1', 2, E + '--threshold must be a finite ratio >= 0 (0.01 = 1 %), got -1.0'),
    ('compare run1 run1 --threshold inf', 2, E + '--threshold must be a finite ratio >= 0 (0.01 = 1 %), got inf'),
    # disaggregated serving (issue 42), audited after it landed
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --disaggregate 1:1', 2,
     E + "--disaggregate 1:1 moves the KV cache over a system's links: give --system (a preset or file of at least "
         '2 chips)'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --disaggregate 1:x --system ring-2', 2,
     E + "--disaggregate '1:x': expected P:D, prefill chips and decode chips, each an integer >= 1 (e.g. 2:2)"),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --disaggregate 1.5:1 --system ring-2', 2,
     E + "--disaggregate '1.5:1': expected P:D, prefill chips and decode chips, each an integer >= 1 (e.g. 2:2)"),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --disaggregate 99999999999999999999:1 --system ring-2', 2,
     E + '--disaggregate 99999999999999999999:1: 100000000000000000000 chips, but the system has 2'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --first-token decode', 2,
     E + "--first-token is for --disaggregate P:D (a colocated run's first token is its prefill's)"),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --disaggregate 1:1 --system ring-2 --timeline t.pftrace', 2,
     E + '--timeline is not built with --disaggregate'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --disaggregate 2:2 --system torus-4x4', 2,
     E + '--disaggregate with --system torus-4x4: a pool of 2 chips is cut from a system of one dimension (ring, '
         'fully-connected or switch); this one has 2 dimension(s)'),
    ('map prefill --model llama --shape 0', 2, E + '--shape must be an int >= 1 (tokens), got 0'),
    ('map prefill --model llama --shape 99999999999', 2,
     E + '--shape 99,999,999,999: at most 65,536 (a serving step\'s tokens or requests)'),
    ('compare run1 run1 --threshold 1e308', 2,
     E + '--threshold must be at most 1e+06 (a ratio; 100000000%), got 1e+308'),  # * printed "worse by inf %"
    ('compare run1 run1 --threshold 1e308%', 2,
     E + '--threshold must be at most 1e+06 (a ratio; 100000000%), got 1e+306'),
    ('compare run1 run1 --threshold abc', 2,
     'stepsim compare: error: argument --threshold: expected a ratio (0.05) or a percentage (5%), got '
     "'abc'"),
    ('compare run1 run1 --threshold 5%%', 2,
     'stepsim compare: error: argument --threshold: expected a ratio (0.05) or a percentage (5%), got '
     "'5%%'"),
    ('compare run1 run1 --metric nonsense', 2, E + "--metric nonsense: not a column of the baseline's records"),
    ("compare run1 run1 --metric ''", 2, E + "--metric : not a column of the baseline's records"),
    ('compare run1 run1 --json --markdown', 2,
     'stepsim compare: error: argument --markdown: not allowed with argument --json'),
    ('compare run1 serve1', 2, E + 'run1 holds run records and serve1 serve runs: compare like with like'),
    ('compare serve1 serve1 --metric ttft_s.p42', 2, E + "--metric ttft_s.p42: not a column of the baseline's records"),
    ('compare run1 run1', 0, 'no metric worse by more than 1 %'),
    ('sweep sw_enum.toml --out s', 2,
     E + "sw_enum.toml (task tiling=diagonal): config key 'tiling' must be one of 'static', 'dynamic', got "
         "'diagonal'"),  # *
    ('sweep sw_nan.toml --out s', 2,
     E + "sw_nan.toml (task tile_m=nan): config key 'tile_m' must be an int >= 1, got nan"),  # *
    ('sweep sw_inf.toml --out s', 2,
     E + "sw_inf.toml (task tile_m=inf): config key 'tile_m' must be an int >= 1, got inf"),  # *
    ('sweep sw_float.toml --out s', 2,
     E + "sw_float.toml (task tile_m=16.5): config key 'tile_m' must be an int >= 1, got 16.5"),  # *
    ('sweep sw_axes_scalar.toml --out s', 2,
     E + 'sw_axes_scalar.toml: [axes] tile_m must be a list, a range {start, stop, step|factor} or {glob = '
         '"..."}, got 16'),
    ('sweep sw_mode.toml --out s', 2,
     E + "sw_mode.toml: mode must be one of metrics, simulate, functional, check, got 'fastest'"),
    ('sweep sw_workload.toml --out s', 2,
     E + "sw_workload.toml: unknown workload 'conv2d' (expected one of moe, swiglu, attention, "
         'prefill_attention, mla_attention, mla_prefill, sliding_attention, decoder, collective), or serve for a serving sweep'),
    ('sweep sw_top.toml --out s', 2,
     E + "sw_top.toml: unknown key 'mood' (did you mean 'mode'?); known keys: workload, mode, out, "
         'partition_by, report, fixed, axes'),
    ('sweep empty.toml --out s', 2,
     E + "empty.toml: missing key 'workload' (one of moe, swiglu, attention, prefill_attention, mla_attention, mla_prefill, "
         'sliding_attention, decoder, collective)'),
    ('sweep junk.toml --out s', 2,
     E + "junk.toml: not valid TOML: 'utf-8' codec can't decode byte 0x80 in position 128: invalid start byte"),
    ('sweep dir.toml --out s', 2, E + "cannot read sweep file dir.toml: [Errno 21] Is a directory: 'dir.toml'"),
    ('sweep pipe.toml --out s', 2,
     E + 'pipe.toml: is a named pipe, not a regular file; give a sweep file (reading it could wait forever)'),
    ('sweep ss_latency_nan.toml --out s', 2,
     E + 'ss_latency_nan.toml (task max_seqs=8): iteration_latency must be a finite number, got nan'),
    ('sweep ss_latency_inf.toml --out s', 2,
     E + 'ss_latency_inf.toml (task max_seqs=8): iteration_latency must be a finite number, got inf'),
    ('sweep ss_latency_huge.toml --out s', 2,
     E + 'ss_latency_huge.toml (task max_seqs=8): --iteration-latency must be at most 2**32 s (about 136 '
         'years; beyond it float64 seconds are coarser than a microsecond), got 1e+308'),
    ('sweep ss_seqs_zero.toml --out s', 2,
     E + 'ss_seqs_zero.toml (task max_seqs=0): --max-seqs must be a positive integer, got 0'),
    ('sweep ss_unknown.toml --out s', 2,
     E + "ss_unknown.toml: unknown key 'max_seq' in [axes] (did you mean 'max_seqs'?); known keys: model, "
         'requests, arrival_scale, arrival, limit_requests, duration, hardware, scheduler, max_seqs, '
         'max_batch_tokens, chunk_tokens, routing, fidelity, slo, seed, iteration_latency, hbm_bytes, '
         'block_size, drop_long, truncate_long, schedule'),
    ('sweep ss_scheduler.toml --out s', 2,
     E + "ss_scheduler.toml (task scheduler=fifo): scheduler must be one of vllm, sarathi, orca, got 'fifo'"),
    ('sweep ss_string.toml --out s', 2,
     E + "ss_string.toml (task max_seqs=8): iteration_latency must be a number, got '0.02'"),
    ('sweep ss_no_requests.toml --out s', 2,
     E + "ss_no_requests.toml: 'requests' is needed in [fixed] or in every [axes] table"),
    ('sweep sw_enum.toml --out s --executor ray', 2,
     "stepsim sweep: error: argument --executor: invalid choice: 'ray' (choose from 'local', 'dask')"),
    ('sweep sw_enum.toml --out s --jobs abc', 2, "stepsim sweep: error: argument --jobs/-j: invalid int value: 'abc'"),
    ('optimize moe --out opt --max-on-chip 0', 2, E + '--max-on-chip must be an integer >= 1, got 0'),
    ('optimize moe --out opt --max-on-chip -1', 2, E + '--max-on-chip must be an integer >= 1, got -1'),
    ('optimize moe --out opt --max-on-chip nan', 2,
     "stepsim optimize: error: argument --max-on-chip: invalid int value: 'nan'"),
    ('optimize moe --out opt --max-on-chip abc', 2,
     "stepsim optimize: error: argument --max-on-chip: invalid int value: 'abc'"),
    ('optimize moe --out opt --max-on-chip 1e308', 2,
     "stepsim optimize: error: argument --max-on-chip: invalid int value: '1e308'"),
    ('optimize moe --out opt --max-compute -1', 2, E + '--max-compute must be an integer >= 1, got -1'),
    ('optimize moe --out opt --max-compute nan', 2,
     "stepsim optimize: error: argument --max-compute: invalid int value: 'nan'"),
    ('optimize moe --out opt --max-chips 0', 2, E + '--max-chips must be an integer >= 1, got 0'),
    ('optimize moe --out opt --max-chips 99999999999', 2,
     E + '--max-chips must be at most 4,096 (the most chips a system may have), got 99,999,999,999'),
    ('optimize moe --out opt --objective fastest', 2,
     "stepsim optimize: error: argument --objective: invalid choice: 'fastest' (choose from 'cycles', "
     "'on-chip', 'compute', 'chips')"),
    ('optimize moe --out opt --space space_unknown.toml', 2,
     E + "space_unknown.toml: unknown key 'tile_nn' in [axes] (did you mean 'tile_n'?); known keys: model, "
         'hidden, intermediate, experts, top_k, trace, iteration, layer, batch_id, tiling, tile_n, tile_f, '
         'tile_m, regions, strategy, softmax, compute_bw, channel_depth, fifo_depths, hardware, convention, '
         'routing, kv_lengths, kv_heads, op, bytes, algorithm, system, ep, placement, tp, layers, pp, '
         'micro_batches, no_fuse, spill'),
    ('optimize moe --out opt --space space_empty.toml', 2, E + 'space_empty.toml: [axes] tile_n has no values'),
    ('optimize moe --out opt --space space_nan.toml', 2,
     E + "space_nan.toml (task tile_n=nan): config key 'tile_n' must be an int >= 1, got nan"),  # *
    ('optimize moe --out opt --space space_type.toml', 2,
     E + "space_type.toml (task tile_n=big): config key 'tile_n' must be an int >= 1, got 'big'"),  # *
    ('optimize moe --out opt --space space_enum.toml', 2,
     E + "space_enum.toml (task tiling=diagonal): config key 'tiling' must be one of 'static', 'dynamic', got "
         "'diagonal'"),  # *
    ('optimize moe --out opt --space space_scalar.toml', 2, E + 'space_scalar.toml: [axes] must be a table, got 5'),
    ('optimize moe --out opt --space empty.toml', 2,
     E + 'empty.toml: no [axes] or [[axes]] table; a space file lists the axes to search'),
    ('optimize moe --out opt --space junk.toml', 2,
     E + "junk.toml: not valid TOML: 'utf-8' codec can't decode byte 0x80 in position 128: invalid start byte"),  # *
    ('optimize moe --out opt --space dir.toml', 2, E + '--space: dir.toml is a folder, not a space file'),
    ('optimize moe --out opt --space missing.toml', 2, E + '--space: space file not found: missing.toml'),
    ('optimize swiglu --out opt', 2, E + "stepsim optimize searches moe, attention, decoder, not 'swiglu'"),
    ('optimize moe --out opt --max-chips 4 --system sys_dotdot.toml', 2,
     E + "--system: sys_dotdot.toml: missing key 'link_bandwidth'"),
    ('optimize moe --out opt --max-chips 4 --system sys_quote.toml', 2,
     E + "--system: sys_quote.toml: missing key 'link_bandwidth'"),
    ('optimize moe --out a_file', 2,
     E + '--out a_file: is a file; give a folder (stepsim writes several files into it)'),
    ('optimize moe --out /proc/opt', 2, E + '--out /proc/opt: cannot write under /proc'),
    ('optimize decoder --out opt', 2,
     E + 'stepsim optimize decoder needs the KV lengths of its decode batch: --kv-lengths PATH'),
    ('size-fifos swiglu --out d.toml --slack nan', 2, E + '--slack must be in [0, 1) (0.01 = 1 %), got nan'),
    ('size-fifos swiglu --out d.toml --slack -1', 2, E + '--slack must be in [0, 1) (0.01 = 1 %), got -1.0'),
    ('size-fifos swiglu --out d.toml --slack inf', 2, E + '--slack must be in [0, 1) (0.01 = 1 %), got inf'),
    ('size-fifos swiglu --out d.toml --min-depth 0', 2, E + '--min-depth must be in 1..1024, got 0'),
    ('size-fifos swiglu --out dir.toml', 2, E + '--out dir.toml: is a folder; give a file name'),
    ('report missing_run', 2, E + 'missing_run: not a folder (give the folder of `stepsim run ... --out DIR`)'),
    ('report a_file', 2, E + 'a_file: not a folder (give the folder of `stepsim run ... --out DIR`)'),
    ('report dir.parquet', 2,
     E + 'dir.parquet: no part-*.parquet file (write a run folder with `stepsim run ... --out dir.parquet`)'),
    ('report junk.parquet', 2,
     E + 'junk.parquet: not a readable Parquet table (cut or damaged? Could not open Parquet input source '
         "'junk.parquet': Parquet magic bytes not found in footer. Either the file is corrupted or this is not "
         'a parquet file.); write the run again with stepsim run --out'),
    ('report run1 --png x.txt', 2, E + '--png x.txt: give a file name ending in .png'),  # *
    ('report run1 --png /proc/x.png', 2, E + '--png /proc/x.png: cannot write under /proc'),  # *
    ('graph show conv2d', 2,
     "stepsim graph show: error: argument WORKLOAD: invalid choice: 'conv2d' (choose from moe, swiglu, "
     'attention, prefill_attention, mla_attention, mla_prefill, sliding_attention, decoder, collective, '
     'path/to/file.py:function or path/to/model.onnx)'),
    ('graph show moe --trace junk.npz', 2,
     E + "junk.npz: not a NumPy .npz archive (its first bytes are b'\\x00\\x01\\x02\\x03'); save the array with "
         'numpy savez'),
    ('graph show moe --trace dir.npz', 2, E + 'dir.npz: folder holds no .npz, .npy, .parquet or .arrow trace files'),
    ('graph show moe --tile-n 0', 2, E + '--tile-n must be an int >= 1, got 0'),
    ('graph draw moe', 2, "stepsim graph: error: argument SUBCOMMAND: invalid choice: 'draw' (choose from 'show')"),
    ('trace inspect cut_end.parquet', 2,
     E + 'cut_end.parquet: not a readable parquet file: Parquet magic bytes not found in footer. Either the '
         'file is corrupted or this is not a parquet file.'),
    ('trace inspect cut_end.arrow', 2,
     E + 'cut_end.arrow: not a readable arrow file: Expected to read 1330795073 metadata bytes, but only read '
         '477'),
    ('trace inspect empty.parquet', 2, E + 'empty.parquet: not a readable parquet file: Parquet file size is 0 bytes'),
    ('trace inspect empty.arrow', 2,
     E + 'empty.arrow: not a readable arrow file: Tried reading schema message, was null or length 0'),
    ('trace inspect empty.csv', 2, E + 'empty.csv: empty file (0 bytes; expected a CSV header and rows)'),
    ('trace inspect empty.npz', 2,
     E + "empty.npz: not a NumPy .npz archive (its first bytes are b''); save the array with numpy savez"),
    ('trace inspect empty.npy', 2,
     E + "empty.npy: not a NumPy .npy file (its first bytes are b''); save the array with numpy save"),
    ('trace inspect junk.csv', 2,
     E + 'junk.csv: not a CSV text file: its first bytes are not UTF-8 text '
         "(b'\\x00\\x01\\x02\\x03\\x04\\x05\\x06\\x07')"),
    ('trace inspect junk.npy', 2,
     E + "junk.npy: not a NumPy .npy file (its first bytes are b'\\x00\\x01\\x02\\x03\\x04\\x05'); save the array "
         'with numpy save'),
    ('trace inspect dir.parquet', 2, E + 'dir.parquet: folder holds no .npz, .npy, .parquet or .arrow trace files'),
    ('trace inspect kv_nan.npy', 2, E + 'kv_nan.npy: array has dtype float64, expected integer KV lengths'),
    ('trace inspect kv_inf.npy', 2, E + 'kv_inf.npy: array has dtype float64, expected integer KV lengths'),
    ('trace inspect kv_frac.npy', 2, E + 'kv_frac.npy: array has dtype float64, expected integer KV lengths'),
    ('trace inspect req.csv --tile 0', 2, E + '--tile must be a positive integer, got 0'),
    ('trace inspect r8.npz --num-experts 0', 2, E + '--num-experts must be a positive integer, got 0'),
    ('trace inspect r8.npz --num-experts 4', 2,
     E + "r8.npz: row 2, column 'expert_ids': expert id 4 at position 0 is out of range [0, 4)"),
    ('trace inspect r8.npz --format csv', 2,
     "stepsim trace inspect: error: argument --format: invalid choice: 'csv' (choose from 'npz', 'npy', "
     "'azure-csv', 'arrow', 'parquet')"),
    ('trace import cut_end.parquet --out x.parquet', 2,
     E + 'cut_end.parquet: not a readable parquet file: Parquet magic bytes not found in footer. Either the '
         'file is corrupted or this is not a parquet file.'),
    ('trace import req.csv --out dir.parquet', 2, E + '--out dir.parquet: is a folder; give a file name'),
    ('trace import req.csv --out req.csv', 2,
     E + "output 'req.csv': suffix must be one of .arrow, .feather, .ipc, .parquet, .pq"),
    ("trace import req.csv --out ''", 2, E + '--out: empty path'),
    ('trace import-routed routed_2d.npy --model qwen --out x.arrow', 2,
     E + "routed_2d.npy: array 'array' has shape [4, 2], expected 3 axes [tokens, layers, top_k]"),
    ('trace import-routed routed_neg.npy --model qwen --out x.arrow', 2,
     E + "routed_neg.npy: array 'array' has top_k = 2 (last axis), but model 'qwen' routes each token to 8 "
         'experts'),
    ('trace import-routed routed_float.npy --model qwen --out x.arrow', 2,
     E + "routed_float.npy: array 'array' has dtype float32, expected integer expert ids"),
    ('trace import-routed junk.npy --model qwen --out x.arrow', 2,
     E + "junk.npy: not a NumPy .npy file (its first bytes are b'\\x00\\x01\\x02\\x03\\x04\\x05'); save the array "
         'with numpy save'),
    ('trace import-routed empty.npy --model qwen --out x.arrow', 2,
     E + "empty.npy: not a NumPy .npy file (its first bytes are b''); save the array with numpy save"),
    ('trace import-routed routed_neg.npy --model gpt5 --out x.arrow', 2,
     E + "routed_neg.npy: array 'array': the number of experts is unknown; give --num-experts or --model (a "
         'preset, alias or config.json)'),
    ('trace import-routed routed_neg.npy --num-experts 0 --out x.arrow', 2,
     E + 'num_experts must be a positive integer, got 0'),
    ('trace synth routing --model mixtral --tokens 10 --seed 1 --out x.arrow --alpha nan --skew dirichlet', 2,
     E + 'Dirichlet concentration alpha must be a finite number > 0, got nan'),
    ('trace synth routing --model mixtral --tokens 10 --seed 1 --out x.arrow --alpha inf --skew dirichlet', 2,
     E + 'Dirichlet concentration alpha must be a finite number > 0, got inf'),  # *
    ('trace synth routing --model mixtral --tokens 10 --seed 1 --out x.arrow --skew normal', 2,
     "stepsim trace synth routing: error: argument --skew: invalid choice: 'normal' (choose from "
     "'uniform', 'dirichlet', 'zipf')"),
    ('trace synth routing --model mixtral --tokens 10 --seed 1 --out x.arrow --batch 0', 2,
     E + '--batch must be a positive integer, got 0'),
    ('trace synth routing --model mixtral --tokens 10 --seed 1 --out x.arrow --top-k 9', 2,
     E + '--top-k 9 conflicts with --model mixtral (top_k 2)'),
    ('trace synth routing --model mixtral --tokens 10 --seed 1 --out x.arrow --top-k 0', 2,
     E + '--top-k 0 conflicts with --model mixtral (top_k 2)'),
    ('trace synth routing --num-experts 0 --top-k 1 --tokens 10 --seed 1 --out x.arrow', 2,
     E + '--num-experts must be a positive integer, got 0'),
    ('trace synth routing --model mixtral --tokens 1e3 --seed 1 --out x.arrow', 2,
     "stepsim trace synth routing: error: argument --tokens: invalid int value: '1e3'"),
    ('trace synth kv --batch 4 --batches 0 --seed 1 --out x.arrow', 2,
     E + '--batches must be a positive integer, got 0'),
    ('trace synth kv --batch 4 --batches 99999999999 --seed 1 --out x.arrow', 2,
     E + '--batches must be at most 2,147,483,647 (traces store int32 values), got 99999999999'),
    ('trace synth kv --batch 4 --seed 1 --out x.arrow --distribution junk.csv', 2,
     E + 'junk.csv: not a CSV text file: its first bytes are not UTF-8 text '
         "(b'\\x00\\x01\\x02\\x03\\x04\\x05\\x06\\x07')"),
    ('trace synth kv --batch 4 --seed 1 --out x.arrow --distribution pipe.csv', 2,
     E + 'pipe.csv: is a named pipe, not a regular file; give a trace file (reading it could wait forever)'),
    ('trace synth kv --batch 4 --seed 1 --out x.txt', 2,
     E + "output 'x.txt': suffix must be one of .arrow, .feather, .ipc, .parquet, .pq"),
    ('run moe --trace cut_end.arrow', 2,
     E + 'cut_end.arrow: not a readable arrow file: Expected to read 1330795073 metadata bytes, but only read '
         '477'),
    ('run moe --trace empty.npz', 2,
     E + "empty.npz: not a NumPy .npz archive (its first bytes are b''); save the array with numpy savez"),
    ('run moe --trace dir.npz', 2, E + 'dir.npz: folder holds no .npz, .npy, .parquet or .arrow trace files'),
    ('run attention --trace kv_nan.npy', 2, E + 'kv_nan.npy: array has dtype float64, expected integer KV lengths'),
    ('run attention --trace kv_inf.npy', 2, E + 'kv_inf.npy: array has dtype float64, expected integer KV lengths'),
    ('run attention --trace kv_huge.npy', 2,
     E + 'this run needs up to 7.78e+18 engine events, about 90,071,993 days at 1e+06 events/s; the limit is '
         '1e+09 (check the model dimensions), --force runs it anyway'),
    ('run attention --trace kv_frac.npy', 2, E + 'kv_frac.npy: array has dtype float64, expected integer KV lengths'),
    ('run moe --bytes 0', 2, E + '--bytes must be an int >= 1, got 0'),
    ('run collective --bytes 0', 2, E + '--bytes must be an int >= 1, got 0'),
    ('run collective --bytes -4', 2, E + '--bytes must be an int >= 1, got -4'),
    ('run collective --bytes nan', 2, "stepsim run: error: argument --bytes: invalid int value: 'nan'"),
    ('run collective --bytes 1e308', 2, "stepsim run: error: argument --bytes: invalid int value: '1e308'"),
    ('run collective --bytes 99999999999999999999', 2,
     E + '--bytes must be at most 2,147,483,647 (2**31 - 1), got 99999999999999999999'),
    ('run collective --system ring-0', 2,
     E + "unknown system preset 'ring-0'; known presets: fully-connected-8, ring-2, ring-4, ring-8, sn40l-16, "
         'sn40l-8, switch-8, torus-4x4'),
    ('run collective --system ring-1', 2,
     E + "unknown system preset 'ring-1'; known presets: fully-connected-8, ring-2, ring-4, ring-8, sn40l-16, "
         'sn40l-8, switch-8, torus-4x4'),
    ('run collective --system sys_chips_nan.toml', 2,
     E + 'sys_chips_nan.toml: chips must be an int in 1..2147483647 (chips), got nan'),
    ('run collective --system sys_unknown.toml', 2,
     E + "sys_unknown.toml: unknown system key 'link_bandwith'; known keys: chips, dimension, hardware, link, "
         'link_bandwidth, link_latency, name, topology'),
    ('run collective --system sys_topology.toml', 2, E + "sys_topology.toml: missing key 'link_bandwidth'"),
    ('run collective --system zero.toml', 2,
     E + 'zero.toml: is a character device, not a regular file; give a system file (reading it could wait '
         'forever)'),
    ('run moe --ep 0', 2, E + '--ep must be an int >= 1, got 0'),
    ('run moe --tp 0', 2, E + '--tp must be an int >= 1, got 0'),
    ('run moe --layers 0', 2, E + '--layers must be an int >= 1, got 0'),
    ('run moe --layers 100000', 2,
     E + "--layers must be at most 1,024 (each one's operators are built in memory before the run), got 100000"),
    ('run moe --pp 2', 2, E + '--pp 2 needs --system FILE|PRESET (the chips and links the stages run on)'),
    ('run moe --micro-batches 0', 2, E + '--micro-batches must be an int >= 1, got 0'),
    ('run swiglu --layers 2 --pp 3 --system ring-3', 2,
     E + "unknown system preset 'ring-3'; known presets: fully-connected-8, ring-2, ring-4, ring-8, sn40l-16, "
         'sn40l-8, switch-8, torus-4x4'),
    ('run moe --channel-depth 1e3', 2, "stepsim run: error: argument --channel-depth: invalid int value: '1e3'"),
    ('run moe --compute-bw nan', 2, "stepsim run: error: argument --compute-bw: invalid int value: 'nan'"),
    ('run moe --hardware hw_nan.toml', 2,
     E + "hw_nan.toml: hardware 'sn40l': clock_hz must be a positive int, got nan"),
    ('run moe --hardware hw_string.toml', 2,
     E + "hw_string.toml: hardware 'sn40l': hbm_channels must be a positive int, got '8'"),
    ('run moe --hardware hw_float.toml', 2,
     E + "hw_float.toml: hardware 'sn40l': hbm_channels must be a positive int, got 8.5"),
    ('run moe --hardware dir.toml', 2,
     E + "cannot read hardware config dir.toml: [Errno 21] Is a directory: 'dir.toml'"),
    ('run moe --fifo-depths junk.toml', 2,
     E + "junk.toml: not a valid TOML file: 'utf-8' codec can't decode byte 0x80 in position 128: invalid "
         'start byte'),
    ('run moe --fifo-depths empty.toml', 2,
     E + 'empty.toml: not a FIFO depths file (needs [workload] with a fingerprint and [channels]; write one '
         'with stepsim size-fifos)'),
    ('run moe --fifo-depths dir.toml', 2, E + 'dir.toml: cannot read FIFO depths file: Is a directory'),
    ('run moe --deadlock-report /proc/x.json', 2, E + '--deadlock-report /proc/x.json: cannot write under /proc'),
    ('run moe --timeline dir.json', 2, E + '--timeline dir.json: is a folder; give a file name'),
    ('run moe --timeline a_file/t.json', 2, E + '--timeline a_file/t.json: a_file is a file, not a folder'),
    ('run moe --model m_nan.json', 2,
     E + "model file m_nan.json: field 'hidden_size' must be an integer >= 1, got nan"),
    ('run moe --model m_float.json', 2,
     E + "model file m_float.json: field 'hidden_size' must be an integer >= 1, got 256.5"),
    ('run moe --model m_false.json --json', 2,
     E + "no bundled trace for 'm_false.json'; pass --trace PATH (config key 'trace')"),
    ('run moe --model m_zero.json', 2,
     E + "model file m_zero.json: field 'num_hidden_layers' must be an integer >= 1, got 0"),
    ('run moe --model m_topk.json', 2,
     E + "model file m_topk.json: field 'num_experts_per_tok' = 32 exceeds the 16 experts"),
    ('run decoder --model qwen --routing r8.npz --kv-lengths kv_nan.npy', 2,
     E + 'kv_nan.npy: array has dtype float64, expected integer KV lengths'),
    ('run decoder --model qwen --routing r8.npz --kv-lengths kv_frac.npy', 2,
     E + 'kv_frac.npy: array has dtype float64, expected integer KV lengths'),
    ('run decoder --kv-heads 0 --routing r8.npz --kv-lengths kv_frac.npy', 2,
     E + '--kv-heads must be an int >= 1, got 0'),
    ('run prefill_attention --tile-m 0', 2, E + '--tile-m must be an int >= 1, got 0'),
    ('run swiglu --tile-m 3', 2, E + 'tile_m must be a positive divisor of 64, got 3'),
    ('run swiglu --out "it\'s \\"q\\""', 0, 'wrote channels: it\'s "q"/_channels-8a05a8ea82dbd556.parquet'),
    ('run "../../x.py:f"', 2, E + "program '../../x.py:f': no such file ../../x.py"),
    ('run "x.py:"', 2, E + "program 'x.py:': expected path/to/file.py:function"),
    ('run "junk.npy:f"', 2,
     "stepsim run: error: argument WORKLOAD: invalid choice: 'junk.npy:f' (choose from moe, swiglu, "
     'attention, prefill_attention, mla_attention, mla_prefill, sliding_attention, decoder, collective, '
     'path/to/file.py:function or path/to/model.onnx)'),
    ('run moe --placement load-balanced', 2,
     E + '--placement and --system apply to the MoE layer with --ep N (expert parallelism)'),
    ('run moe --convention paper2', 2,
     "stepsim run: error: argument --convention: invalid choice: 'paper2' (choose from 'published', "
     "'paper')"),
    ('reproduce serving-validation --out a_file', 2,
     E + '--out a_file: is a file; give a folder (stepsim writes several files into it)'),
    ('reproduce serving-validation --out /proc/x', 2, E + '--out /proc/x: cannot write under /proc'),
    ('reproduce serving-validation --out v.parquet', 2,
     E + '--out v.parquet: give a folder, not a .parquet file name (this command writes several files into it)'),
    ('reproduce serving-validation --out o --jobs 0', 2,
     E + '--jobs does not apply to reproduce serving-validation: it serves one request per published figure in '
         'this process, from the bundled model configs'),  # *
    ('reproduce serving-validation --out o --fifo-depths junk.toml', 2,
     E + '--fifo-depths does not apply to reproduce serving-validation: it serves one request per published '
         'figure in this process, from the bundled model configs'),  # *
    ('reproduce serving-validation --out o --traces missing', 2,
     E + '--traces does not apply to reproduce serving-validation: it serves one request per published figure '
         'in this process, from the bundled model configs'),  # *
    ('reproduce serving-validation --out o --fifo-depths pipe.toml', 2,
     E + '--fifo-depths does not apply to reproduce serving-validation: it serves one request per published '
         'figure in this process, from the bundled model configs'),  # *
    ('reproduce all --traces a_file --out o', 2,
     E + 'a_file: traces folder not found (expected expert_routing/<mixtral|qwen>_b<B>/*.npz and '
         'kv_lengths/b<B>/<trace>_stdev<SSSS>_<start>_<end>.npy, as in ../shared/traces)'),
    ('reproduce all --traces dir.toml --out o', 2,
     E + 'dir.toml/expert_routing: folder not found in the traces folder dir.toml (expected '
         'expert_routing/<mixtral|qwen>_b<B>/*.npz and kv_lengths/b<B>/<trace>_stdev<SSSS>_<start>_<end>.npy, '
         'as in ../shared/traces)'),
    ('server start --idle-timeout 0', 2, E + '--idle-timeout must be a positive number of seconds, got 0.0'),
    ('server start --idle-timeout -1', 2, E + '--idle-timeout must be a positive number of seconds, got -1.0'),
    ('server start --idle-timeout 1e308', 2,
     E + '--idle-timeout must be at most 2**32 s (about 136 years; beyond it float64 seconds are coarser than '
         'a microsecond), got 1e+308'),
    ('server start --wait 0', 2, E + '--wait must be a positive number of seconds, got 0.0'),
    ('server start --wait abc', 2, "stepsim server start: error: argument --wait: invalid float value: 'abc'"),
    ('server stop --all --now', 2, E + 'unrecognized arguments: --now'),
    ('demo --out /proc/x', 2, E + '--out /proc/x: cannot write under /proc'),
    ("demo --out ''", 2, E + '--out: empty path'),
    ('cache warm --jobs 2', 2, E + 'unrecognized arguments: --jobs 2'),
    ('cache clear', 2, "stepsim cache: error: argument ACTION: invalid choice: 'clear' (choose from 'warm')"),
    ('serve --model small.json --requests "it\'s \\"quoted\\".csv" --out o --iteration-latency 0.02 --max-seqs 0', 2,
     E + '--max-seqs must be a positive integer, got 0'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --slo ttft=4295000000s', 2,
     E + "--slo 'ttft=4295000000s': ttft must be at most 2**32 s (about 136 years; beyond it float64 seconds "
         'are coarser than a microsecond)'),
    ('serve --model small.json --requests req.csv --out o --iteration-latency 0.02 --slo tpot=1e300ms', 2,
     E + "--slo 'tpot=1e300ms': tpot must be at most 2**32 s (about 136 years; beyond it float64 seconds are "
         'coarser than a microsecond)'),
    ('report run1 --png a_file/x.png', 2, E + '--png a_file/x.png: a_file is a file, not a folder'),
    ("report run1 --png ''", 2, E + '--png : give a file name ending in .png'),
    ('reproduce serving-validation --out o --force', 2,
     E + '--force does not apply to reproduce serving-validation: it serves one request per published figure '
         'in this process, from the bundled model configs'),
    ('trace synth routing --model mixtral --tokens 10 --seed 1 --out x.arrow --alpha inf --skew zipf', 2,
     E + 'Zipf exponent alpha must be a finite number >= 0, got inf'),
    ('trace synth routing --model mixtral --tokens 10 --seed 1 --out x.arrow --alpha -1 --skew zipf', 2,
     E + 'Zipf exponent alpha must be a finite number >= 0, got -1.0'),
    ('models show m_huge.json --json', 2,
     E + "model file m_huge.json: field 'hidden_size' must be at most 2,147,483,647 (2**31 - 1), got "
         '1000000000000000000000000000000'),
    ('map ffn --model m_huge.json --shape 1', 2,
     E + "model file m_huge.json: field 'hidden_size' must be at most 2,147,483,647 (2**31 - 1), got "
         '1000000000000000000000000000000'),
    ('run moe --model m_huge.json', 2,
     E + "model file m_huge.json: field 'hidden_size' must be at most 2,147,483,647 (2**31 - 1), got "
         '1000000000000000000000000000000'),
    ('optimize block.onnx --out opt --max-compute -5', 2,
     E + '--max-compute does not apply to optimize of an .onnx model: every tiling of a lowered model '
         'allocates the same compute (compute_bw per node)'),
    ('optimize block.onnx --out opt --jobs 0', 2,
     E + '--jobs does not apply to optimize of an .onnx model: the tile search simulates in this process, one '
         'tiling after another'),
    ('optimize block.onnx --out opt --max-chips 0', 2,
     E + '--max-chips does not apply to optimize of an .onnx model: the tile search runs on one chip (no '
         'tensor or expert parallelism of a lowered model)'),
    ('compare pipe.parquet run1', 2,
     E + 'pipe.parquet: is a named pipe, not a regular file; give a records file (reading it could wait '
         'forever)'),
    ('compare run1 zero.parquet', 2,
     E + 'zero.parquet: is a character device, not a regular file; give a records file (reading it could wait '
         'forever)'),
    ('run attention --schedule pipe.json', 2,
     E + '--schedule: pipe.json: is a named pipe, not a regular file; give a schedule file (reading it could '
         'wait forever)'),
    ('metrics moe --schedule dir.json', 2,
     E + "--schedule: cannot read schedule file dir.json: [Errno 21] Is a directory: 'dir.json'"),
    # stepsim plan (merged after the audit): every flag's range, the SLO, the files it reads, --out
    ('plan --model small.json --requests req.csv --out p --slo ttft=2s,tpot=100ms --max-chips 0', 2,
     E + '--max-chips must be an integer in 1..4096, got 0'),
    ('plan --model small.json --requests req.csv --out p --slo ttft=2s,tpot=100ms --max-chips -3', 2,
     E + '--max-chips must be an integer in 1..4096, got -3'),
    ('plan --model small.json --requests req.csv --out p --slo ttft=2s,tpot=100ms --percentile 0', 2,
     E + '--percentile must be a number in (0, 100], got 0.0'),
    ('plan --model small.json --requests req.csv --out p --slo ttft=2s,tpot=100ms --percentile 100.5', 2,
     E + '--percentile must be a number in (0, 100], got 100.5'),
    ('plan --model small.json --requests req.csv --out p --slo ttft=2s,tpot=100ms --percentile nan', 2,
     E + '--percentile must be a number in (0, 100], got nan'),
    ('plan --model small.json --requests req.csv --out p --slo ttft=nan,tpot=100ms', 2,
     E + "--slo 'ttft=nan,tpot=100ms': cannot parse 'ttft=nan'; expected KEY=NUMBER(s|ms) with KEY "
         'ttft, tpot or e2e, e.g. ttft=2s,tpot=200ms'),
    ('plan --model small.json --requests req.csv --out p --slo bogus=1s', 2,
     E + "--slo 'bogus=1s': cannot parse 'bogus=1s'; expected KEY=NUMBER(s|ms) with KEY ttft, tpot or e2e, "
         'e.g. ttft=2s,tpot=200ms'),
    ('plan --model small.json --requests req.csv --out p', 2,
     'stepsim plan: error: the following arguments are required: --slo'),
    ('plan --model small.json --requests req.csv --out p --slo ttft=2s --rate 0', 2,
     E + '--rate must be a positive finite number, got 0.0'),
    ('plan --model small.json --requests req.csv --out p --slo ttft=2s --rate inf', 2,
     E + '--rate must be a positive finite number, got inf'),
    ('plan --model small.json --requests req.csv --out p --slo ttft=2s --arrival-scale -1', 2,
     E + '--arrival-scale must be a positive finite number, got -1.0'),
    ('plan --model small.json --requests req.csv --out p --slo ttft=2s --rate 1 --arrival-scale 2', 2,
     'stepsim plan: error: argument --arrival-scale: not allowed with argument --rate'),
    ('plan --model small.json --requests junk.csv --out p --slo ttft=2s', 2,
     E + "junk.csv: not a CSV text file: its first bytes are not UTF-8 text "
         "(b'\\x00\\x01\\x02\\x03\\x04\\x05\\x06\\x07')"),
    ('plan --model small.json --requests dir.csv --out p --slo ttft=2s', 2,
     E + 'dir.csv: a request trace is one file, not a folder'),
    ('plan --model small.json --requests req.csv --out p --slo ttft=2s --space junk.toml', 2,
     E + "--space junk.toml: not valid TOML: 'utf-8' codec can't decode byte 0x80 in position 128: "
         'invalid start byte'),
    ('plan --model small.json --requests req.csv --out p --slo ttft=2s --hardware nosuch', 2,
     E + "--hardware must be a preset (sn40l, step-eval, step-hdl) or a .toml file, got 'nosuch'"),
    ('plan --model small.json --requests req.csv --out p --slo ttft=2s --limit-requests 0', 2,
     E + '--limit-requests must be an integer >= 2 (a rate needs two arrivals), got 0'),
    ('plan --model small.json --requests req.csv --slo ttft=2s --out a_file', 2,
     E + '--out a_file: is a file; give a folder (stepsim writes several files into it)'),
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("audit")
    write_audit_files(d)
    write_audit_products(d)
    return d


@pytest.mark.parametrize(("command", "status", "line"), CASES, ids=[c[0] for c in CASES])
def test_audit_case(folder, monkeypatch, capsys, command, status, line):
    monkeypatch.chdir(folder)
    monkeypatch.setenv("STEPSIM_SERVER", "off")
    before = set(folder.rglob("*"))
    capsys.readouterr()
    try:
        code = main(shlex.split(command))
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    captured = capsys.readouterr()
    new = sorted(set(folder.rglob("*")) - before, key=lambda p: -len(p.parts))
    for p in new:  # a successful case's outputs (an error's would fail below)
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    assert "Traceback" not in captured.err
    stream = captured.err if status != 0 else captured.out
    assert (code, stream.strip().splitlines()[-1]) == (status, line.replace("{d}", str(folder)))
    if status != 0:
        assert [str(p.relative_to(folder)) for p in new] == []  # nothing written, not even a folder


def test_the_audit_holds_at_least_300_cases_on_every_command():
    from stepsim.cli import COMMANDS

    assert len(CASES) >= 300
    commands = {shlex.split(c)[0] for c, _, _ in CASES}
    assert commands == set(COMMANDS) - {"cache"} | {"cache"} & commands
    assert {"map", "serve", "compare", "sweep", "optimize", "reproduce", "models"} <= commands
