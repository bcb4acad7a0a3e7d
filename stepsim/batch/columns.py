"""The columns a sweep adds to every record row (its own module: the sweep file's checks name them too)."""

from __future__ import annotations

import pyarrow as pa

#: columns added to every row: outcome, typed error (null when ok), wall time of the task in its worker, and
#: ``task_slot``: which task of the sweep the row is, the same for every generation of the task
#: (:func:`stepsim.batch.grid.slot_key`; its run id changes when its trace or hardware file does)
SWEEP_COLUMNS = pa.schema([
    pa.field("status", pa.string()), pa.field("error_type", pa.string()), pa.field("error_message", pa.string()),
    pa.field("error_traceback", pa.string()), pa.field("task_wall_s", pa.float64(), metadata={"unit": "s"}),
    pa.field("task_slot", pa.string()),
])
