"""Every integer code shared between :mod:`stepsim.kernels.program` and the numba kernels.

Plain module-level Python ints: numba freezes them as compile-time constants, so changing a value here
invalidates numba's on-disk cache automatically (the cache keys on this file's source too, via the importing
kernel modules' dependencies) -- run ``stepsim cache warm`` after editing.

Contents
--------
* ``NEVER``: the "no time / infinitely far" sentinel (``INT64_MAX``).
* Opcodes ``OP_*`` (one per builder method of :class:`stepsim.kernels.program.ProgramBuilder`).
* Function codes ``FN_*`` for Map / Accum / MapAccum / Scan (docs/timing_model.md §3.3).
* Token layout: the columns ``TK_*`` of a token, the flag bits ``FLAG_*`` and the element kinds ``KIND_*``.
* Channel slot layout ``SL_*`` (a token plus its arrival stamp and its credit-free time).
* Channel state columns ``CH_*``, unit state columns ``US_*``, unit parameter columns ``UP_*``/``PA_*``.
* Unit status / wait kinds ``WAIT_*`` and engine status codes ``ST_*``.
* Hardware vector layout ``HW_*``.

Token layout (one row of int64 words; a channel slot is ``[stamp, credit_free] + token``)::

    TK_STOP     stop level: 0 = Val, k >= 1 = ValStop(k)
    TK_FLAGS    bit 0 read_from_mu, bit 1 pad (Reshape padding), bit 2 selector-in-CSR; bits 8..11 element kind
    TK_BYTES    bytes per element (2 = bf16, 4 = f32, 8 = u64, 1 = bool/selector byte)
    TK_ROWS     tile rows (selector: 1; buffer: number of buffered elements)
    TK_COLS     tile cols (selector: number of targets; buffer: buffered rank b)
    TK_OFFSET   valid-row count of a tile (RetileRow packing, filtering RowStreamify) or the KV-append row
                offset set by SetOffset; buffer: id of the Bufferize unit that owns the arena region
    TK_PAYLOAD  tile: functional-mode arena handle (-1 in timing mode); scalar (u64 / bool): the value;
                selector: the single target (inline, -1 = empty) or, with FLAG_SEL_CSR, the element index e
                into the program's selector CSR (targets = sel_idx[sel_ptr[e]:sel_ptr[e+1]]);
                buffer: the ring position of the buffer's first element in its Bufferize arena region
"""

from __future__ import annotations

#: "never" / "no event" time sentinel (cycles)
NEVER = 9223372036854775807

# ------------------------------------------------------------------------------------------------ opcodes
OP_SELECT_GEN = 1
OP_METADATA_GEN = 2
OP_SINK = 3
OP_OFFCHIP_LOAD = 4
OP_DYN_OFFCHIP_LOAD = 5
OP_RANDOM_OFFCHIP_LOAD = 6
OP_OFFCHIP_STORE = 7
OP_RANDOM_OFFCHIP_STORE = 8
OP_BUFFERIZE = 9
OP_STREAMIFY = 10
OP_DYN_STREAMIFY = 11
OP_MAP = 12
OP_ACCUM = 13
OP_MAP_ACCUM = 14
OP_SCAN = 15
OP_PARTITION = 16
OP_REASSEMBLE = 17
OP_EAGER_MERGE = 18
OP_PARALLELIZE = 19
OP_BROADCAST = 20
OP_FLATTEN = 21
OP_PROMOTE = 22
OP_RESHAPE = 23
OP_EXPAND_REF = 24
OP_REPEAT_STATIC = 25
OP_ROW_STREAMIFY = 26
OP_EXPERT_ADDR_GEN = 27
OP_CACHE_READ_ADDR_GEN = 28
OP_FILTER_LAST_TILE = 29
OP_LINK = 30  # a link between two chips (kernels.units_link): serializes by bandwidth, adds latency
N_OPCODES = 31

OPCODE_NAMES = {
    OP_SELECT_GEN: "SelectGen", OP_METADATA_GEN: "MetadataGen", OP_SINK: "Sink",
    OP_OFFCHIP_LOAD: "OffChipLoad", OP_DYN_OFFCHIP_LOAD: "DynOffChipLoad",
    OP_RANDOM_OFFCHIP_LOAD: "RandomOffChipLoad", OP_OFFCHIP_STORE: "OffChipStore",
    OP_RANDOM_OFFCHIP_STORE: "RandomOffChipStore", OP_BUFFERIZE: "Bufferize", OP_STREAMIFY: "Streamify",
    OP_DYN_STREAMIFY: "DynStreamify", OP_MAP: "Map", OP_ACCUM: "Accum", OP_MAP_ACCUM: "MapAccum",
    OP_SCAN: "Scan", OP_PARTITION: "Partition", OP_REASSEMBLE: "Reassemble", OP_EAGER_MERGE: "EagerMerge",
    OP_PARALLELIZE: "Parallelize", OP_BROADCAST: "Broadcast", OP_FLATTEN: "Flatten", OP_PROMOTE: "Promote",
    OP_RESHAPE: "Reshape", OP_EXPAND_REF: "ExpandRef", OP_REPEAT_STATIC: "RepeatStatic",
    OP_ROW_STREAMIFY: "RowStreamify", OP_EXPERT_ADDR_GEN: "ExpertAddrGen",
    OP_CACHE_READ_ADDR_GEN: "CacheReadAddrGen", OP_FILTER_LAST_TILE: "FilterLastTile", OP_LINK: "Link",
}
#: opcodes that act only at the global minimum time (they compare arrival times): the engine's ts_units
TIME_SENSITIVE_OPS = (OP_EAGER_MERGE, OP_LINK)

#: opcodes that talk to the HBM (they register in builder order: readers, then writers)
MEMORY_READ_OPS = (OP_OFFCHIP_LOAD, OP_DYN_OFFCHIP_LOAD, OP_RANDOM_OFFCHIP_LOAD)
MEMORY_WRITE_OPS = (OP_OFFCHIP_STORE, OP_RANDOM_OFFCHIP_STORE)

# ------------------------------------------------------------------------------------------ function codes
FN_MATMUL = 1  # fn_param: 1 = weight transposed ([M,K] x [N,K]); FLOPs 2*M*K*N
FN_ADD = 2  # element-wise with broadcasting; FLOPs R*C of the output
FN_SUB = 3
FN_MUL = 4
FN_DIV = 5
FN_MAX = 6
FN_SILU = 7  # 8*R*C FLOPs
FN_EXP = 8  # 4*R*C FLOPs
FN_ROWSUM = 9  # [R,C] -> [R,1]; R*C FLOPs
FN_ROWMAX = 10
FN_SET_OFFSET = 11  # (tile, u64 offset) -> tile with TK_OFFSET set; 1 cycle
FN_ROW_APPEND = 12  # (tile, row) -> tile; 1 cycle
FN_CACHE_WRITE_ADDR = 13  # (u64 idx, u64 seq_len) -> u64 idx*fn_param + seq_len - 1; 1 cycle
FN_RETILE_ROW = 14  # accumulate rows by concatenation; 0 cycles
FN_RETILE_COL = 15  # accumulate cols by concatenation; 0 cycles
FN_SIGNAL_REQ_ALL_READ = 16  # accumulate to one u64 1x1 signal; 1 cycle
# MapAccum only: (scores [q,n], values [n,d]) folded into [acc | l | m] ([q, d+2]); fn_param = head_dim of the
# 1/sqrt(head_dim) score scale (0: unscaled); FLOPs 2qnd + 8qn + 2qd + 6q (graph.functions.OnlineSoftmax)
FN_ONLINE_SOFTMAX = 17
FN_SOFTMAX_NORMALIZE = 18  # [q, d+2] -> [q, d] = acc / l; FLOPs q*d
# one elementwise function of a tile (and a float32 constant c): fn_param = kind + 256 * (float32 bits of c);
# FLOPs POINTWISE_FLOPS[kind] * R*C (graph.functions.Pointwise); the ONNX front end's unary ops
FN_POINTWISE = 19
N_FUNCTIONS = 20

# Pointwise kinds (fn_param & 0xFF)
PW_NEG = 0  # -x
PW_SQRT = 1  # sqrt(x)
PW_RELU = 2  # max(x, 0)
PW_SIGMOID = 3  # 1 / (1 + exp(-x))
PW_TANH = 4  # tanh(x)
PW_ERF = 5  # erf(x)
PW_GELU = 6  # x * (1 + erf(x / sqrt(2))) / 2
PW_ADD_C = 7  # x + c
PW_MUL_C = 8  # x * c
PW_RSUB_C = 9  # c - x
PW_RDIV_C = 10  # c / x
PW_POW_C = 11  # x ** c
PW_MAX_C = 12  # max(x, c)
PW_MIN_C = 13  # min(x, c)
PW_SUB_C = 14  # x - c
PW_DIV_C = 15  # x / c
#: FLOPs per element of each kind (a transcendental counts 4, as Exp does; SiLU's 8 = sigmoid's 7 + a multiply)
POINTWISE_FLOPS = (1, 4, 1, 7, 7, 4, 8, 1, 1, 1, 1, 4, 1, 1, 1, 1)
POINTWISE_NAMES = ("neg", "sqrt", "relu", "sigmoid", "tanh", "erf", "gelu", "add_c", "mul_c", "rsub_c", "rdiv_c",
                   "pow_c", "max_c", "min_c", "sub_c", "div_c")

FUNCTION_NAMES = {
    FN_MATMUL: "matmul", FN_ADD: "add", FN_SUB: "sub", FN_MUL: "mul", FN_DIV: "div", FN_MAX: "max",
    FN_SILU: "silu", FN_EXP: "exp", FN_ROWSUM: "rowsum", FN_ROWMAX: "rowmax", FN_SET_OFFSET: "set_offset",
    FN_ROW_APPEND: "row_append", FN_CACHE_WRITE_ADDR: "cache_write_addr", FN_RETILE_ROW: "retile_row",
    FN_RETILE_COL: "retile_col", FN_SIGNAL_REQ_ALL_READ: "signal_req_all_read", FN_ONLINE_SOFTMAX: "online_softmax",
    FN_SOFTMAX_NORMALIZE: "softmax_normalize", FN_POINTWISE: "pointwise",
}
#: functions whose cost is FLOPs / compute_bw (compute_bw must be > 0 for them)
FLOP_FUNCTIONS = (FN_MATMUL, FN_ADD, FN_SUB, FN_MUL, FN_DIV, FN_MAX, FN_SILU, FN_EXP, FN_ROWSUM, FN_ROWMAX,
                  FN_ONLINE_SOFTMAX, FN_SOFTMAX_NORMALIZE, FN_POINTWISE)
#: functions taking two operands in a Map
BINARY_FUNCTIONS = (FN_MATMUL, FN_ADD, FN_SUB, FN_MUL, FN_DIV, FN_MAX, FN_SET_OFFSET, FN_ROW_APPEND,
                    FN_CACHE_WRITE_ADDR)
#: functions a MapAccum applies to its two operands (the product is added to the accumulator, except for
#: online_softmax, which folds the operands into it)
MAP_ACCUM_FUNCTIONS = (FN_MATMUL, FN_ADD, FN_SUB, FN_MUL, FN_MAX, FN_ONLINE_SOFTMAX)
#: functions usable as an Accum / Scan fold (acc, x)
ACCUM_FUNCTIONS = (FN_ADD, FN_MUL, FN_MAX, FN_RETILE_ROW, FN_RETILE_COL, FN_SIGNAL_REQ_ALL_READ)

# ----------------------------------------------------------------------------------------------- tokens
TK_STOP = 0
TK_FLAGS = 1
TK_BYTES = 2
TK_ROWS = 3
TK_COLS = 4
TK_OFFSET = 5
TK_PAYLOAD = 6
N_TOKEN = 7

FLAG_MU = 1  # read_from_mu
FLAG_PAD = 2  # Reshape padding element
FLAG_SEL_CSR = 4  # selector payload is a CSR element index (else an inline single target)
KIND_SHIFT = 8
KIND_MASK = 0xF00
KIND_TILE = 0
KIND_SCALAR = 1 << KIND_SHIFT  # u64 metadata / address / bool ack, value in TK_PAYLOAD
KIND_SELECTOR = 2 << KIND_SHIFT
KIND_BUFFER = 3 << KIND_SHIFT

# ------------------------------------------------------------------------------------ channel slot rows
SL_STAMP = 0  # arrival time of the element (cycles)
SL_FREE = 1  # time the slot's credit is back at the sender (dequeue time + credit latency)
SL_TOKEN = 2  # first token column; token column k is at SL_TOKEN + k
SL_SENT = SL_TOKEN + N_TOKEN  # sender's clock at the enqueue, after its credit wait (peak occupancy)
N_SLOT = SL_SENT + 1

# --------------------------------------------------------------------------------- channel state columns
CH_HEAD = 0  # number of dequeues so far
CH_TAIL = 1  # number of enqueues so far (= pushes counter)
CH_CLOSED = 2  # 1 once the producer finished
CH_CLOSE_TIME = 3  # producer's final clock
CH_PEAK = 4  # peak occupancy (elements; timestamp definition, see channels.settle_peak)
CH_CAP = 5
CH_LAT = 6
CH_CREDIT_LAT = 7
CH_BASE = 8  # first row of the channel's slots in the slot array
CH_PRODUCER = 9
CH_CONSUMER = 10
CH_PK_NEXT = 11  # peak occupancy: first send whose occupancy is not known yet
CH_PK_OLDEST = 12  # peak occupancy: oldest element that may still hold a slot at that send
CH_HEAD_ROW = 13  # slot row of the head element (base + head % cap), kept so pop/peek need no division
CH_TAIL_ROW = 14  # slot row the next send writes (base + tail % cap)
CH_END = 15  # base + cap: one past the channel's last slot row (where the ring rows wrap)
# a Link's view of its transfers, kept per transfer on its input channel so that its decision time is recomputed
# only for the transfers whose channels changed (kernels.units_link.link_decision_time)
CH_LK_VAL = 16  # on a Link's input: the transfer's ready time as link_event_time counts it (NEVER: none)
CH_LK_NEXT = 17  # on a Link's input: the next input on the Link's list of changed ones (-1: the last; -2: not on
# it); channels.push / pop and the closes put a transfer on it (channels.link_transfer_changed)
CH_LK_CLOSED = 18  # on a Link's input: 1 once it is closed and empty (counted in the Link's closed inputs)
CH_LK_OUT = 19  # on a Link's input: the output channel of the same transfer (-1: not a Link's input)
CH_LK_IN = 20  # on a Link's output: the input channel of the same transfer (-1: not a Link's output)
CH_LK_FIRST = 21  # on a Link's input: the Link's first input channel, whose CH_LK_HEAD heads that list
CH_LK_HEAD = 22  # on a Link's first input: the first input on the Link's list of changed ones (-1: none)
CH_LK_K = 23  # on a Link's input: its transfer's index k (input k, output k)
# a Link's tree of its transfers' least ready times (kernels.units_link._tree_node): internal node i of its n
# transfers' tree on input i's row when i < n, else on input i - n's
CH_LK_TREE_LO = 24
CH_LK_TREE_HI = 25
N_CH = 26

# ------------------------------------------------------------------------------------ unit state columns
US_CLOCK = 0
US_PHASE = 1  # state-machine phase (opcode specific, 0 = start of a firing)
US_DONE = 2
US_WAIT_CH = 3  # channel the unit waits on (-1: none)
US_WAIT_KIND = 4  # WAIT_* below
US_FIRES = 5
US_BUSY = 6  # cycles added by the unit itself (compute, PMU, HBM round trips, +1 steps)
US_BLOCKED_IN = 7  # cycles the clock jumped to input stamps
US_BLOCKED_OUT = 8  # cycles the clock jumped to credit-free times
US_IN_WORKLIST = 9
US_R0 = 10  # 16 scratch registers US_R0 .. US_R0+15
N_REGS = 16
US_TOK_A = US_R0 + N_REGS  # stashed token A (N_TOKEN words): pending / accumulator tile
US_TOK_B = US_TOK_A + N_TOKEN  # stashed token B
# a time-sensitive unit's last computed decision time, and whether it still holds (1): the event loop clears the
# flag of every unit that steps and of the units across its channels (kernels.engine.event_loop)
US_TS_TIME = US_TOK_B + N_TOKEN
US_TS_FRESH = US_TS_TIME + 1
N_US = US_TS_FRESH + 1

# unit counters exported by the engine: [fires, busy, blocked_in, blocked_out, final clock]
CNT_FIRES = 0
CNT_BUSY = 1
CNT_BLOCKED_IN = 2
CNT_BLOCKED_OUT = 3
CNT_CLOCK = 4
N_CNT = 5

# channel counters exported by the engine: [pushes, peak occupancy]
CCNT_PUSHES = 0
CCNT_PEAK = 1

# ---------------------------------------------------------------------------------------------- wait kinds
WAIT_NONE = 0
WAIT_EMPTY = 1  # blocked on an empty input channel
WAIT_FULL = 2  # blocked on a full output channel
WAIT_HBM = 3  # a memory op waiting for its tile's responses
WAIT_TIME = 4  # a time-sensitive unit (EagerMerge deciding) waiting for the global time
WAIT_NAMES = {WAIT_NONE: "none", WAIT_EMPTY: "empty", WAIT_FULL: "full", WAIT_HBM: "hbm", WAIT_TIME: "time"}

# step() return codes
STEP_BLOCKED = 0
STEP_DONE = 1
STEP_TIME = 2  # yields to the time-sensitive scheduler
STEP_READY = 3  # not a step result: await_input's "an element is there"

# ----------------------------------------------------------------------------------------- engine status
ST_OK = 0
ST_DEADLOCK = 1
ST_MAX_EVENTS = 2
ST_ARENA_FULL = 3  # a Bufferize arena region overflowed; ST_ARG = the unit
ST_BAD_STOP = 4  # a stop level an operator cannot accept (step-perf panics); ST_ARG = the unit
ST_MISMATCH = 5  # two lock-stepped inputs disagree (stop levels / one closed early); ST_ARG = the unit
ST_CAUSALITY = 6  # internal: a request scheduled before the HBM's processed horizon; ST_ARG = the unit
ST_BAD_SELECTOR = 7  # a selector target out of range; ST_ARG = the unit
ST_VALUES = 8  # functional mode: the value arena failed (details in fi, see kernels.values)
STATUS_NAMES = {ST_OK: "ok", ST_DEADLOCK: "deadlock", ST_MAX_EVENTS: "max_events", ST_ARENA_FULL: "arena_full",
                ST_BAD_STOP: "bad_stop", ST_MISMATCH: "mismatch", ST_CAUSALITY: "causality",
                ST_BAD_SELECTOR: "bad_selector", ST_VALUES: "values"}

# engine scalar outputs (the int64 vector returned next to the arrays)
OUT_STATUS = 0
OUT_STATUS_ARG = 1
OUT_EVENTS = 2
OUT_CYCLES = 3
OUT_BYTES_READ = 4
OUT_BYTES_WRITTEN = 5
OUT_N_RECORDED = 6
OUT_FIRES = 7
OUT_HBM_REQUESTS = 8  # HBM requests served
OUT_HBM_CLOSED_FORM_TICKS = 9  # HBM ticks served in closed form (whole periods, see kernels.hbm)
OUT_HBM_UNEVEN_TICKS = 10  # of those, ticks of periods whose channels moved by different amounts
OUT_TS_SCANS = 11  # scans of the time-sensitive units' decision times (the event loop reuses one while no unit steps)
OUT_TS_EVALS = 12  # of the time-sensitive units' decision times those scans read, the ones computed afresh
N_OUT = 13

# ---------------------------------------------------------------------------------- unit parameter table
UP_OPCODE = 0
UP_IN_START = 1  # first index into in_ch (== in_ptr[u])
UP_N_IN = 2
UP_OUT_START = 3
UP_N_OUT = 4
UP_MEM_PRIORITY = 5  # rank in its chip's HBM (readers in builder order, then writers); -1 if not a memory op
UP_A0 = 6  # opcode-specific parameters PA_* (index relative to UP_A0)
N_PARAMS_OP = 14
UP_CHIP = UP_A0 + N_PARAMS_OP  # the chip a unit is on (0 on one chip); a memory op uses that chip's HBM
N_UP = UP_CHIP + 1

# opcode-specific parameter slots (add UP_A0). Payload offsets/lengths index Program.payload.
PA_TILE_ROWS = 0  # memory ops
PA_TILE_COLS = 1
PA_ELEM_BYTES = 2
PA_PAR_DISPATCH = 3
PA_VIEW_OFF = 4  # view_shape dims (outermost first) in payload
PA_VIEW_LEN = 5
PA_ACK_ON_WADDR = 6
PA_N_TILES = 7  # product of the view shape
PA_RESIDENT = 8  # OffChipLoad / OffChipStore: 1 = the tensor is resident in on-chip memory (no HBM, 0 own cycles)

PA_FN = 0  # compute ops
PA_FN_PARAM = 1
PA_COMPUTE_BW = 2
PA_WRITE_BACK = 3
PA_RANK = 4  # also used by routing / buffer / shape ops
PA_INIT_ROWS = 5
PA_INIT_COLS = 6
PA_INIT_BYTES = 7

PA_SWITCH_OFF = 5  # routing ops: per-port switch cycles in payload (length = number of ports)

PA_SHAPE_OFF = 0  # sources: static stream shape in payload
PA_SHAPE_LEN = 1
PA_N_ELEMS = 2
PA_VALUES_OFF = 3  # metadata_gen values / select_gen first CSR element
PA_N_TARGETS = 4  # select_gen selector width

PA_MIN_RANK = 0  # flatten
PA_MAX_RANK = 1
PA_PROMOTE_OUTER = 1  # promote: 1 if the promoted dim is the outermost (needs the next element)
PA_CHUNK = 0  # reshape
PA_PAD_ROWS = 1
PA_PAD_COLS = 2
PA_PAD_BYTES = 3
# PA_RANK = 4 shared
PA_ADD_OUTER = 5
PA_RESHAPE_WB = 6
PA_COUNT = 0  # repeat_static
PA_SPLIT_ROWS = 0  # row_streamify
PA_FILTER = 1
PA_NEW_DIM = 2  # 1: rows form a new innermost dim (FlatMap); 0: merged into the innermost dim (Retile)
PA_TILES_PER_TARGET = 0  # expert_addr_gen
PA_BASE = 1
PA_ROW_OFFSET = 0  # cache_read_addr_gen
PA_REPEAT_OFF = 0  # streamify repeat factors in payload
PA_REPEAT_LEN = 1
PA_REPEAT_PROD = 2
PA_REPEAT_RANK = 0  # dyn_streamify
PA_BUF_RANK = 1
PA_LINK_BW = 0  # link: bandwidth (bytes/cycle, >= 1)
PA_LINK_LAT = 1  # link: latency (cycles, >= 1) from the end of an element's serialization to its arrival
PA_ARENA_BASE = 8  # bufferize: arena region [base, base + size)
PA_ARENA_SIZE = 9

# -------------------------------------------------------------------------------------- hardware vector
HW_ADDR_OFFSET = 0  # bytes per HBM request
HW_HBM_CHANNELS = 1
HW_HBM_LATENCY = 2  # cycles
HW_HBM_INIT_INTERVAL = 3  # cycles between two requests on one channel
HW_HBM_START_UP = 4  # cycles, charged on every request
HW_PMU_BW = 5  # on-chip bytes/cycle
N_HW = 6
