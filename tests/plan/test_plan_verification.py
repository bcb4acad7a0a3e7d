"""The recommended deployment's verification (stepsim/plan/api.py ``_verify``; issue 42: "the front re-served with a
fresh calibration and its error reported"): colocated replicas share one fresh calibration, made on the first
replica's requests as plan.json's commands make it (``--calibration-requests``), so the verification is what running
the commands gives; on two local workers that calibration's layer simulations run on both and the verification is
the same to the bit."""

from __future__ import annotations

import numpy as np
from calibration_seeding import SEEDS, seeded_cache
from test_plan import SLO, write_case

import stepsim

SPACE = {"chips_per_replica": [1], "replicas": [2], "routers": ["round-robin"],
         "scheduler": [{"policy": "orca", "max_seqs": [8]}]}


def _made(cache) -> list[str]:
    """The calibrations in ``cache`` that are not seeds: the ones the plan made."""
    return sorted(p.stem for p in cache.glob("*.json") if not (SEEDS / p.name).exists())


def test_replicas_are_re_served_with_one_fresh_calibration(tmp_path):
    model, trace = write_case(tmp_path)
    cache = seeded_cache(tmp_path / "cache")  # the one-chip shape's calibration (the reference run) is a seed
    out = tmp_path / "out"
    plan = stepsim.plan(str(model), trace, slo=SLO, max_chips=2, space=SPACE, calibration_cache=cache, out=out)
    s = plan.summary
    assert s["recommended"]["deployment"] == "2x1ch sn40l round-robin orca seqs 8"
    head = f"stepsim serve --model {model} --requests {out}/replica-"
    tail = "--hardware sn40l --scheduler orca --max-seqs 8 --fidelity fast --schedule auto"
    assert s["commands"] == [
        f"{head}0.parquet {tail} --slo {SLO} --out serve-replica-0",
        f"{head}1.parquet {tail} --calibration-requests {out}/replica-0.parquet --slo {SLO} --out serve-replica-1"]
    # one calibration made, on the first replica's requests: its error is the one reported
    v = s["verification"]
    (fresh,) = _made(cache)
    assert len(v["fidelity_errors"]) == 1
    # the commands' runs (their calibration read from the cache): the verification's numbers
    runs = [stepsim.serve(str(model), out / f"replica-{k}.parquet", fidelity="fast", schedule="auto", slo=SLO,
                          scheduler="orca", max_seqs=8, calibration_cache=cache,
                          calibration_requests=out / "replica-0.parquet" if k else None) for k in (0, 1)]
    assert [r.summary["fidelity"]["calibration"] for r in runs] == [fresh, fresh] and _made(cache) == [fresh]
    assert [r.summary["fidelity"]["error"] for r in runs] == v["fidelity_errors"] * 2
    ttft = np.concatenate([r.requests.column("ttft_s").to_numpy() for r in runs])
    assert v["ttft_p"] == np.percentile(ttft, 99)
    # on two local workers, the fresh calibration made again with its simulations on both: the same verification
    workers = stepsim.plan(str(model), trace, slo=SLO, max_chips=2, space=SPACE, jobs=2,
                           calibration_cache=seeded_cache(tmp_path / "cache2"), out=tmp_path / "workers")
    assert workers.summary["verification"] == v and _made(tmp_path / "cache2") == [fresh]
