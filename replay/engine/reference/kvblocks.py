"""One replica's KV blocks (`BlockPool`: reference counts, an LRU free queue, a hash -> block
map), and a request's blocks on it (the twin of engine/kvblocks.py).

The KV cache follows `vllm/v1/core/block_pool.py` (LRU free queue, chained block hashes, free
tail first); the block hashes are engine/kvblocks.py's `block_key_ref`.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from replay.engine.reference.state import Replica, Request


class BlockPool:
    """One replica's KV blocks: reference counts, an LRU free queue and a hash -> block map."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.ref = [0] * num_blocks
        self.hash_of: list[int | None] = [None] * num_blocks
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self.cached: dict[int, int] = {}

    @property
    def num_free(self) -> int:
        return len(self.free)

    def lookup(self, key: int) -> int | None:
        return self.cached.get(key)

    def allocate(self) -> int:
        block, _ = self.free.popitem(last=False)
        if self.hash_of[block] is not None:  # evict its cached prefix
            del self.cached[self.hash_of[block]]
            self.hash_of[block] = None
        self.ref[block] = 1
        return block

    def touch(self, block: int) -> None:
        if self.ref[block] == 0:
            del self.free[block]
        self.ref[block] += 1

    def release(self, block: int) -> None:
        self.ref[block] -= 1
        if self.ref[block] == 0:
            self.free[block] = None

    def cache(self, block: int, key: int) -> None:
        if key not in self.cached:  # one block per hash (see engine/kvblocks.py)
            self.cached[key] = block
            self.hash_of[block] = key


class KvMixin:
    """ReferenceEngine's methods over a request's blocks."""

    def _prefix_hits(self, rep: Replica, req: Request, bs: int) -> int:
        hits = 0
        for key in req.keys[: (req.prompt_tokens - 1) // bs]:
            if rep.kv.lookup(key) is None:
                break
            hits += 1
        return hits

    def _cached_prefix(self, rep: Replica, req: Request, bs: int) -> list[int]:
        """Blocks of the request's leading full blocks found in the cache, capped at num_tokens - 1."""
        hits = []
        for key in req.keys[: (req.num_tokens - 1) // bs]:
            block = rep.kv.lookup(key)
            if block is None:
                break
            hits.append(block)
        return hits

    def _blocks_needed(self, req: Request, num_tokens: int, bs: int) -> int:
        return math.ceil(num_tokens / bs) - len(req.blocks)

    def _grow(self, rep: Replica, req: Request, num_tokens: int, bs: int) -> None:
        """Hold `num_tokens` tokens of KV; full blocks join the prefix cache as vLLM does at scheduling."""
        for _ in range(self._blocks_needed(req, num_tokens, bs)):
            req.blocks.append(rep.kv.allocate())
        if req.keys and self.caching[rep.pool]:
            full = num_tokens // bs
            for j in range(req.num_cached_blocks, full):
                rep.kv.cache(req.blocks[j], req.keys[j])
            req.num_cached_blocks = max(req.num_cached_blocks, full)

    def _free(self, rep: Replica, req: Request) -> None:
        for block in reversed(req.blocks):  # tail first: evicted first
            rep.kv.release(block)
        req.blocks = []
        req.num_cached_blocks = 0
