"""Map a mapped step's new buckets on the exact provider's workers, one bucket a worker, before its pieces run.

With ``schedule="auto"`` every piece is built with the schedule mapped at its shape's bucket
(:func:`stepsim.mapping.schedule_for`, :func:`stepsim.mapping.projection.projection_schedule`), and a bucket not yet
mapped is mapped by whoever builds the first piece that needs it. On ``--jobs N`` workers, a step's pieces of one
new bucket (the four FFN layers of the 4-layer Qwen3 shape at the same token count) reach every worker at once, so
every worker ran the same search (minutes for a large FFN bucket) at the same time, and the step's projections, router
and LM head were then mapped one after another in the parent. :func:`map_ahead` lists the step's buckets that neither
this process nor the mapping cache holds, maps each on a worker of its own, and stores the schedules in the parent's
memo; the workers building the pieces then read them from the cache. What a schedule is does not change (the same
search, the same cache key), so neither does any cycle: only who maps it, and that each bucket is mapped once.
"""

from __future__ import annotations

#: a mapping job: ``("layer", kind, bucket size)`` or ``("projection", tokens bucket, d_in, d_out)``
Job = tuple


def step_jobs(provider, batch, tasks: list) -> list[Job]:
    """The mapping jobs of ``tasks`` on ``provider`` (an exact provider with mapped layers): the pieces' ``(kind,
    bucket)`` and, given the step's ``batch`` when its weights run on the engine, its projections' and LM head's
    buckets; in first-use order, each once."""
    from stepsim.mapping.kinds.prefill import prefill_size
    from stepsim.mapping.mapper import bucket
    from stepsim.serve.layers import MAPPED_KINDS, piece_dims
    from stepsim.serve.projections import matrix_rows, provider_projections

    jobs = []
    for kind, data in tasks:
        if kind not in MAPPED_KINDS:
            continue
        size = prefill_size(data, piece_dims(kind, provider.model)) if kind == "prefill" else len(data)
        jobs.append(("layer", kind, bucket(size)))
    if batch is not None and provider.streams_weights:
        tokens = int(sum(batch.new_tokens))
        jobs.append(("layer", "ffn", bucket(tokens)))  # the FFN's tile_n (projections.ffn_tile_n), dense or MoE
        layer, head = provider_projections(provider)  # the matrices step_pieces prices, at its rows
        jobs.extend(("projection", bucket(matrix_rows(provider, name, tokens)), a, b) for name, a, b in layer)
        if head is not None:
            jobs.append(("projection", bucket(len(batch.new_tokens)), head[1], head[2]))
    return list(dict.fromkeys(jobs))


def _located(job: Job, model, hardware) -> tuple[dict, str]:
    """``(the process memo, cache key)`` of ``job``."""
    from stepsim.base.files import stable_hash
    from stepsim.mapping import mapper, projection
    from stepsim.serve.layers import piece_dims

    if job[0] == "layer":
        _, kind, size = job
        return mapper._MEMO, mapper._key(kind, size, piece_dims(kind, model), hardware)
    _, tokens, d_in, d_out = job
    return projection._MEMO, stable_hash(projection.key_material(tokens, d_in, d_out, hardware))


def missing(jobs: list[Job], model, hardware) -> list[Job]:
    """The jobs whose schedule is neither in this process's memo nor a file of the mapping cache."""
    from stepsim.mapping.mapper import _cache_folder

    folder = _cache_folder(True)
    out = []
    for job in jobs:
        memo, key = _located(job, model, hardware)
        if key not in memo and not (folder / f"{key}.json").is_file():
            out.append(job)
    return out


def mapping_cache():
    """The mapping cache folder of this process (``$STEPSIM_MAPPING_CACHE`` or the user's), resolved here and handed
    to :func:`map_job`, so a worker saves where its caller looks whatever its own environment (a local pool's
    workers take the caller's ``STEPSIM_*`` variables, :func:`stepsim.batch.tasks.caller_context`; a folder named
    explicitly does not depend on that)."""
    from stepsim.mapping.mapper import _cache_folder

    return _cache_folder(True)


def map_job(job: Job, model, hardware, cache=True):
    """Map one job (on a worker): its :class:`~stepsim.mapping.Schedule`, saved in the mapping cache ``cache`` (a
    folder, from :func:`mapping_cache` in the caller; ``True``: this process's)."""
    from stepsim.mapping.mapper import map_layer
    from stepsim.mapping.projection import map_projection
    from stepsim.serve.layers import piece_dims

    if job[0] == "layer":
        _, kind, size = job
        return map_layer(kind, size, piece_dims(kind, model), hardware, cache=cache)
    _, tokens, d_in, d_out = job
    return map_projection(tokens, d_in, d_out, hardware, cache=cache)


#: the order jobs are handed out: the longest searches first (an FFN bucket: minutes; a decode bucket: seconds)
ORDER = {"ffn": 0, "projection": 1, "prefill": 2, "decode": 3}


def map_ahead(provider, batch, tasks: list, pool) -> int:
    """Map the missing buckets of ``tasks`` (and of ``batch``'s projections) on ``pool``, one job a worker at a time,
    FFN buckets first (:data:`ORDER`), and keep each schedule in this process's memo. Returns the jobs mapped."""
    held = provider.__dict__.setdefault("_mapped_ahead", set())  # jobs known mapped: no key hashed again
    wanted = [job for job in step_jobs(provider, batch, tasks) if job not in held]
    jobs = missing(wanted, provider.model, provider.hardware)
    held.update(wanted)
    jobs.sort(key=lambda job: ORDER[job[1] if job[0] == "layer" else "projection"])
    cache = mapping_cache()
    futures = [pool.submit(map_job, job, provider.model, provider.hardware, cache) for job in jobs]
    for job, future in zip(jobs, futures):
        memo, key = _located(job, provider.model, provider.hardware)
        memo[key] = future.result()
    return len(jobs)
