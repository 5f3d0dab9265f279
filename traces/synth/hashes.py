"""Prefix-block hash ids of synthesized prompts: a deterministic function of (namespace,
entity, block index), so that the same stream always names its blocks the same way.

A session's context is one growing token stream: its block i has the hash h(ns, session, i) in
every turn, so turn k+1's hash list extends turn k's and its prefix-cache hit covers the earlier
answer. The first blocks of a prompt that starts with a shared system prompt come from the
group's namespace, h(group ns, group, i), the same for every request of that group. Ids are
64-bit (splitmix64's finaliser over the mixed inputs), so a fresh namespace meets another
trace's small integer ids (Mooncake numbers its blocks 0, 1, ...) only by a 2^-64 chance.
"""

from __future__ import annotations

import hashlib

import numpy as np
import polars as pl

MAX_HASHES = 250_000_000  # 2 GB of ids
_K1, _K2, _K3 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def namespace(*parts: object) -> np.uint64:
    """A 64-bit namespace id from labels (the spec's namespace, seed, workload, purpose)."""
    digest = hashlib.blake2b("\0".join(map(str, parts)).encode(), digest_size=8).digest()
    return np.uint64(int.from_bytes(digest, "little"))


def _mix(x: np.ndarray) -> np.ndarray:
    # splitmix64's finaliser (Steele, Lea, Flood 2014): a bijection of uint64 with good avalanche
    x = x ^ (x >> np.uint64(30))
    x = x * _K2
    x = x ^ (x >> np.uint64(27))
    x = x * _K3
    return x ^ (x >> np.uint64(31))


def block_hash(ns: np.ndarray | np.uint64, entity: np.ndarray, index: np.ndarray) -> np.ndarray:
    """h(ns, entity, i) for arrays of entities and block indices (uint64 arithmetic wraps)."""
    with np.errstate(over="ignore"):
        first = _mix(np.asarray(ns, np.uint64) ^ (entity.astype(np.uint64) * _K1))
        return _mix(first + (index.astype(np.uint64) + np.uint64(1)) * _K1)


def prompt_hashes(prompt: np.ndarray, block_tokens: int, stream_ns: np.ndarray | np.uint64, entity: np.ndarray,
                  group_ns: np.uint64, group: np.ndarray, group_tokens: np.ndarray) -> np.ndarray:
    """Flat hashes of every row's ceil(prompt / block_tokens) blocks, row after row: the first
    floor(group_tokens / block_tokens) from the row's group (group < 0: none), the rest from
    (stream_ns, entity). `stream_ns` is one namespace or one per row."""
    blocks = -(-prompt.astype(np.int64) // block_tokens)
    if int(blocks.sum()) > MAX_HASHES:
        from common.errors import ConfigError

        raise ConfigError(f"prefix_block_tokens: {block_tokens} makes {int(blocks.sum()):,} prompt blocks to hash, "
                          f"more than {MAX_HASHES:,} (8 bytes each); expected a larger block or fewer requests")
    shared = np.where(group >= 0, np.minimum(group_tokens // block_tokens, blocks), 0)
    row = np.repeat(np.arange(len(prompt)), blocks)
    starts = np.concatenate(([0], np.cumsum(blocks)[:-1]))
    index = np.arange(len(row)) - starts[row]
    ns = np.broadcast_to(np.asarray(stream_ns, np.uint64), prompt.shape)[row]
    own = block_hash(ns, entity[row], index)
    from_group = index < shared[row]
    if from_group.any():
        own[from_group] = block_hash(group_ns, group[row][from_group], index[from_group])
    return own


def list_column(flat: np.ndarray, lengths: np.ndarray, mask: np.ndarray) -> pl.Series:
    """A List(UInt64) column: rows where `mask` holds take the next `lengths[row]` ids of `flat`
    (in order); the others are null."""
    n = len(mask)
    if not mask.any():
        return pl.Series("prefix_hashes", [None] * 0, dtype=pl.List(pl.UInt64)).extend_constant(None, n)
    rows = np.flatnonzero(mask)
    owner = np.repeat(rows, lengths[rows])
    lists = (pl.DataFrame({"row": owner, "h": flat.astype(np.uint64)})
             .group_by("row", maintain_order=True).agg(pl.col("h")))
    full = pl.DataFrame({"row": np.arange(n, dtype=owner.dtype)}).join(lists, on="row", how="left",
                                                                     maintain_order="left")
    return full["h"].rename("prefix_hashes")
