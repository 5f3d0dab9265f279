"""Stateful test of the numba KV block pool against the reference BlockPool.

Tiny capacities, keys drawn from a small set so hash-table slots collide, and every invariant
checked after every rule: KV used <= capacity, a block is free iff nobody holds it, the prefix
cache maps the same hashes to the same blocks, and the free queue evicts the same cached blocks
at the same allocations as the reference's one LRU queue: its cached free blocks in the same
order, with as many uncached free blocks before each. Which uncached block an allocation takes
is not observable and differs (engine/kvblocks.py takes the most recently freed), so block ids
are compared through a map from the reference's ids to the engine's, made as blocks are taken.
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
alloc_block, cache_block, ht_find, release_block, release_chain, take_uncached, touch_block = (
    njit(_nrt=False)(f.py_func) for f in (kvblocks.alloc_block, kvblocks.cache_block, kvblocks.ht_find,
                                          kvblocks.release_block, kvblocks.release_chain, kvblocks.take_uncached,
                                          kvblocks.touch_block))
KEYS = st.integers(1, 12).map(lambda k: np.uint64(k * 8 + (k % 3)))  # many share a home slot


class BlockPoolMachine(RuleBasedStateMachine):
    @initialize(num_blocks=st.integers(1, 9))
    def setup(self, num_blocks):
        engine = NumbaEngine(make_inputs([0], [1], [1], kv_blocks=(num_blocks,)))
        self.blocks, self.reps = engine.blocks, engine.reps
        self.model = BlockPool(num_blocks)
        self.ids: dict[int, int] = {}  # the reference's block -> the engine's, for blocks held or cached
        self.holders: list[list[int]] = []  # the reference's blocks each simulated request holds, in order

    @rule(count=st.integers(1, 4))
    def allocate(self, count):
        if count > self.model.num_free:
            return
        taken = []
        for _ in range(count):
            head = next(iter(self.model.free))
            cached = self.model.hash_of[head] is not None
            got = int(alloc_block(self.blocks, self.reps, 0))
            assert self.model.allocate() == head
            if cached:
                assert got == self.ids[head]  # the same cached block evicted
            else:
                assert got not in self.ids.values()  # an uncached free block
            self.ids[head] = got
            taken.append(head)
        self.holders.append(taken)

    @rule(count=st.integers(1, 6))
    def allocate_run(self, count):
        """take_uncached, as grow_request takes a request's blocks: uncached ones only, as many
        as the top stack entry (or the blocks never taken) has and the queue's head allows, linked
        first to last; none when the head is cached. Each one stands for the reference's next."""
        if count > self.model.num_free:
            return
        first, last, got = (int(v) for v in take_uncached(self.blocks, self.reps, 0, np.int64(-1), np.int64(count)))
        run, b = [], last
        for _ in range(got):
            run.append(b)
            b = int(self.blocks.cprev[b])
        run.reverse()
        assert 0 <= got <= count and b == -1 and (got == 0 or run[0] == first)
        head = next(iter(self.model.free))
        assert (got == 0) == (self.model.hash_of[head] is not None)
        taken = []
        for engine_block in run:
            assert self.model.hash_of[next(iter(self.model.free))] is None  # no eviction
            block = self.model.allocate()
            assert engine_block not in self.ids.values()
            self.ids[block] = engine_block
            taken.append(block)
        if taken:
            self.holders.append(taken)

    @precondition(lambda self: self.holders)
    @rule(data=st.data(), key=KEYS)
    def cache(self, data, key):
        holder = data.draw(st.sampled_from(self.holders))
        block = data.draw(st.sampled_from(holder))
        if self.model.hash_of[block] is not None:
            return  # a block is hashed once, when it fills
        cache_block(self.blocks, self.reps, 0, self.ids[block], key)
        self.model.cache(block, int(key))

    @rule(key=KEYS)
    def hit(self, key):
        found = int(ht_find(self.blocks, self.reps.htab_off[0], self.reps.htab_mask[0], key))
        expected = self.model.lookup(int(key))
        assert found == (-1 if expected is None else self.ids[expected])
        if expected is not None:
            touch_block(self.blocks, self.reps, 0, found)
            self.model.touch(expected)
            self.holders.append([expected])

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def release(self, data):
        holder = self.holders.pop(data.draw(st.integers(0, len(self.holders) - 1)))
        for block in reversed(holder):
            release_block(self.blocks, self.reps, 0, self.ids[block])
            self.model.release(block)
            if self.model.ref[block] == 0 and self.model.hash_of[block] is None:
                del self.ids[block]  # free and uncached: any uncached block stands for it

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def finish(self, data):
        """A request's own blocks, none cached nor shared, freed as one chain (linked as
        grow_request links them: each block's cprev the one taken before it)."""
        k = data.draw(st.integers(0, len(self.holders) - 1))
        holder = self.holders[k]
        if any(self.model.hash_of[b] is not None or self.model.ref[b] != 1 for b in holder):
            return
        self.holders.pop(k)
        for prev, block in zip(holder, holder[1:]):
            self.blocks.cprev[self.ids[block]] = self.ids[prev]
        release_chain(self.blocks, self.reps, 0, self.ids[holder[-1]], len(holder), self.ids[holder[0]])
        for block in reversed(holder):
            self.model.release(block)
            del self.ids[block]

    @invariant()
    def accounting_matches(self):
        total = self.model.num_blocks
        nfree = int(self.reps.nfree[0])
        assert 0 <= nfree <= total
        assert nfree == self.model.num_free
        held = sum(len(h) for h in self.holders)
        assert total - nfree <= held  # shared hits count once in the pool
        for block in range(total):
            if self.model.ref[block] > 0:
                assert int(self.blocks.ref[self.ids[block]]) == self.model.ref[block]
        assert len(set(self.ids.values())) == len(self.ids)

    @invariant()
    def free_queue_matches(self):
        """Cached free blocks linked in the reference's LRU order, each after as many uncached
        free blocks as there; the uncached ones stacked from utop (a chain freed whole read as
        the blocks it stands for), then those never taken, all unheld and unhashed."""
        linked, gaps, run = [], [], 0
        for block in self.model.free:
            if self.model.hash_of[block] is None:
                run += 1
            else:
                linked.append(self.ids[block])
                gaps.append(run)
                run = 0
        order, b = [], int(self.reps.free_head[0])
        while b >= 0:
            order.append(b)
            b = int(self.blocks.fnext[b])
        assert order == linked
        assert [int(self.blocks.gap[b]) for b in order] == gaps
        assert int(self.blocks.tgap[0]) == run
        stack, b = [], int(self.blocks.utop[0])
        while b >= 0:
            stack.append(b)
            ref = int(self.blocks.ref[b])
            assert ref == 0 or ref <= -2  # free, or a chain of -ref blocks (stale refs past b)
            c = b
            for _ in range(-ref - 1):
                c = int(self.blocks.cprev[c])
                stack.append(c)
            b = int(self.blocks.fnext[b])
        stack += range(int(self.blocks.fresh[0]), self.model.num_blocks)  # never taken yet
        assert len(stack) == len(set(stack)) == sum(gaps) + run
        assert not set(stack) & set(self.ids.values())
        assert all(int(self.blocks.key[b]) == 0 for b in stack)

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
