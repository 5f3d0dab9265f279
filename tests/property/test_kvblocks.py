"""Stateful test of the numba KV block pool against the reference BlockPool.

Tiny capacities, keys drawn from a small set so hash-table slots collide, and every invariant
checked after every rule: KV used <= capacity, a block is free iff nobody holds it, the free
queue is in the same LRU order as the reference (a chain freed whole, `release_chain`, read as
the blocks it stands for), and the prefix cache maps exactly the same hashes to the same blocks.
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
alloc_block, cache_block, ht_find, release_block, release_chain, touch_block = (
    njit(_nrt=False)(f.py_func) for f in (kvblocks.alloc_block, kvblocks.cache_block, kvblocks.ht_find,
                                          kvblocks.release_block, kvblocks.release_chain, kvblocks.touch_block))
KEYS = st.integers(1, 12).map(lambda k: np.uint64(k * 8 + (k % 3)))  # many share a home slot


class BlockPoolMachine(RuleBasedStateMachine):
    @initialize(num_blocks=st.integers(1, 9))
    def setup(self, num_blocks):
        engine = NumbaEngine(make_inputs([0], [1], [1], kv_blocks=(num_blocks,)))
        self.blocks, self.reps = engine.blocks, engine.reps
        self.model = BlockPool(num_blocks)
        self.holders: list[list[int]] = []  # blocks each simulated request holds, in order

    @rule(count=st.integers(1, 4))
    def allocate(self, count):
        if count > self.model.num_free:
            return
        got = [int(alloc_block(self.blocks, self.reps, 0)) for _ in range(count)]
        assert got == [self.model.allocate() for _ in range(count)]
        self.holders.append(got)

    @precondition(lambda self: self.holders)
    @rule(data=st.data(), key=KEYS)
    def cache(self, data, key):
        holder = data.draw(st.sampled_from(self.holders))
        block = data.draw(st.sampled_from(holder))
        if self.model.hash_of[block] is not None:
            return  # a block is hashed once, when it fills
        cache_block(self.blocks, self.reps, 0, block, key)
        self.model.cache(block, int(key))

    @rule(key=KEYS)
    def hit(self, key):
        found = int(ht_find(self.blocks, self.reps.htab_off[0], self.reps.htab_mask[0], key))
        expected = self.model.lookup(int(key))
        assert found == (-1 if expected is None else expected)
        if expected is not None:
            touch_block(self.blocks, self.reps, 0, found)
            self.model.touch(expected)
            self.holders.append([expected])

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def release(self, data):
        holder = self.holders.pop(data.draw(st.integers(0, len(self.holders) - 1)))
        for block in reversed(holder):
            release_block(self.blocks, self.reps, 0, block)
            self.model.release(block)

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def finish(self, data):
        """A request's own blocks, none cached nor shared, freed whole as a chain (as grow_request
        links them: each block's cprev the one allocated before it)."""
        k = data.draw(st.integers(0, len(self.holders) - 1))
        holder = self.holders[k]
        if any(self.model.hash_of[b] is not None or self.model.ref[b] != 1 for b in holder):
            return
        self.holders.pop(k)
        for prev, b in zip(holder, holder[1:]):
            self.blocks.cprev[b] = prev
        release_chain(self.blocks, self.reps, 0, holder[-1], len(holder))
        for block in reversed(holder):
            self.model.release(block)

    def free_order(self):
        """The free queue from its head, each chain expanded into the blocks it stands for."""
        order, b = [], int(self.reps.free_head[0])
        while b >= 0:
            order.append(b)
            ref = int(self.blocks.ref[b])
            assert ref == 0 or ref <= -2  # a linked free block is free, or heads a chain of -ref
            c = b
            for _ in range(-ref - 1):
                c = int(self.blocks.cprev[c])
                order.append(c)
            b = int(self.blocks.fnext[b])
        return order

    @invariant()
    def accounting_matches(self):
        total = self.model.num_blocks
        nfree = int(self.reps.nfree[0])
        assert 0 <= nfree <= total
        assert nfree == self.model.num_free
        held = sum(len(h) for h in self.holders)
        assert total - nfree <= held  # shared hits count once in the pool
        held = [b for b in range(total) if self.model.ref[b] > 0]
        assert [int(self.blocks.ref[b]) for b in held] == [self.model.ref[b] for b in held]
        # Walk the free queue: same blocks, same LRU order, and exactly the unreferenced ones.
        order = self.free_order()
        assert order == list(self.model.free)
        assert set(order) == {b for b in range(total) if self.model.ref[b] == 0}

    @invariant()
    def cache_matches(self):
        off, mask = self.reps.htab_off[0], self.reps.htab_mask[0]
        for key, block in self.model.cached.items():
            assert int(ht_find(self.blocks, off, mask, np.uint64(key))) == block
        keys = {int(k) for k in self.blocks.htab_key if k != 0}
        assert keys == set(self.model.cached)
        for b in range(self.model.num_blocks):
            assert int(self.blocks.key[b]) == (self.model.hash_of[b] or 0)


TestBlockPool = BlockPoolMachine.TestCase
