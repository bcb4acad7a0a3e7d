"""The paged KV cache: fixed-size blocks whose number is the HBM left after the weights.

vLLM V1 (vllm/v1/core/kv_cache_manager.py, block_pool.py): the cache is ``num_blocks`` blocks of ``block_size``
tokens; one block is the null block, so ``num_blocks - 1`` are usable. Blocks are interchangeable (no prefix
caching: a resumed request never gets part of its own KV back), so the pool is a count of free blocks and each
request a count of held blocks.

A model whose layers differ in attention kind has one pool per kind (vLLM's hybrid KV cache manager:
``vllm/v1/core/kv_cache_coordinator.py``, one block table per KV cache group): a full-attention (or MLA) layer
keeps every token, a sliding-window layer only the blocks of its window (vLLM's ``SlidingWindowManager`` frees
the blocks that left it). :func:`pooled_capacity` gives the sliding pool what each of ``max_num_seqs`` running
requests can hold at most, ``ceil((window - 1) / block_size) + 1`` blocks (the window's last ``window - 1`` tokens
and the block being written), and the rest of HBM to the full pool, whose blocks the scheduler counts: so
capacity and preemption follow the full layers, and a long context costs the sliding layers nothing more.
vLLM shares one pool among its groups instead; the two agree whenever the sliding blocks are not what runs out.
A prefill chunk's own tokens, which vLLM holds in the sliding group until its step ends, are not set aside.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from stepsim.base.errors import ConfigError

if TYPE_CHECKING:
    from stepsim.serve.memory import KVPool

#: vLLM's default block size on GPUs (tokens; vllm/platforms/cuda.py)
DEFAULT_BLOCK_SIZE = 16


@dataclass(frozen=True)
class KVCapacity:
    """How many KV blocks a model gets.

    Attributes
    ----------
    hbm_bytes, weight_bytes, kv_bytes_per_token : int
        HBM capacity, the model's weights, KV bytes per token of the pool the blocks count (every layer's; with
        sliding layers, the full layers') (bytes).
    block_size : int
        Tokens per block.
    num_blocks : int
        Blocks that fit in ``hbm_bytes - weight_bytes - sliding_pool_bytes``, the null block included.
    sliding_pool_bytes : int
        HBM set aside for the sliding layers' windows (0 without sliding layers; :func:`pooled_capacity`).
    """

    hbm_bytes: int
    weight_bytes: int
    kv_bytes_per_token: int
    block_size: int
    num_blocks: int
    sliding_pool_bytes: int = 0

    @property
    def usable_blocks(self) -> int:
        """Blocks requests can hold: all but the null block."""
        return self.num_blocks - 1

    @property
    def tokens(self) -> int:
        """Tokens the usable blocks hold."""
        return self.usable_blocks * self.block_size


def check_weights_fit(hbm_bytes: int, weight_bytes: int) -> None:
    """Raise a one-line ConfigError when ``weight_bytes`` exceed ``hbm_bytes``, saying by how much."""
    if weight_bytes > hbm_bytes:
        raise ConfigError(f"the model's weights ({weight_bytes / 1e9:.2f} GB) do not fit in HBM "
                          f"({hbm_bytes / 1e9:.2f} GB): {(weight_bytes - hbm_bytes) / 1e9:.2f} GB short; serve it "
                          "on several chips with --system FILE")


def kv_capacity(hbm_bytes: int, weight_bytes: int, kv_bytes_per_token: int,
                block_size: int = DEFAULT_BLOCK_SIZE) -> KVCapacity:
    """The KV cache left in ``hbm_bytes`` after ``weight_bytes`` (all bytes).

    Raises
    ------
    ConfigError
        The weights do not fit, or the rest holds fewer than two blocks (the null block and one usable),
        each saying by how much.
    """
    if block_size < 1:
        raise ConfigError(f"block size must be at least 1 token, got {block_size}")
    check_weights_fit(hbm_bytes, weight_bytes)
    left = hbm_bytes - weight_bytes
    block_bytes = block_size * kv_bytes_per_token
    num_blocks = left // block_bytes
    if num_blocks < 2:
        raise ConfigError(f"HBM left after the weights ({left} bytes) holds {num_blocks} KV block(s) of "
                          f"{block_bytes} bytes; serving needs at least 2 (one is vLLM's null block): "
                          f"{2 * block_bytes - left} bytes short")
    return KVCapacity(hbm_bytes, weight_bytes, kv_bytes_per_token, block_size, int(num_blocks))


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks that hold ``tokens`` tokens: ``ceil(tokens / block_size)``."""
    return -(-tokens // block_size)


def window_blocks(window: int, block_size: int) -> int:
    """Blocks a sliding layer holds at most for one request: the last ``window - 1`` tokens' blocks and the block
    being written, ``ceil((window - 1) / block_size) + 1`` (vLLM's sliding-window spec)."""
    return blocks_for(window - 1, block_size) + 1


def pooled_capacity(hbm_bytes: int, weight_bytes: int, pools: Sequence[KVPool], block_size: int = DEFAULT_BLOCK_SIZE,
                    max_num_seqs: int = 1) -> KVCapacity:
    """The KV cache of a model with one pool per attention kind (module docstring): the sliding pools sized for
    ``max_num_seqs`` requests at their window, the full (or MLA) pool counted in blocks.

    Raises
    ------
    ConfigError
        Every layer slides (no pool grows with the context), or the sliding pools do not fit beside the weights
        (by how much), or as :func:`kv_capacity`.
    """
    full = [p for p in pools if p.window is None]
    if not full:
        raise ConfigError("every layer of the model slides: serving counts the blocks of its full-attention layers, "
                          "and it has none (issue 43)")
    check_weights_fit(hbm_bytes, weight_bytes)  # before the sliding pool: fewer sequences would not help
    sliding = sum(max_num_seqs * window_blocks(p.window, block_size) * block_size * p.bytes_per_token
                  for p in pools if p.window is not None)
    if weight_bytes + sliding > hbm_bytes:
        raise ConfigError(f"the sliding-window layers' KV pool ({sliding / 1e9:.2f} GB: {max_num_seqs} sequences at "
                          f"their window) does not fit beside the weights ({weight_bytes / 1e9:.2f} GB) in HBM "
                          f"({hbm_bytes / 1e9:.2f} GB): {(weight_bytes + sliding - hbm_bytes) / 1e9:.2f} GB short; "
                          "lower --max-seqs")
    capacity = kv_capacity(hbm_bytes - sliding, weight_bytes, sum(p.bytes_per_token for p in full), block_size)
    return replace(capacity, hbm_bytes=hbm_bytes, sliding_pool_bytes=sliding)
