"""Stateful test of the numba KV block pool's kernels against the reference BlockPool.

Tiny capacities, keys drawn from a small set so hash-table slots collide, and every invariant
checked after every rule: KV used <= capacity, a block is free iff nobody holds it, the prefix
cache maps the same hashes to the same blocks, and the free queue evicts the same cached blocks
at the same allocations as the reference's one LRU queue: its cached free blocks in the same
order, with as many uncached free blocks before each. Blocks are taken by id (take_block) or as
a count (take_counted, as a request's own blocks that nothing can look up: engine/kvblocks.py).
Which uncached block an allocation takes is not observable and differs, so block ids are
compared through a map from the reference's ids to the engine's, for the blocks that have one.
(tests/property/test_kv_requests.py drives the request-level kernels the same way.)
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from numba import njit

from replay.engine import kvblocks
from replay.engine.numba_engine import NumbaEngine
from replay.engine.reference.kvblocks import BlockPool
from tests.strategies import make_inputs

# The engine's inner kernels have no Python entry (no_cpython_wrapper, see replay/engine/loop.py):
# the test calls copies of the same functions that have one.
cache_block, free_counted, ht_find, release_block, take_block, take_counted, touch_block = (
    njit(_nrt=False)(f.py_func) for f in (kvblocks.cache_block, kvblocks.free_counted, kvblocks.ht_find,
                                          kvblocks.release_block, kvblocks.take_block, kvblocks.take_counted,
                                          kvblocks.touch_block))
KEYS = st.integers(1, 12).map(lambda k: np.uint64(k * 8 + (k % 3)))  # many share a home slot


def unused_ids(blocks, reps, r) -> list[int]:
    """Replica r's ids in no use: its stack from utop, then those never used."""
    ids, b = [], int(blocks.utop[r])
    while b >= 0:
        ids.append(b)
        b = int(blocks.fnext[b])
    return ids + list(range(int(blocks.fresh[r]), int(reps.block_off[r] + reps.nblocks[r])))


def free_queue(blocks, reps, r) -> tuple[list[int], list[int], int]:
    """Replica r's cached free blocks in LRU order, the uncached free blocks before each, and after them."""
    order, b = [], int(reps.free_head[r])
    while b >= 0:
        order.append(b)
        b = int(blocks.fnext[b])
    return order, [int(blocks.gap[b]) for b in order], int(blocks.tgap[r])


class BlockPoolMachine(RuleBasedStateMachine):
    @initialize(num_blocks=st.integers(1, 9))
    def setup(self, num_blocks):
        engine = NumbaEngine(make_inputs([0], [1], [1], kv_blocks=(num_blocks,)))
        self.blocks, self.reps = engine.blocks, engine.reps
        self.model = BlockPool(num_blocks)
        self.ids: dict[int, int] = {}  # the reference's block -> the engine's, for those with an id
        # The reference's blocks each simulated request holds, in order, and whether the engine
        # holds them as a count (no ids).
        self.holders: list[tuple[list[int], bool]] = []

    @rule(count=st.integers(1, 4))
    def allocate(self, count):
        if count > self.model.num_free:
            return
        taken = []
        for _ in range(count):
            head = next(iter(self.model.free))
            cached = self.model.hash_of[head] is not None
            got = int(take_block(self.blocks, self.reps, 0))
            assert self.model.allocate() == head
            if cached:
                assert got == self.ids[head]  # the same cached block evicted
            else:
                assert got not in self.ids.values()  # an unused id
            self.ids[head] = got
            taken.append(head)
        self.holders.append((taken, False))

    @rule(count=st.integers(1, 6))
    def allocate_counted(self, count):
        """take_counted: as many blocks as the reference's next `count`, the cached ones among
        them evicted (their ids unused again)."""
        if count > self.model.num_free:
            return
        take_counted(self.blocks, self.reps, 0, np.int64(count))
        taken = []
        for _ in range(count):
            block = self.model.allocate()
            self.ids.pop(block, None)
            taken.append(block)
        self.holders.append((taken, True))

    @precondition(lambda self: any(not counted for _, counted in self.holders))
    @rule(data=st.data(), key=KEYS)
    def cache(self, data, key):
        holder, _ = data.draw(st.sampled_from([h for h in self.holders if not h[1]]))
        block = data.draw(st.sampled_from(holder))
        if self.model.hash_of[block] is not None:
            return  # a block is hashed once, when it fills
        cached = bool(cache_block(self.blocks, self.reps, 0, self.ids[block], key))
        assert cached == (int(key) not in self.model.cached)
        self.model.cache(block, int(key))

    @rule(key=KEYS)
    def hit(self, key):
        found = int(ht_find(self.blocks, self.reps.htab_off[0], self.reps.htab_mask[0], key))
        expected = self.model.lookup(int(key))
        assert found == (-1 if expected is None else self.ids[expected])
        if expected is not None:
            touch_block(self.blocks, self.reps, 0, found)
            self.model.touch(expected)
            self.holders.append(([expected], False))

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def release(self, data):
        holder, counted = self.holders.pop(data.draw(st.integers(0, len(self.holders) - 1)))
        if counted:
            assert all(self.model.hash_of[b] is None and self.model.ref[b] == 1 for b in holder)
            free_counted(self.blocks, self.reps, 0, np.int64(len(holder)))
        for block in reversed(holder):
            if not counted:
                release_block(self.blocks, self.reps, 0, self.ids[block])
            self.model.release(block)
            if self.model.ref[block] == 0 and self.model.hash_of[block] is None:
                self.ids.pop(block, None)  # free and uncached: a count, its id unused

    @invariant()
    def accounting_matches(self):
        total = self.model.num_blocks
        nfree = int(self.reps.nfree[0])
        assert 0 <= nfree <= total
        assert nfree == self.model.num_free
        held = sum(len(h) for h, _ in self.holders)
        assert total - nfree <= held  # shared hits count once in the pool
        for block, b in self.ids.items():
            assert int(self.blocks.ref[b]) == self.model.ref[block]
        assert len(set(self.ids.values())) == len(self.ids)
        # blocks conserved: free, held by id or held as a count, each once
        counted = sum(len(h) for h, c in self.holders if c)
        by_id = sum(1 for block in self.ids if self.model.ref[block] > 0)
        assert nfree + by_id + counted == total

    @invariant()
    def free_queue_matches(self):
        """Cached free blocks linked in the reference's LRU order, each after as many uncached
        free blocks as there; every id neither cached nor held unused, and unhashed."""
        linked, gaps, run = [], [], 0
        for block in self.model.free:
            if self.model.hash_of[block] is None:
                run += 1
            else:
                linked.append(self.ids[block])
                gaps.append(run)
                run = 0
        assert free_queue(self.blocks, self.reps, 0) == (linked, gaps, run)
        unused = unused_ids(self.blocks, self.reps, 0)
        assert len(unused) == len(set(unused)) == self.model.num_blocks - len(self.ids)
        assert not set(unused) & set(self.ids.values())
        assert all(int(self.blocks.key[b]) == 0 for b in unused if b < int(self.blocks.fresh[0]))

    @invariant()
    def cache_matches(self):
        off, mask = self.reps.htab_off[0], self.reps.htab_mask[0]
        for key, block in self.model.cached.items():
            assert int(ht_find(self.blocks, off, mask, np.uint64(key))) == self.ids[block]
        keys = {int(k) for k in self.blocks.htab_key if k != 0}
        assert keys == set(self.model.cached)
        for block, b in self.ids.items():
            assert int(self.blocks.key[b]) == (self.model.hash_of[block] or 0)


TestBlockPool = BlockPoolMachine.TestCase
