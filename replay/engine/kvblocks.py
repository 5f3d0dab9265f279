"""Paged KV blocks with prefix caching, as numba kernels over per-replica slices of flat arrays.

Reproduces vLLM V1's block pool (`vllm/v1/core/block_pool.py`, `kv_cache_manager.py`): one
doubly linked free queue per replica in LRU order; a freed request's blocks are appended tail
first, so a prefix's last block is evicted before its first; a free block keeps its hash (and
stays a cache hit) until it is popped for a new allocation. Hashes identify a block together
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
from llvmlite import ir
from numba import config, njit, types
from numba.core import cgutils
from numba.core.extending import intrinsic

U64 = np.uint64
_GOLDEN = U64(0x9E3779B97F4A7C15)
_MIX1 = U64(0xBF58476D1CE4E5B9)
_MIX2 = U64(0x94D049BB133111EB)
_OWN_SALT = U64(0xD6E8FEB86659FD93)
_MASK64 = (1 << 64) - 1


class Blocks(NamedTuple):
    """Every replica's blocks and hash table, concatenated; `Replicas` holds each one's offsets
    (and its free queue's head, tail and count: see "free queue" below)."""

    ref: np.ndarray  # int32[B] requests holding the block; -n: a stacked chain of n (release_chain)
    key: np.ndarray  # uint64[B] prefix hash while the block is in its replica's cache, else 0
    fprev: np.ndarray  # int32[B] free-queue links of a cached free block (global ids, -1 = none);
    fnext: np.ndarray  # fnext also links the stack of uncached free blocks
    gap: np.ndarray  # int32[B] uncached free blocks queued just before a cached free block
    cprev: np.ndarray  # int32[B] previous block of the owning request's own (non-hit) blocks
    htab_key: np.ndarray  # uint64[H] open addressing, linear probing, 0 = empty slot
    htab_val: np.ndarray  # int32[H] global block id
    utop: np.ndarray  # int64[R] a replica's most recently freed uncached block (-1 = none)
    fresh: np.ndarray  # int64[R] its first block never taken since it was laid out (the rest follow)
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


@intrinsic
def prefetch(typingctx, array, index):
    """A hint that array[index] is read soon: the CPU starts loading its cache line (x86
    `prefetcht0`) and goes on; no fault, whatever the index."""

    def codegen(context, builder, signature, args):
        ty = signature.args[0]
        view = context.make_array(ty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, ty, view, [args[1]], wraparound=False, boundscheck=False)
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                            "llvm.prefetch.p0")
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])  # read, keep in every level, data
        return context.get_dummy_value()

    return types.void(array, index), codegen


if config.DISABLE_JIT:  # the kernels run as Python, where an intrinsic cannot be called

    def prefetch(array, index):  # noqa: F811
        pass


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


# --- free queue and allocation ---------------------------------------------------------------
#
# vLLM's free queue holds every free block in LRU order and allocation pops its head; what that
# order decides is which cached blocks are evicted, and when: a cached block leaves once the
# blocks freed before it are gone. Here only the cached free blocks are linked in LRU order
# (fprev/fnext from `reps.free_head` to `reps.free_tail`), each with the number of uncached
# free blocks queued just before it (`gap`; those after the last one: `tgap`), and the uncached
# free blocks form a stack (linked by fnext from `utop`). Allocation takes an uncached block
# while the queue's head is one (the cached blocks' gaps say), else the first cached block,
# evicting its hash: the same blocks are evicted at the same allocations as from one queue,
# so hits and every output are identical (the differential tests hold it), while the block
# taken is the most recently freed of the uncached ones, still in the CPU's caches, or when
# none is, the replica's next block never taken (`fresh`, in id order: a replica is laid out
# without writing its blocks, whose pages stay calloc's until they are used). One queue
# handed out the block freed ~28k allocations earlier, scattered over the fleet's ~70 MB of
# block arrays: the loads of that pop were half of a million-request replay (perf). Which
# uncached block is taken is not observable; the reference pool (reference/kvblocks.py) keeps
# one queue, so block ids differ from its (tests/property/test_kvblocks.py maps them).


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def fq_append(blocks, reps, r, b):
    """Block b, no longer held, joins the free queue's tail."""
    if blocks.key[b] == U64(0):
        blocks.fnext[b] = blocks.utop[r]
        blocks.utop[r] = b
        blocks.tgap[r] += 1
    else:
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
def alloc_block(blocks, reps, r):
    """Take the free queue's head, evicting its cached hash; the caller checked nfree."""
    h = reps.free_head[r]
    if h < 0 or blocks.gap[h] > 0:  # an uncached block comes first: the most recently freed
        b = blocks.utop[r]
        if b >= 0 and blocks.ref[b] < -1:  # a chain: the block after b in it is the new top
            c = blocks.cprev[b]
            blocks.fnext[c] = blocks.fnext[b]
            blocks.ref[c] = blocks.ref[b] + 1 if blocks.ref[b] < -2 else 0
            blocks.fprev[c] = blocks.fprev[b]  # the chain's bottom
            blocks.utop[r] = c
            prefetch(blocks.cprev, c)  # the next take reads it
        elif b >= 0:
            blocks.utop[r] = blocks.fnext[b]
        else:
            b = blocks.fresh[r]
            blocks.fresh[r] += 1
            blocks.key[b] = U64(0)  # a block of the replica's last life may hold one
        blocks.fnext[b] = -1
        if h >= 0:
            blocks.gap[h] -= 1
        else:
            blocks.tgap[r] -= 1
        reps.nfree[r] -= 1
    else:
        b = h
        fq_remove(blocks, reps, r, b)
        ht_delete(blocks, reps.htab_off[r], reps.htab_mask[r], blocks.key[b])
        blocks.key[b] = U64(0)
    blocks.ref[b] = 1
    blocks.cprev[b] = -1
    return b


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def take_uncached(blocks, reps, r, tail, need):
    """Up to `need` uncached blocks at once, while the free queue's head is uncached (as
    alloc_block would take them), from the top stack entry only (or, the stack empty, the
    blocks never taken), linked as grow_request links a request's blocks: each block's cprev
    the one before it, the first's `tail`. Returns (first, last, how many); 0: the head is cached.

    Which uncached blocks are taken is not observable (see above), so a stacked chain is taken
    where it costs least: a chain's links already run as a request's, so its bottom part is
    taken as it lies (its first block linked to `tail`), found by walking down from the top
    past what stays, or its top part is walked down and relinked in passing, whichever walks
    fewer blocks; a whole chain is taken in O(1) (release_chain keeps its bottom on its top).
    Either way only the entry left on top is written: an inner block of a chain still has
    ref 1, a held block's fnext is never read. Taking a prompt's blocks one at a time was ~30%
    of a million-request replay (perf: each block's ref, cprev and fnext lines, the next top's)."""
    h = reps.free_head[r]
    m = need if h < 0 else min(need, blocks.gap[h])
    if m <= 0:
        return np.int64(-1), np.int64(-1), np.int64(0)
    b = blocks.utop[r]
    if b >= 0:
        n = -blocks.ref[b] if blocks.ref[b] < -1 else 1
        m = min(m, n)
        if n - m < m:  # the bottom m: walk down to the block above them, the bottom of the rest
            first = blocks.fprev[b] if n > 1 else b
            last = b
            above = np.int64(-1)
            for _ in range(n - m):
                above = last
                last = blocks.cprev[last]
            blocks.cprev[first] = tail
            if m < n:
                blocks.ref[b] = -(n - m) if n - m > 1 else 0
                blocks.fprev[b] = above
            else:
                blocks.ref[b] = 1
                blocks.utop[r] = blocks.fnext[b]
        else:  # the top m, relinked in passing; the block below them heads the rest
            first = b
            blocks.ref[b] = 1
            last = tail
            x = b
            for _ in range(m):
                c = blocks.cprev[x]
                blocks.cprev[x] = last
                last = x
                x = c
            blocks.fnext[x] = blocks.fnext[b]
            blocks.ref[x] = -(n - m) if n - m > 1 else 0
            blocks.fprev[x] = blocks.fprev[b]
            blocks.utop[r] = x
            prefetch(blocks.cprev, x)  # the next take's walk starts there
    else:
        first = blocks.fresh[r]
        last = tail
        for x in range(first, first + m):
            blocks.key[x] = U64(0)  # a block of the replica's last life may hold one
            blocks.ref[x] = 1
            blocks.cprev[x] = last
            last = x
        blocks.fresh[r] += m
    if h >= 0:
        blocks.gap[h] -= m
    else:
        blocks.tgap[r] -= m
    reps.nfree[r] -= m
    return first, last, m


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def release_chain(blocks, reps, r, b, n, bottom):
    """Free the n blocks from b down its `cprev` chain to `bottom`, each held by one request
    only and none in the prefix cache, as one entry of the uncached stack (ref = -n and fprev =
    bottom on b, an uncached free block's fprev being otherwise unused), without the walk
    down the chain: its blocks come off the stack as they are taken (take_uncached), the
    walk's steps then due on blocks freed lately, still in the CPU's caches. A block inside a stacked
    chain keeps its stale ref (1) until it is taken; nothing reads it (only cached blocks are
    looked up, and only held ones released)."""
    blocks.fnext[b] = blocks.utop[r]
    blocks.utop[r] = b
    blocks.ref[b] = -n if n > 1 else 0
    blocks.fprev[b] = bottom
    blocks.tgap[r] += n
    reps.nfree[r] += n
    # The next take reads it: written when b was taken for the request that freed it, a cache
    # miss by now, which the take would wait for.
    prefetch(blocks.cprev, b)


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def touch_block(blocks, reps, r, b):
    """A cache hit takes a reference; a free cached block leaves the free queue."""
    if blocks.ref[b] == 0:
        fq_remove(blocks, reps, r, b)
    blocks.ref[b] += 1


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def release_block(blocks, reps, r, b):
    blocks.ref[b] -= 1
    if blocks.ref[b] == 0:
        fq_append(blocks, reps, r, b)


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def cache_block(blocks, reps, r, b, key):
    if ht_insert(blocks, reps.htab_off[r], reps.htab_mask[r], key, b):
        blocks.key[b] = key


def table_size(num_blocks: int) -> int:
    """Hash-table slots for a replica: a power of two at least twice its block count."""
    size = 2
    while size < 2 * num_blocks:
        size *= 2
    return size


# --- a request's KV: its blocks, grown and freed, and its prefix-cache hits -------------------


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def request_key(rq, th, tbs, q, j, bs):
    # its trace id, not its slot (engine/window.py): the same keys whatever the window
    return block_key_nb(th, rq.hash_off[q], rq.hash_len[q], tbs, rq.hash_tokens[q], rq.base[0] + q, j, bs)



@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def free_request_blocks(rq, blocks, reps, th, tbs, bs, r, q):
    """Release a request's blocks tail first (vLLM frees in reverse so tails are evicted first)."""
    b = rq.tail[q]
    for _ in range(rq.nblocks[q] - rq.nhit[q]):
        prev = blocks.cprev[b]
        release_block(blocks, reps, r, b)
        b = prev
    release_hits(rq, blocks, reps, th, tbs, bs, r, q)


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def free_finished_blocks(rq, blocks, reps, th, tbs, bs, caching, r, q):
    """`free_request_blocks` for a request that finished: its own blocks go back as one chain
    (release_chain) when none of them is in the prefix cache. None is when it was never
    preempted: its own-keyed blocks were held back (grow_request) and never offered
    (offer_own_blocks runs only before an unfinished release, which frees them at once), and
    the others are cached as they fill, unless caching is off or it has none (own_block holds
    from some block on, so its first own block after its hits says)."""
    own = rq.nblocks[q] - rq.nhit[q]
    if own > 0 and rq.preemptions[q] == 0 and (not caching or own_block(rq, tbs, q, rq.nhit[q], bs)):
        release_chain(blocks, reps, r, rq.tail[q], own, rq.head[q])
        release_hits(rq, blocks, reps, th, tbs, bs, r, q)
    else:
        free_request_blocks(rq, blocks, reps, th, tbs, bs, r, q)


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
def add_blocks(rq, blocks, reps, r, q, need):
    """`need` more own blocks for request q, at its tail; the caller checked that enough are free."""
    while need > 0:
        first, b, k = take_uncached(blocks, reps, r, rq.tail[q], need)
        if k == 0:  # the free queue's head is a cached block: evict it
            b = alloc_block(blocks, reps, r)
            blocks.cprev[b] = rq.tail[q]
            first = b
            k = 1
        if rq.tail[q] < 0:
            rq.head[q] = first
        rq.tail[q] = b
        rq.nblocks[q] += k
        need -= k


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def grow_request(rq, blocks, reps, th, tbs, bs, caching, r, q, num_tokens):
    """Allocate blocks so the request holds `num_tokens` tokens of KV, and offer the blocks that
    become full to the prefix cache. The caller checked that enough blocks are free."""
    add_blocks(rq, blocks, reps, r, q, (num_tokens + bs - 1) // bs - rq.nblocks[q])
    if caching:
        full = num_tokens // bs
        if full > rq.ncached[q]:
            # The blocks to cache are the newest ones: walk back from the tail. A block whose key
            # is the request's own waits until it is released unfinished (offer_own_blocks).
            # Keys are the request's own from some block on: when that is the first to offer,
            # every one waits and the walk is skipped.
            defer = rq.preemptions[q] == 0
            if not (defer and own_block(rq, tbs, q, rq.ncached[q], bs)):
                b = rq.tail[q]
                for j in range(rq.nblocks[q] - 1, rq.ncached[q] - 1, -1):
                    if j < full and not (defer and own_block(rq, tbs, q, j, bs)):
                        cache_block(blocks, reps, r, b, request_key(rq, th, tbs, q, j, bs))
                    b = blocks.cprev[b]
            rq.ncached[q] = full


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def own_block(rq, tbs, q, j, bs):
    """Whether block j of request q has a key of its own (block_key_nb: past its hashed prefix),
    which no other request can look up."""
    end = (j + 1) * bs
    return not (rq.hash_len[q] > 0 and end <= rq.hash_tokens[q] and (end - 1) // tbs < rq.hash_len[q])


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def offer_own_blocks(rq, blocks, reps, th, tbs, bs, r, q):
    """Before a request never preempted releases its blocks unfinished (preempted, or handed to a
    decode replica), offer the prefix cache the full blocks with keys of its own that grow_request
    held back. Only this request can look such a key up, and only once it has been released:
    a request that finishes never does, so its own blocks are never hashed into the table (nor
    deleted from it when they are reused), the probes that dominated a replay without shared
    prefixes. Until its first release nothing else can put one of its keys in a table and its
    blocks are held, so the table then maps the same keys to the same blocks as if each had
    been offered when it filled (only the slots differ, which nothing reads)."""
    if rq.preemptions[q] != 0:
        return
    b = rq.tail[q]
    for j in range(rq.nblocks[q] - 1, rq.nhit[q] - 1, -1):
        if j < rq.ncached[q] and own_block(rq, tbs, q, j, bs):
            cache_block(blocks, reps, r, b, request_key(rq, th, tbs, q, j, bs))
        b = blocks.cprev[b]



@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def keys_unseen(rq, tbs, bs, q):
    """Whether no table can hold any of request q's keys, so a lookup would miss at once (and
    its probe, a cache miss in a table of 24 bytes a block, is skipped): every key is its own
    (own_block holds from its first block on) and none was ever offered, which needs a release
    unfinished: a preemption (offer_own_blocks, then grow_request as blocks fill) or a KV
    transfer (offer_own_blocks when it completes)."""
    return rq.preemptions[q] == 0 and rq.xfers[q] == 0 and own_block(rq, tbs, q, 0, bs)


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
