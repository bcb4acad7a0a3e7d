"""Parameter sweeps: expand a sweep file into tasks, run them in parallel, resume, record failures.

``stepsim sweep SWEEP.toml`` (see :mod:`stepsim.sweep.cli`). The pieces, one purpose each:

* :mod:`~stepsim.sweep.config` reads and checks the sweep file (format in its docstring);
* :mod:`~stepsim.sweep.grid` expands it (lazily) into plain-dict tasks keyed by their record ``run_id`` (a hash
  of everything that determines the result, trace and hardware file contents included);
* :mod:`~stepsim.sweep.tasks` is what a worker runs for one task (a failure becomes an outcome, not an
  exception);
* :mod:`~stepsim.sweep.executors` / :mod:`~stepsim.sweep.dask_executor` run tasks on warm local worker
  processes or on a Dask cluster;
* :mod:`~stepsim.sweep.rows` turns outcomes into rows (ok or failed, one schema) and reads a folder back;
* :mod:`~stepsim.sweep.store` batches rows into atomically written part files, indexes the finished tasks and
  replaces the rows of tasks whose trace or hardware file changed;
* :mod:`~stepsim.sweep.runner` ties these together (resume, fail-fast, progress bar) and
  :mod:`~stepsim.sweep.summary` prints the end-of-sweep table.

>>> from stepsim.sweep import load_sweep, run_sweep, read_sweep      # doctest: +SKIP
>>> report = run_sweep(load_sweep("sweeps/swiglu.toml"), jobs=4)      # doctest: +SKIP
>>> read_sweep(report.out).to_pandas()                                # doctest: +SKIP
"""

from stepsim.sweep.config import SweepSpec, load_sweep, parse_sweep
from stepsim.sweep.grid import Task, expand
from stepsim.sweep.rows import read_sweep
from stepsim.sweep.runner import SweepReport, SweepStopped, run_sweep
