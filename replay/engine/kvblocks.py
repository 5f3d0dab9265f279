"""Paged KV blocks with prefix caching, as numba kernels over per-replica slices of flat arrays.

Reproduces vLLM V1's block pool (`vllm/v1/core/block_pool.py`, `kv_cache_manager.py`): one
doubly linked free queue per replica in LRU order; a freed request's blocks are appended tail
first, so a prefix's last block is evicted before its first; a free block keeps its hash (and
stays a cache hit) until it is popped for a new allocation (here only the blocks that can be
found have ids: the others are counts, see below). Hashes identify a block together
with its whole prefix (chained), so a lookup walks a prompt's blocks and stops at the first miss.

Two deliberate simplifications, both of which can only lower hit rates against vLLM's:
- a replica maps each hash to one block. When a request fills a block whose hash another block
  already caches, its copy is not added (vLLM keeps both and serves hits from either), so once
  that other copy is evicted the duplicate cannot serve a hit;
- blocks of generated tokens get a key private to their request: the trace gives no content for
  outputs, so a later turn of a conversation hits the earlier turn's prompt but not its answer;
  except in closed-loop replays, where a turn's answer is hashed as its session's next turn
  hashes those tokens of its prompt (replay/fleet/sessions.py).
"""

from __future__ import annotations

import replay._numba_cache  # noqa: F401  (before any kernel is defined)

from typing import NamedTuple

import numpy as np
from numba import njit

U64 = np.uint64
_GOLDEN = U64(0x9E3779B97F4A7C15)
_MIX1 = U64(0xBF58476D1CE4E5B9)
_MIX2 = U64(0x94D049BB133111EB)
_OWN_SALT = U64(0xD6E8FEB86659FD93)
_MASK64 = (1 << 64) - 1


class Blocks(NamedTuple):
    """Every replica's block ids and hash table, concatenated; `Replicas` holds each one's
    offsets (and its free queue's head, tail and count). Only the blocks that can be found have
    an id in use; the others are counted (see "free queue, ids and counts" below)."""

    ref: np.ndarray  # int32[B] requests holding the block (0: cached and free)
    key: np.ndarray  # uint64[B] prefix hash while the block is in its replica's cache, else 0
    fprev: np.ndarray  # int32[B] free-queue links of a cached free block (global ids, -1 = none);
    fnext: np.ndarray  # fnext also links the stack of unused ids
    gap: np.ndarray  # int32[B] uncached free blocks queued just before a cached free block
    cprev: np.ndarray  # int32[B] the previous of its request's own blocks held by id (-1 = none)
    htab_key: np.ndarray  # uint64[H] open addressing, linear probing, 0 = empty slot
    htab_val: np.ndarray  # int32[H] global block id
    utop: np.ndarray  # int64[R] a replica's most recently unused id (-1 = none)
    fresh: np.ndarray  # int64[R] its first id never used since it was laid out (the rest follow)
    tgap: np.ndarray  # int64[R] uncached free blocks queued after its last cached free block


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def mix64(a, b):
    """splitmix64 finaliser of (a, b): a 64-bit hash that is never 0 (0 marks "no hash")."""
    x = a * _GOLDEN + b
    x ^= x >> U64(30)
    x *= _MIX1
    x ^= x >> U64(27)
    x *= _MIX2
    x ^= x >> U64(31)
    if x == U64(0):
        x = U64(1)
    return x


def mix64_ref(a: int, b: int) -> int:
    """The same hash as `mix64`, in plain Python integers."""
    x = (a * 0x9E3779B97F4A7C15 + b) & _MASK64
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _MASK64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _MASK64
    x ^= x >> 31
    return x or 1


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def block_key_nb(trace_hashes, hash_off, hash_len, trace_block_tokens, prompt_tokens, request, j, block_size):
    """Hash of engine block `j` of a request.

    A full block of the first `prompt_tokens` tokens inside the trace's hashed prefix takes the
    trace block that holds its last token plus its end offset, so equal trace prefixes give equal
    engine blocks whatever the two block sizes. Any other block (outputs, traces without hashes)
    is the request's own. (`prompt_tokens` is the request's `hash_tokens`: its prompt, except for
    a closed-loop turn, whose answer is hashed by its successor's blocks: replay/fleet/sessions.py.)
    """
    end = (j + 1) * block_size
    if hash_len > 0 and end <= prompt_tokens:
        tb = (end - 1) // trace_block_tokens
        if tb < hash_len:
            return mix64(trace_hashes[hash_off + tb], U64(end))
    return mix64(U64(request) ^ _OWN_SALT, U64(j))


def block_key_ref(trace_hashes, hash_off, hash_len, trace_block_tokens, prompt_tokens, request, j, block_size):
    end = (j + 1) * block_size
    if hash_len > 0 and end <= prompt_tokens:
        tb = (end - 1) // trace_block_tokens
        if tb < hash_len:
            return mix64_ref(int(trace_hashes[hash_off + tb]), end)
    return mix64_ref(request ^ 0xD6E8FEB86659FD93, j)


# --- hash table: one power-of-two slice per replica ------------------------------------------


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def ht_find(blocks, off, mask, key):
    i = np.int64(key & U64(mask))
    while True:
        k = blocks.htab_key[off + i]
        if k == U64(0):
            return -1
        if k == key:
            return blocks.htab_val[off + i]
        i = (i + 1) & mask


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def ht_insert(blocks, off, mask, key, value):
    """Insert key -> value; returns False (and changes nothing) when the key is already there."""
    i = np.int64(key & U64(mask))
    while True:
        k = blocks.htab_key[off + i]
        if k == U64(0):
            blocks.htab_key[off + i] = key
            blocks.htab_val[off + i] = value
            return True
        if k == key:
            return False
        i = (i + 1) & mask


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def ht_delete(blocks, off, mask, key):
    """Remove key with backward-shift deletion, so probes never need tombstones."""
    i = np.int64(key & U64(mask))
    while True:
        k = blocks.htab_key[off + i]
        if k == U64(0):
            return
        if k == key:
            break
        i = (i + 1) & mask
    j = i
    while True:
        j = (j + 1) & mask
        k = blocks.htab_key[off + j]
        if k == U64(0):
            break
        home = np.int64(k & U64(mask))
        # Move slot j back to the hole at i unless its home lies cyclically in (i, j].
        if ((j - home) & mask) >= ((j - i) & mask):
            blocks.htab_key[off + i] = k
            blocks.htab_val[off + i] = blocks.htab_val[off + j]
            i = j
    blocks.htab_key[off + i] = U64(0)
    blocks.htab_val[off + i] = -1


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def clear_table(blocks, off, size):
    """Empty a replica's table. Only keys are written, and only those set: an empty slot's value
    is never read, and a table's pages that nothing was ever cached in are then never written
    (calloc's zero pages: 24 bytes a block of the fleet's memory, most of it in a replay
    without shared prefixes, where only a preempted request's blocks are hashed)."""
    for i in range(off, off + size):
        if blocks.htab_key[i] != U64(0):
            blocks.htab_key[i] = U64(0)


# --- free queue, ids and counts ----------------------------------------------------------------
#
# vLLM's free queue holds every free block in LRU order and allocation pops its head; what that
# order decides is which cached blocks are evicted, and when: a cached block leaves once the
# blocks freed before it are gone. Here only the cached free blocks are linked in LRU order
# (fprev/fnext from `reps.free_head` to `reps.free_tail`), each with the number of uncached
# free blocks queued just before it (`gap`; those after the last one: `tgap`). Allocation takes
# an uncached block while the queue's head is one (the cached blocks' gaps say), else the first
# cached block, evicting its hash: the same blocks are evicted at the same allocations as from
# one queue, so hits and every output are identical (the differential tests hold it).
#
# An uncached block is never observable by id: no lookup finds it, a free one is only counted,
# and which one an allocation takes changes nothing. So only the cached blocks (in the table;
# held, or free in the queue) and a request's blocks below `counted_from` (those offered to the
# prefix cache as they fill: grow_request) have an id in use. A request's other own blocks are
# held as a count, from its block `counted_from` on (`first_counted`), and taken and freed as
# one: in a replay without shared prefixes, every block of a request never preempted, at a cost
# per request, not per block, and without touching the block arrays (perf, bench/perf_lines.py:
# the KV kernels 4% of the kernels' samples on the m-large 4 h trace, 15% when every block had an id).
# The ids in use are then at most the blocks not counted, so the unused ids (a stack linked by
# fnext from `utop`, then those never used from `fresh`, in id order: a replica is laid out
# without writing its blocks, whose pages stay calloc's until they are used) never run out when
# a block needs one; the most recently unused id is reused first, still in the CPU's caches.
# The reference pool (reference/kvblocks.py) keeps every block in one queue by id, so its ids
# differ (tests/property/test_kvblocks.py maps them).

NO_COUNT = np.int64(1 << 62)  # counted_from of a request whose every block is held by id


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def take_id(blocks, r):
    """An unused id of replica r: the most recently unused, else the first never used."""
    b = blocks.utop[r]
    if b >= 0:
        blocks.utop[r] = blocks.fnext[b]
    else:
        b = blocks.fresh[r]
        blocks.fresh[r] += 1
        blocks.key[b] = U64(0)  # a block of the replica's last life may hold one
    return b


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def put_id(blocks, r, b):
    """Id b, uncached and unheld, is unused again."""
    blocks.fnext[b] = blocks.utop[r]
    blocks.utop[r] = b


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def fq_append(blocks, reps, r, b):
    """Cached block b, no longer held, joins the free queue's tail, after the uncached blocks
    freed since the last cached one."""
    tail = reps.free_tail[r]
    blocks.fprev[b] = tail
    blocks.fnext[b] = -1
    if tail >= 0:
        blocks.fnext[tail] = b
    else:
        reps.free_head[r] = b
    reps.free_tail[r] = b
    blocks.gap[b] = blocks.tgap[r]
    blocks.tgap[r] = 0
    reps.nfree[r] += 1


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def fq_remove(blocks, reps, r, b):
    """Cached free block b leaves the queue; the uncached blocks queued before it now come
    just before its successor."""
    p = blocks.fprev[b]
    n = blocks.fnext[b]
    if p >= 0:
        blocks.fnext[p] = n
    else:
        reps.free_head[r] = n
    if n >= 0:
        blocks.fprev[n] = p
        blocks.gap[n] += blocks.gap[b]
    else:
        reps.free_tail[r] = p
        blocks.tgap[r] += blocks.gap[b]
    blocks.fprev[b] = -1
    blocks.fnext[b] = -1
    blocks.gap[b] = 0
    reps.nfree[r] -= 1


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def evict_head(blocks, reps, r):
    """The free queue's head, a cached block, leaves it and the prefix cache; returns its id."""
    b = reps.free_head[r]
    fq_remove(blocks, reps, r, b)
    ht_delete(blocks, reps.htab_off[r], reps.htab_mask[r], blocks.key[b])
    blocks.key[b] = U64(0)
    return b


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def take_block(blocks, reps, r):
    """Take the free queue's head as a block with an id (held once, uncached); the caller
    checked nfree."""
    h = reps.free_head[r]
    if h < 0 or blocks.gap[h] > 0:  # an uncached block comes first
        if h >= 0:
            blocks.gap[h] -= 1
        else:
            blocks.tgap[r] -= 1
        reps.nfree[r] -= 1
        b = take_id(blocks, r)
    else:
        b = evict_head(blocks, reps, r)
    blocks.ref[b] = 1
    return b


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def take_counted(blocks, reps, r, n):
    """Take n blocks from the free queue's head as a count: the uncached ones a gap at a time,
    each cached one evicted (its id unused again); the caller checked nfree."""
    while n > 0:
        h = reps.free_head[r]
        if h < 0:
            blocks.tgap[r] -= n
            reps.nfree[r] -= n
            return
        k = min(n, np.int64(blocks.gap[h]))
        blocks.gap[h] -= k
        reps.nfree[r] -= k
        n -= k
        if n > 0:
            put_id(blocks, r, evict_head(blocks, reps, r))
            n -= 1


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def free_counted(blocks, reps, r, n):
    """n uncached blocks join the free queue's tail."""
    blocks.tgap[r] += n
    reps.nfree[r] += n


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def touch_block(blocks, reps, r, b):
    """A cache hit takes a reference; a free cached block leaves the free queue."""
    if blocks.ref[b] == 0:
        fq_remove(blocks, reps, r, b)
    blocks.ref[b] += 1


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def release_block(blocks, reps, r, b):
    """A holder lets block b go; once none holds it, it is free: cached, in the queue, else a
    count at its tail (its id unused)."""
    blocks.ref[b] -= 1
    if blocks.ref[b] == 0:
        if blocks.key[b] != U64(0):
            fq_append(blocks, reps, r, b)
        else:
            free_counted(blocks, reps, r, 1)
            put_id(blocks, r, b)


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def cache_block(blocks, reps, r, b, key):
    """Offer block b to the prefix cache under key; returns False (b stays uncached) when the
    key is cached already."""
    if ht_insert(blocks, reps.htab_off[r], reps.htab_mask[r], key, b):
        blocks.key[b] = key
        return True
    return False


def table_size(num_blocks: int) -> int:
    """Hash-table slots for a replica: a power of two at least twice its block count."""
    size = 2
    while size < 2 * num_blocks:
        size *= 2
    return size


# --- a request's KV: its blocks, grown and freed, and its prefix-cache hits -------------------
#
# Request q holds nblocks[q] blocks: its nhit[q] prefix-cache hits (found again by their keys
# when it lets them go), then its own blocks: by id from its block nhit[q] up to counted_from[q]
# (linked from tail[q] through cprev, the last first), and as a count from there on.


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def request_key(rq, th, tbs, q, j, bs):
    # its trace id, not its slot (engine/window.py): the same keys whatever the window
    return block_key_nb(th, rq.hash_off[q], rq.hash_len[q], tbs, rq.hash_tokens[q], rq.base[0] + q, j, bs)


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def shared_blocks(rq, tbs, q, bs):
    """How many of request q's leading blocks have keys other requests share (block_key_nb: full
    blocks inside its hashed prefix); every later block's key is its own."""
    if rq.hash_len[q] <= 0:
        return np.int64(0)
    return min(rq.hash_tokens[q], rq.hash_len[q] * tbs) // bs


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def first_counted(rq, tbs, bs, caching, q):
    """The first of request q's blocks it holds as a count. Its blocks are offered to the
    prefix cache as they fill, and so need ids, when caching is on: after a preemption each one,
    else those with keys other requests share. One with a key of its own waits until the request
    is released unfinished (free_request_blocks: `offer`): until then nothing else can put one
    of its keys in a table, so the table maps the same keys to the same blocks as if each had
    been offered when it filled (only the slots differ, which nothing reads), and a request that
    finishes never hashes them into the table (nor deletes them from it when they are reused),
    the probes that dominated a replay without shared prefixes. Fixed while q holds blocks:
    its preemptions change only once it holds none."""
    if not caching:
        return np.int64(0)
    if rq.preemptions[q] > 0:
        return NO_COUNT
    return shared_blocks(rq, tbs, q, bs)


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def by_id(rq, q):
    """Request q's own blocks held by id: from its block nhit[q] up to this one."""
    return max(min(rq.nblocks[q], rq.counted_from[q]), rq.nhit[q])


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def add_blocks(rq, blocks, reps, r, q, need):
    """`need` more own blocks for request q, at its tail (by id while below counted_from[q], as
    a count from there); the caller checked that enough are free."""
    if need <= 0:
        return
    n = rq.nblocks[q]
    for _ in range(min(max(rq.counted_from[q] - n, 0), need)):
        b = take_block(blocks, reps, r)
        blocks.cprev[b] = rq.tail[q]
        rq.tail[q] = b
        n += 1
    take_counted(blocks, reps, r, rq.nblocks[q] + need - n)
    rq.nblocks[q] += need


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def grow_request(rq, blocks, reps, th, tbs, bs, caching, r, q, num_tokens):
    """Allocate blocks so the request holds `num_tokens` tokens of KV, and offer the blocks that
    become full to the prefix cache (those held by id: first_counted). The caller checked that
    enough blocks are free."""
    rq.counted_from[q] = first_counted(rq, tbs, bs, caching, q)
    add_blocks(rq, blocks, reps, r, q, (num_tokens + bs - 1) // bs - rq.nblocks[q])
    if caching:
        full = num_tokens // bs
        if full > rq.ncached[q]:
            # The blocks to cache are the newest ones: walk back from the tail.
            b = rq.tail[q]
            for j in range(by_id(rq, q) - 1, rq.ncached[q] - 1, -1):
                if j < full:
                    cache_block(blocks, reps, r, b, request_key(rq, th, tbs, q, j, bs))
                b = blocks.cprev[b]
            rq.ncached[q] = full


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def free_request_blocks(rq, blocks, reps, th, tbs, bs, r, q, offer):
    """Release a request's blocks tail first (vLLM frees in reverse so tails are evicted first).
    `offer`: it is released unfinished (preempted, or its KV sent to a decode replica) from a
    replica that caches prefixes, so its full blocks held as a count, whose keys are its own
    (first_counted), are offered to the cache first, each with an id; only this request can
    look such a key up, and only from now on. Blocks held as a count go back as one."""
    top = by_id(rq, q)
    upto = max(min(rq.ncached[q], rq.nblocks[q]), top) if offer else top
    free_counted(blocks, reps, r, rq.nblocks[q] - upto)  # the rest of the count: not cached
    for j in range(upto - 1, top - 1, -1):
        b = take_id(blocks, r)
        if cache_block(blocks, reps, r, b, request_key(rq, th, tbs, q, j, bs)):
            blocks.ref[b] = 0
            fq_append(blocks, reps, r, b)
        else:
            put_id(blocks, r, b)
            free_counted(blocks, reps, r, 1)
    b = rq.tail[q]
    for _ in range(top - rq.nhit[q]):
        prev = blocks.cprev[b]
        release_block(blocks, reps, r, b)
        b = prev
    release_hits(rq, blocks, reps, th, tbs, bs, r, q)


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def release_hits(rq, blocks, reps, th, tbs, bs, r, q):
    """The prefix-cache hits a request holds, last first, after its own blocks; it holds none."""
    off = reps.htab_off[r]
    mask = reps.htab_mask[r]
    for j in range(rq.nhit[q] - 1, -1, -1):
        # A held hit block cannot be evicted, so its hash still maps to it.
        release_block(blocks, reps, r, ht_find(blocks, off, mask, request_key(rq, th, tbs, q, j, bs)))
    rq.tail[q] = -1
    rq.nhit[q] = 0
    rq.nblocks[q] = 0
    rq.ncached[q] = 0


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def keys_unseen(rq, tbs, bs, q):
    """Whether no table can hold any of request q's keys, so a lookup would miss at once (and
    its probe, a cache miss in a table of 24 bytes a block, is skipped): every key is its own
    (shared_blocks is 0) and none was ever offered, which needs a release
    unfinished: a preemption (free_request_blocks' offer, then grow_request as blocks fill) or
    a KV transfer (free_request_blocks' offer when it completes)."""
    return rq.preemptions[q] == 0 and rq.xfers[q] == 0 and shared_blocks(rq, tbs, q, bs) == 0


@njit(cache=True, _nrt=False, forceinline=False, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def prefix_hit_blocks(rq, blocks, reps, th, tbs, bs, r, q):
    """Leading prompt blocks of request q already in replica r's prefix cache."""
    if keys_unseen(rq, tbs, bs, q):
        return 0
    off = reps.htab_off[r]
    mask = reps.htab_mask[r]
    hits = 0
    for j in range((rq.prompt[q] - 1) // bs):
        if ht_find(blocks, off, mask, request_key(rq, th, tbs, q, j, bs)) < 0:
            break
        hits += 1
    return hits


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def prompt_hits(rq, blocks, reps, th, tbs, bs, r, q):
    """Prefix-cache hits of a waiting request: leading full blocks, capped at num_tokens - 1."""
    if keys_unseen(rq, tbs, bs, q):
        return 0
    off = reps.htab_off[r]
    mask = reps.htab_mask[r]
    hits = 0
    for j in range((rq.prompt[q] + rq.generated[q] - 1) // bs):
        if ht_find(blocks, off, mask, request_key(rq, th, tbs, q, j, bs)) < 0:
            break
        hits += 1
    return hits
