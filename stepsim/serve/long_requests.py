"""Requests longer than the engine takes: refused (the default), dropped (``--drop-long``) or with their prompts
truncated (``--truncate-long``), as vLLM's benchmarks sample around a model's context.

The longest sequence is the run's ``max_model_len`` (tokens): the model's ``max_position_embeddings``, capped by
what the KV cache holds for one request (:func:`stepsim.serve.api.max_model_len`). A request is too long when
its prompt + output exceeds it (vLLM's API server rejects such a request with an error).

* default: the first too-long request is refused in one line naming its row and the limit (nothing is dropped
  or shortened silently);
* ``--drop-long``: too-long requests are left out, as ``vllm bench serve`` leaves out dataset samples beyond the
  model's context (its ShareGPT sampler's ``is_valid_sequence``); the others keep their rows' request ids;
* ``--truncate-long``: a too-long request's prompt keeps its last ``max_model_len - output`` tokens (as vLLM's
  ``truncate_prompt_tokens``, which keeps a prompt's last tokens), and its output is left whole, so it fits
  exactly; a request whose output alone leaves no room for one prompt token is refused in one line (only
  ``--drop-long`` serves the trace then).

Both are applied after the trace's shaping (``--limit-requests`` counts requests before any is dropped) and are
reported in the summary's ``long_requests`` (absent without either flag) and the command's second line.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stepsim.base.errors import ConfigError, TraceValueError
from stepsim.trace_io.requests import RequestTrace

#: what to do with a too-long request, by flag
POLICIES = {"drop_long": "drop", "truncate_long": "truncate"}
#: the hint every refusal of a too-long request ends with
HINT = "--drop-long leaves such requests out, --truncate-long shortens their prompts"


@dataclass(frozen=True)
class LongRequests:
    """What a policy did: ``policy`` (``drop`` / ``truncate``), the ``max_model_len`` (tokens), the requests
    ``dropped`` or ``truncated``, and the prompt tokens truncation removed."""

    policy: str
    max_model_len: int
    dropped: int
    truncated: int
    prompt_tokens_removed: int

    def summary(self) -> dict:
        """The summary's ``long_requests`` object."""
        return {"policy": self.policy, "max_model_len": self.max_model_len, "dropped": self.dropped,
                "truncated": self.truncated, "prompt_tokens_removed": self.prompt_tokens_removed}

    def line(self) -> str:
        """The command's line (after ``long``)."""
        if self.policy == "drop":
            return (f"{self.dropped} request(s) dropped: prompt + output beyond {self.max_model_len} tokens "
                    "(--drop-long)")
        return (f"{self.truncated} prompt(s) truncated to fit {self.max_model_len} tokens, "
                f"{self.prompt_tokens_removed} prompt tokens removed (--truncate-long)")


def long_policy(drop_long=False, truncate_long=False) -> str | None:
    """``drop``, ``truncate`` or None from the two flags (bools; one at most)."""
    for key, value in (("drop_long", drop_long), ("truncate_long", truncate_long)):
        if not isinstance(value, (bool, np.bool_)):  # 1 or "yes" would read as true by Python truth
            raise ConfigError(f"--{key.replace('_', '-')} must be true or false, got {value!r}")
    if drop_long and truncate_long:
        raise ConfigError("--drop-long and --truncate-long both handle requests longer than the model takes; give one")
    return "drop" if drop_long else "truncate" if truncate_long else None


def _too_long(trace: RequestTrace, limit: int) -> np.ndarray:
    # compared without adding: prompt + output of two huge counts would wrap around int64 and pass
    return (trace.prompt_tokens > limit) | (trace.output_tokens > limit - trace.prompt_tokens)


def _why(limit: int, capacity, max_position: int | None) -> str:
    if max_position and max_position == limit:
        return f"the model's max_position_embeddings is {max_position}"
    return f"the KV cache holds {capacity.tokens} tokens ({capacity.usable_blocks} blocks of {capacity.block_size})"


def check_fits(trace: RequestTrace, limit: int, capacity, max_position: int | None) -> None:
    """Every request's prompt + output fits ``limit`` tokens (vLLM's API server rejects the others; without
    ``--drop-long`` / ``--truncate-long`` stepsim refuses the trace instead of dropping or shortening requests)."""
    over = _too_long(trace, limit)
    if over.any():
        i = int(np.argmax(over))
        raise TraceValueError(f"{trace.source}: row {i}: prompt {int(trace.prompt_tokens[i])} + output "
                              f"{int(trace.output_tokens[i])} tokens exceed the longest sequence the engine takes, "
                              f"{limit} tokens ({_why(limit, capacity, max_position)}); {HINT}")


def fit_long_requests(trace: RequestTrace, limit: int, capacity, max_position: int | None,
                      policy: str | None) -> tuple[RequestTrace, LongRequests | None]:
    """The trace the engine serves under ``policy`` (module docstring), and what the policy did (None without one).

    Raises
    ------
    TraceValueError
        Without a policy, the first too-long request (row and limit); with ``truncate``, the first request whose
        output alone leaves no room for a prompt token; with ``drop``, a trace whose every request is too long.
    """
    if policy is None:
        check_fits(trace, limit, capacity, max_position)
        return trace, None
    over = _too_long(trace, limit)
    if policy == "drop":
        keep = ~over
        if not keep.any():
            raise TraceValueError(f"{trace.source}: every one of the {len(trace)} requests exceeds the longest "
                                  f"sequence the engine takes, {limit} tokens ({_why(limit, capacity, max_position)}); "
                                  "--drop-long leaves nothing to serve")
        kept = RequestTrace(trace.source, trace.request_id[keep], trace.arrival_s[keep], trace.prompt_tokens[keep],
                            trace.output_tokens[keep])
        return kept, LongRequests("drop", limit, int(over.sum()), 0, 0)
    no_room = trace.output_tokens >= limit
    if no_room.any():
        i = int(np.argmax(no_room))
        raise TraceValueError(f"{trace.source}: row {i}: output {int(trace.output_tokens[i])} tokens alone leave no "
                              f"room for a prompt token in the longest sequence the engine takes, {limit} tokens "
                              f"({_why(limit, capacity, max_position)}); --truncate-long shortens prompts only, "
                              "--drop-long leaves such requests out")
    prompt = np.where(over, limit - trace.output_tokens, trace.prompt_tokens)
    removed = sum(int(a) - int(b) for a, b in zip(trace.prompt_tokens[over], prompt[over]))  # no int64 wrap
    return (RequestTrace(trace.source, trace.request_id, trace.arrival_s, prompt, trace.output_tokens),
            LongRequests("truncate", limit, 0, int(over.sum()), removed))
