"""Stateful test of a replica's requests' KV (engine/kvblocks.py: grow_request, free_request_blocks,
prompt_hits) against the reference engine's (reference/kvblocks.py: KvMixin over a BlockPool).

A handful of requests, some with hashed prompts of two shared prefix families, on a tiny replica
with or without prefix caching: each is admitted (its prefix-cache hits taken first, as
scheduling.join_batch takes them), grows chunk by chunk, and is finished or preempted, in any
order. The engine holds a request's own blocks by id only where they are offered to the cache
as they fill and as a count from its block `counted_from` on; the reference holds every block by
id and caches every full block at once. What must agree after every rule: the hits each
admission finds, the free blocks' count and queue (the same cached blocks, in the same LRU
order, each after as many uncached ones), the prefix cache's keys and blocks, each held block's
references, and the blocks conserved: free + held by id + held as counts = the replica's blocks,
with no id lost or used twice.

One difference is by design: a key of a request's own (past its hashed prefix) that it has not
offered yet, not having been released unfinished, is in the reference's cache and not the
engine's; no other request can look it up and the request itself looks up only while it holds
no blocks, so no lookup can tell. Such "unseen" keys are left out of the comparison (the
reference's free blocks under them count as uncached: evicting one is taking an uncached block).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from numba import njit

from replay.engine import kvblocks
from replay.engine.numba_engine import NumbaEngine
from replay.engine.reference.kvblocks import BlockPool, KvMixin
from tests.property.test_kvblocks import free_queue, unused_ids
from tests.strategies import make_inputs

grow_request, free_request_blocks, prompt_hits, ht_find, touch_block = (
    njit(_nrt=False)(f.py_func) for f in (kvblocks.grow_request, kvblocks.free_request_blocks, kvblocks.prompt_hits,
                                          kvblocks.ht_find, kvblocks.touch_block))
BS, TBS = 4, 8  # engine block, trace block (tokens): a family's 3 shared trace blocks are 6 engine blocks
REQUESTS = st.lists(st.tuples(st.integers(1, 40), st.integers(1, 24), st.integers(-1, 1)), min_size=1, max_size=6)


class Reference(KvMixin):
    """The reference engine's KV methods over one replica (its `caching` per pool)."""

    def __init__(self, caching: bool):
        self.caching = [caching]


class RequestKvMachine(RuleBasedStateMachine):
    @initialize(num_blocks=st.integers(1, 16), caching=st.booleans(), requests=REQUESTS)
    def setup(self, num_blocks, caching, requests):
        prompt, output, families = (list(c) for c in zip(*requests))
        inputs = make_inputs([0] * len(prompt), prompt, output, families=families, trace_block_tokens=TBS,
                             kv_blocks=(num_blocks,), block_size=(BS,), prefix_caching=(int(caching),))
        engine = NumbaEngine(inputs)
        self.rq, self.blocks, self.reps, self.th, self.tbs = engine.rq, engine.blocks, engine.reps, engine.th, engine.tbs
        self.caching = caching
        self.num_blocks = num_blocks
        self.model = Reference(caching)
        self.rep = SimpleNamespace(kv=BlockPool(num_blocks), pool=0)
        full = [(p + o) // BS for p, o in zip(prompt, output)]
        self.keys = [[int(kvblocks.block_key_ref(inputs.trace_hashes, int(inputs.hash_off[q]), int(inputs.hash_len[q]),
                                                 TBS, p, q, j, BS)) for j in range(full[q])]
                     for q, p in enumerate(prompt)]
        self.reqs = [SimpleNamespace(blocks=[], keys=self.keys[q] if caching else [], num_cached_blocks=0,
                                     prompt=p, output=o, tokens=0, generated=0, preemptions=0, state="waiting")
                     for q, (p, o) in enumerate(zip(prompt, output))]

    def _in(self, state):
        return [q for q, req in enumerate(self.reqs) if req.state == state]

    def _unseen(self) -> set[int]:
        """Keys of a request's own that it has not offered (never released unfinished)."""
        unseen = set()
        for q, req in enumerate(self.reqs):
            if req.preemptions == 0:
                unseen.update(self.keys[q][int(kvblocks.shared_blocks.py_func(self.rq, self.tbs, q, BS)):])
        return unseen

    @precondition(lambda self: self._in("waiting"))
    @rule(data=st.data(), chunk=st.integers(1, 24))
    def admit(self, data, chunk):
        """A waiting request joins with its prefix-cache hits and a first chunk, if it fits."""
        q = data.draw(st.sampled_from(self._in("waiting")))
        req = self.reqs[q]
        req.num_tokens = req.prompt + req.generated
        self.rq.generated[q] = req.generated
        hits = self.model._cached_prefix(self.rep, req, BS) if self.caching else []
        nhit = int(prompt_hits(self.rq, self.blocks, self.reps, self.th, self.tbs, BS, 0, q)) if self.caching else 0
        assert nhit == len(hits)
        computed = nhit * BS
        upto = min(computed + chunk, req.num_tokens)
        evictable = sum(self.rep.kv.ref[b] == 0 for b in hits)
        if -(-upto // BS) - nhit + evictable > self.rep.kv.num_free:
            return
        off, mask = self.reps.htab_off[0], self.reps.htab_mask[0]
        for j in range(nhit):
            touch_block(self.blocks, self.reps, 0, ht_find(self.blocks, off, mask, np.uint64(self.keys[q][j])))
            self.rep.kv.touch(hits[j])
        self.rq.nhit[q] = self.rq.nblocks[q] = self.rq.ncached[q] = nhit
        req.blocks, req.num_cached_blocks = list(hits), nhit
        self._grow(q, upto)
        req.state = "running"

    @precondition(lambda self: self._in("running"))
    @rule(data=st.data(), tokens=st.integers(1, 24))
    def grow(self, data, tokens):
        q = data.draw(st.sampled_from(self._in("running")))
        req = self.reqs[q]
        upto = min(req.tokens + tokens, req.prompt + req.output)
        if -(-upto // BS) - len(req.blocks) <= self.rep.kv.num_free:
            self._grow(q, upto)

    def _grow(self, q, num_tokens):
        req = self.reqs[q]
        grow_request(self.rq, self.blocks, self.reps, self.th, self.tbs, BS, self.caching, 0, q, num_tokens)
        self.model._grow(self.rep, req, num_tokens, BS)
        req.tokens = num_tokens
        req.generated = max(req.generated, num_tokens - req.prompt)

    @precondition(lambda self: self._in("running"))
    @rule(data=st.data(), preempt=st.booleans())
    def release(self, data, preempt):
        """Finished (its blocks go back as they are), or preempted: released unfinished, its own
        full blocks offered to the cache first; it waits again, to be recomputed."""
        q = data.draw(st.sampled_from(self._in("running")))
        req = self.reqs[q]
        free_request_blocks(self.rq, self.blocks, self.reps, self.th, self.tbs, BS, 0, q, preempt and self.caching)
        self.model._free(self.rep, req)
        req.tokens = 0
        req.state = "waiting" if preempt else "finished"
        if preempt:
            req.preemptions += 1
            self.rq.preemptions[q] += 1

    @rule(data=st.data())
    def look_up(self, data):
        """Any request's keys, looked up one by one: the same block, or none (a key unseen:
        none in the engine, whatever the reference holds)."""
        q = data.draw(st.integers(0, len(self.reqs) - 1))
        off, mask = self.reps.htab_off[0], self.reps.htab_mask[0]
        ids, unseen = self._ids(), self._unseen()
        for key in self.keys[q] if self.caching else []:
            found = int(ht_find(self.blocks, off, mask, np.uint64(key)))
            block = None if key in unseen else self.rep.kv.lookup(key)
            assert found == (-1 if block is None else ids[block])

    def _ids(self) -> dict[int, int]:
        """The reference's blocks that have an engine id -> that id, each checked to be the same
        block wherever it is found: the cached free ones by their LRU order, the held ones by
        their requests (hits by key; own blocks by id from the tail, the last first)."""
        kv, unseen = self.rep.kv, self._unseen()
        ids: dict[int, int] = {}

        def same(block, b):
            assert ids.setdefault(block, b) == b

        order, _, _ = free_queue(self.blocks, self.reps, 0)
        linked = [b for b in kv.free if kv.hash_of[b] is not None and kv.hash_of[b] not in unseen]
        assert len(order) == len(linked)
        for block, b in zip(linked, order):
            same(block, b)
        off, mask = self.reps.htab_off[0], self.reps.htab_mask[0]
        for q in self._in("running"):
            req = self.reqs[q]
            nhit, nblocks = int(self.rq.nhit[q]), int(self.rq.nblocks[q])
            top = int(kvblocks.by_id.py_func(self.rq, q))
            assert nblocks == len(req.blocks)
            for j in range(nhit):
                same(req.blocks[j], int(ht_find(self.blocks, off, mask, np.uint64(self.keys[q][j]))))
            b = int(self.rq.tail[q])
            for j in range(top - 1, nhit - 1, -1):
                same(req.blocks[j], b)
                b = int(self.blocks.cprev[b])
            assert b == -1
            for block in req.blocks[top:]:  # held as a count: uncached, or under a key nothing can look up yet
                assert kv.hash_of[block] is None or kv.hash_of[block] in unseen
        return ids

    @invariant()
    def blocks_match(self):
        kv = self.rep.kv
        nfree = int(self.reps.nfree[0])
        assert nfree == kv.num_free
        ids = self._ids()
        assert len(set(ids.values())) == len(ids)
        unseen = self._unseen()
        for block, b in ids.items():
            assert int(self.blocks.ref[b]) == kv.ref[block]
            key = kv.hash_of[block]
            assert int(self.blocks.key[b]) == (0 if key is None else key)
            assert key not in unseen or key is None
        # The free queue: the reference's, with its blocks under unseen keys read as uncached.
        gaps, run = [], 0
        for block in kv.free:
            if kv.hash_of[block] is None or kv.hash_of[block] in unseen:
                run += 1
            else:
                gaps.append(run)
                run = 0
        _, got_gaps, tgap = free_queue(self.blocks, self.reps, 0)
        assert (got_gaps, tgap) == (gaps, run)
        # The cache: the same keys (but the unseen) on the same blocks.
        keys = {int(k) for k in self.blocks.htab_key if k != 0}
        assert keys == {k for k in kv.cached if k not in unseen}
        # Blocks conserved, and every id either in use (cached or held) or unused, once.
        counted = sum(int(self.rq.nblocks[q]) - int(kvblocks.by_id.py_func(self.rq, q)) for q in self._in("running"))
        held_by_id = sum(1 for block in ids if kv.ref[block] > 0)
        assert nfree + held_by_id + counted == self.num_blocks
        unused = unused_ids(self.blocks, self.reps, 0)
        assert len(unused) == len(set(unused)) == self.num_blocks - len(ids)
        assert not set(unused) & set(ids.values())


TestRequestKv = RequestKvMachine.TestCase
