"""The paged KV cache: fixed-size blocks whose number is the HBM left after the weights.

vLLM V1 (vllm/v1/core/kv_cache_manager.py, block_pool.py): the cache is ``num_blocks`` blocks of ``block_size``
tokens; one block is the null block, so ``num_blocks - 1`` are usable. Blocks are interchangeable (no prefix
caching: a resumed request never gets part of its own KV back), so the pool is a count of free blocks and each
request a count of held blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

from stepsim.base.errors import ConfigError

#: vLLM's default block size on GPUs (tokens; vllm/platforms/cuda.py)
DEFAULT_BLOCK_SIZE = 16


@dataclass(frozen=True)
class KVCapacity:
    """How many KV blocks a model gets.

    Attributes
    ----------
    hbm_bytes, weight_bytes, kv_bytes_per_token : int
        HBM capacity, the model's weights, KV bytes per token (bytes).
    block_size : int
        Tokens per block.
    num_blocks : int
        Blocks that fit in ``hbm_bytes - weight_bytes``, the null block included.
    """

    hbm_bytes: int
    weight_bytes: int
    kv_bytes_per_token: int
    block_size: int
    num_blocks: int

    @property
    def usable_blocks(self) -> int:
        """Blocks requests can hold: all but the null block."""
        return self.num_blocks - 1

    @property
    def tokens(self) -> int:
        """Tokens the usable blocks hold."""
        return self.usable_blocks * self.block_size


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
    left = hbm_bytes - weight_bytes
    if left < 0:
        raise ConfigError(f"the model's weights ({weight_bytes / 1e9:.2f} GB) do not fit in HBM "
                          f"({hbm_bytes / 1e9:.2f} GB): {-left / 1e9:.2f} GB short; serve it on several chips "
                          f"with --system FILE")
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
