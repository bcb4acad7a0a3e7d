#!/usr/bin/env bash
# Quick start: `./run.sh demo` runs the main job, `./run.sh test` runs the test suite.
# Each creates ./.venv (Python 3.11+) on first use and installs stepsim into it (editable).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
case "${1:-}" in
  demo)
    .venv/bin/python -m pip install -q -e ".[all]"  # every extra: the README's later commands need them
    shift
    exec .venv/bin/stepsim demo "$@"
    ;;
  test)
    .venv/bin/python -m pip install -q -e ".[dev]"
    shift
    # the layer contracts of docs/architecture.md first (about a second), then the suite on every core, each test
    # file on one worker (the README test runs its commands in order; module fixtures are built once)
    .venv/bin/lint-imports --no-logo --no-cache
    # then ruff (pyproject's rules; undefined names among them: what a merge of two branches can leave behind)
    .venv/bin/ruff check --quiet stepsim tests bench examples
    # the 25 slowest tests are listed at the end: the suite must stay under 15 minutes. The files go to the workers
    # longest first (tests/suite_order.py; xdist's own order, most tests first, left the longest single tests last)
    exec .venv/bin/python -m pytest -n auto --dist loadfile --no-loadscope-reorder --durations=25 "$@"
    ;;
  *)
    echo "usage: ./run.sh demo|test [args...]" >&2
    exit 2
    ;;
esac
