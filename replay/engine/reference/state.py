"""The reference engine's state: a dataclass per request and per replica, event kinds, and the
column a policy's view reads (the twin of engine/state.py's NamedTuples of arrays)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from replay.engine.common import COUNTERS, PENDING, R_ACTIVE
from replay.engine.reference.kvblocks import BlockPool


class Column:
    """A per-request attribute read by request id, as a policy's view reads a numpy column."""

    def __init__(self, requests: list, get) -> None:
        self.requests, self.get = requests, get

    def __getitem__(self, q: int):
        return self.get(self.requests[q])


# Event kinds in tie-break order at equal times: a step ends, a KV transfer completes, routers
# refresh their view of the replicas, requests arrive, idle replicas wake up to schedule.
STEP_END, TRANSFER_DONE, REFRESH, ARRIVAL, WAKE = 0, 1, 2, 3, 4


@dataclass(eq=False)
class Request:
    index: int
    arrival_us: int
    prompt_tokens: int
    output_tokens: int
    keys: list[int]  # hash of every block the request can ever fill
    priority: int = 0
    swapped: int = 0  # tokens of KV in host memory after a swap preemption
    state: int = PENDING
    replica: int = -1
    computed: int = 0
    generated: int = 0
    scheduled: int = 0
    blocks: list[int] = field(default_factory=list)
    num_cached_blocks: int = 0
    first_scheduled_us: int = -1
    first_token_us: int = -1
    finished_us: int = -1
    preemptions: int = 0
    cached_tokens: int = 0
    reject: int = 0
    # Prefill/decode disaggregation (-1 = none): the decode replica chosen at arrival, the
    # prefill replica, when the prefill was (last) admitted and ended, and the KV transfer.
    decode_replica: int = -1
    prefill_replica: int = -1
    prefill_start_us: int = -1
    prefill_end_us: int = -1
    kv_transfer_start_us: int = -1
    kv_transfer_end_us: int = -1
    kv_transfers: int = 0
    adapter: int = -1  # LoRA adapter id, -1 = the base model
    spec_credit: int = 0  # speculative decoding: fractional tokens carried, in SPEC_CREDIT_SCALE units
    queued_us: int = -1  # when it last joined its replica's waiting queue (async scheduling's cutoff)

    @property
    def num_tokens(self) -> int:
        return self.prompt_tokens + self.generated

    @property
    def is_decoding(self) -> bool:
        return self.generated > 0 and self.computed == self.num_tokens - 1


@dataclass(eq=False)
class Replica:
    index: int
    pool: int
    kv: BlockPool
    state: int = R_ACTIVE
    active_at: int = 0
    view: tuple[int, int, int] = (0, 0, 0)  # (waiting, running, KV blocks used) at the last refresh
    host_free: int = 0  # blocks of CPU swap space left
    waiting: deque = field(default_factory=deque)
    running: list = field(default_factory=list)
    busy_until: int = -1
    step_start: int = 0
    counters: dict = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    # Prefill/decode: blocks set aside for KV on its way in, requests whose KV this replica holds
    # until it is sent, requests routed here still being prefilled or transferred, and the
    # prefilled requests waiting for room here, in order.
    reserved: int = 0
    outgoing: int = 0
    incoming: int = 0
    pending: deque = field(default_factory=deque)
    # Multi-LoRA: the adapter in each of the pool's max_loras slots (-1 = empty) and when a step
    # last used it (LRU).
    lora_id: list = field(default_factory=list)
    lora_used: list = field(default_factory=list)

    @property
    def num_free(self) -> int:
        """Free blocks, less those set aside for KV transfers on their way in."""
        return self.kv.num_free - self.reserved
