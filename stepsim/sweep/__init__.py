"""Parameter sweeps: expand a sweep file into tasks, run them in parallel, resume, record failures.

``stepsim sweep SWEEP.toml`` (see :mod:`stepsim.sweep.cli`). The pieces, one purpose each:

* :mod:`~stepsim.sweep.config` reads and checks the sweep file (format in its docstring);
* :mod:`~stepsim.sweep.grid` expands it into plain-dict tasks with stable keys and finds finished ones;
* :mod:`~stepsim.sweep.tasks` is what a worker runs for one task (a failure becomes a row, not an exception);
* :mod:`~stepsim.sweep.executors` / :mod:`~stepsim.sweep.dask_executor` run tasks on local worker processes
  or a Dask cluster.
"""

from stepsim.sweep.config import SweepSpec, load_sweep, parse_sweep
from stepsim.sweep.grid import Task, expand
from stepsim.sweep.rows import read_sweep
from stepsim.sweep.runner import SweepReport, SweepStopped, run_sweep
