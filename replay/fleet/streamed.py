"""A replay fed by a trace read in batches (traces/stream.py): the numba engine's request window
(engine/window.py) loads its slots from `StreamedRequests`, which reads the trace's next batch
when the window asks past what it holds, and the rows leaving the window (in id order) take their
trace columns from the same batches, which are dropped once both are past them. So the trace is
never whole in memory: what is held is the batches between the oldest request still in the window
and the newest loaded, plus one byte a request of its pool (the events name requests by id). A
trace's prefix hashes come with their requests' fields (`read`'s "hashes"): the window holds those
of the requests it holds.

Every figure is as the whole frame's path computes it (replay/fleet/cluster.py `build_inputs`,
with the same split and hash columns, replay/fleet/split.py, per batch): tenant ids are dense ranks over the whole trace's tenants (known from the loader's pass), the
engine arrivals' running maximum carries across batches, and the control plane counts each tick's
arrivals from the batches read (`StreamedControl`; the window always holds every request that
arrived by the tick). The last engine arrival, which the tick loop needs before it starts, comes
from the trace's tail (`_last_arrival`), not from a pass over every row. `streams` says which
replays can take this path; the rest read the whole frame (LoadedTrace.whole) as before.
"""

from __future__ import annotations

import dataclasses
from collections import deque

import numpy as np
import polars as pl

from replay.config import FleetConfig
from replay.engine.common import EngineInputs
from replay.fleet.control import FleetControl
from replay.fleet.split import assign_pools, prefix_hash_columns, split_requests
from replay.model.serving import engine_arrivals
from traces.stream import TraceBatches

# What a batch is read with: the engine's fields, the split's and the rows' columns (and the
# prefix hashes, where the trace has them).
READ = ("arrival_us", "prompt_tokens", "output_tokens", "workload", "tenant", "priority")
ROW_COLUMNS = ("request_id", "workload", "arrival_us", "prompt_tokens", "output_tokens")


def streams(trace, cfg: FleetConfig, plans: list, engine: str, jobs: int | None, on_tick=None) -> bool:
    """Whether this replay reads `trace` batch by batch: one that `replays_in_batches` and a trace
    read so (LoadedTrace.stream) that names no LoRA adapter where a pool serves them."""
    return (trace.stream is not None and replays_in_batches(cfg, plans, engine, jobs, on_tick)
            and not (trace.stream.adapters and any(p.terms.lora_slots for p in plans)))


def replays_in_batches(cfg: FleetConfig, plans: list, engine: str, jobs: int | None, on_tick=None) -> bool:
    """Whether a replay of this fleet can read its trace batch by batch: the numba engine handing
    its rows over as they leave it (no live view, no vLLM V0 decode windows, which read the whole
    run's columns), an open loop, a built-in split, and pools not for worker processes (`jobs`
    None: as many as the machine gives, which may be more than one)."""
    from replay.fleet.request_rows import windowed

    return (engine in ("numba", "numba-eager") and on_tick is None
            and not (cfg.trace is not None and cfg.trace.closed_loop) and not windowed(plans)
            and cfg.split.policy in ("prefill-decode", "by-prompt-length", "by-workload")
            and not (len(plans) > 1 and (jobs is None or jobs > 1)))


class StreamedRequests:
    """The trace fields of requests [lo, hi) for the window (`read`, in id order) and the trace
    columns of the rows leaving it (`rows`, in id order), from batches read as they are needed."""

    def __init__(self, batches: TraceBatches, cfg: FleetConfig, plans: list, source: str = "config"):
        self.batches, self.cfg, self.plans, self.source = batches, cfg, plans, source
        self.total = batches.rows
        self.terms = [p.serving for p in plans]
        self.tenants = pl.Series(batches.tenants, dtype=pl.String)
        self._tenant_codes = pl.Enum(batches.tenants)  # a tenant's code is its rank
        if cfg.split.policy == "by-workload":  # a label no pool takes fails as on the whole frame
            assign_pools(pl.Series("workload", batches.workloads, dtype=pl.String), plans, source)
        self._read = READ + (("prefix_hashes",) if batches.hashed else ())
        self._it = None
        self._carry = np.int64(np.iinfo(np.int64).min)
        self._fields: deque[tuple[int, dict[str, np.ndarray], np.ndarray]] = deque()  # read, not all loaded yet
        self._frames: deque[tuple[int, pl.DataFrame]] = deque()  # read, not all left yet
        self.listeners: list = []  # called with (pools, arrivals, prompt, output) of each batch read
        # one byte a request (events name requests by id; metrics.event_frame reads their pools)
        self._constant = len(plans) == 1 or cfg.split.policy == "prefill-decode"
        self.last_arrival_us, first_pool = self._last_arrival()
        self.pool_index = np.broadcast_to(np.int8(first_pool), (self.total,)) if self._constant \
            else np.zeros(self.total, np.int8 if len(plans) < 128 else np.int16)

    def _pools(self, frame: pl.DataFrame) -> np.ndarray:
        """The split's pool of each of the batch's requests."""
        return split_requests(frame, self.cfg, self.plans, self.source)

    def _last_arrival(self) -> tuple[int, int]:
        """(When the last request reaches its engine, the first request's pool where every
        request has the same): a read of the trace's tail. A request reaches its engine at its
        arrival plus a delay >= 0 (serving.engine_arrivals; config.py checks the terms) of at
        most the longest prompt's in the slowest pool, `most`, then the running maximum: one
        that arrives by the last arrival - `most` reaches it no later than the last request, so
        the rows before it need not be read (the whole trace was: 1.7 s of the m-large day)."""
        b = self.batches
        fixed = np.array([t.api_server_us for t in self.terms], np.float64)
        per_token = np.array([t.tokenize_us_per_token for t in self.terms], np.float64)
        most = int(np.rint(fixed + per_token * b.max_prompt_tokens).max())
        carry, first = np.iinfo(np.int64).min, None
        for _, frame in b.batches(("arrival_us", "prompt_tokens", "workload"), since_us=b.last_arrival_us - most):
            pools = self._pools(frame)
            out = engine_arrivals(frame["arrival_us"].to_numpy(), frame["prompt_tokens"].to_numpy(), pools, self.terms)
            carry, first = max(carry, int(out[-1])), int(pools[0]) if first is None else first
        return carry, first

    def _next_batch(self) -> None:
        """Read the next batch: its fields as the window's fill copies them into its (int64)
        slots, each in the narrowest type it comes in (the trace's Int32 columns as polars holds
        them, the tenants' ranks as their Enum's codes, a value every request shares as a view of
        one), and its rows' trace columns."""
        if self._it is None:
            self._it = self.batches.batches(self._read)
        lo, frame = next(self._it)
        n = frame.height
        pools = self._pools(frame)
        if not self._constant:
            self.pool_index[lo:lo + n] = pools
        prompt = frame["prompt_tokens"].to_numpy()
        output = frame["output_tokens"].to_numpy()
        arrival = engine_arrivals(frame["arrival_us"].to_numpy(), prompt, pools, self.terms)
        np.maximum(arrival, self._carry, out=arrival)
        self._carry = arrival[-1]
        tenant = frame["tenant"].cast(self._tenant_codes).to_physical().to_numpy()  # (ranks: sorted categories)
        none = np.broadcast_to(np.int64(-1), (n,))
        hash_off, hash_len, hashes = prefix_hash_columns(frame["prefix_hashes"]) if self.batches.hashed \
            else (np.broadcast_to(np.int64(0), (n,)), np.broadcast_to(np.int64(0), (n,)), np.zeros(0, np.uint64))
        self._fields.append((lo, {
            "arrival": arrival, "prompt": prompt, "output": output, "pool": pools,
            "priority": frame["priority"].to_numpy(), "tenant": tenant, "hash_off": hash_off, "hash_len": hash_len,
            "adapter": none, "hash_tokens": prompt, "next_turn": none, "gap": none}, hashes))
        self._frames.append((lo, frame.select(ROW_COLUMNS)))
        for listen in self.listeners:
            listen(pools, arrival, prompt, output)

    def read(self, lo: int, hi: int) -> dict[str, np.ndarray]:
        """The window's trace fields (engine/window.py TRACE_FIELDS) of requests [lo, hi), and
        their prefix hashes ("hashes", one after another; each `hash_off` an offset into them)."""
        while not self._fields or self._fields[-1][0] + len(self._fields[-1][1]["arrival"]) < hi:
            self._next_batch()
        parts, held = [], 0
        for start, fields, hashes in self._fields:
            n = len(fields["arrival"])
            if start + n > lo and start < hi:
                a, b = max(lo - start, 0), min(hi - start, n)
                part = {k: v[a:b] for k, v in fields.items()}
                cut = fields["hash_off"][a]
                end = fields["hash_off"][b] if b < n else len(hashes)
                part["hashes"] = hashes[cut:end]
                part["hash_off"] = part["hash_off"] - (cut - held)
                held += end - cut
                parts.append(part)
        while self._fields and self._fields[0][0] + len(self._fields[0][1]["arrival"]) <= hi:
            self._fields.popleft()
        if len(parts) == 1:
            return parts[0]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def slice(self, lo: int, n: int) -> pl.DataFrame:
        """The trace columns of the rows of requests [lo, lo + n) (read, unless a replay that
        ran out of time hands over rows it never loaded)."""
        hi = lo + n
        while not self._frames or self._frames[-1][0] + self._frames[-1][1].height < hi:
            self._next_batch()
        parts = [frame.slice(max(lo - start, 0), hi - max(lo, start))
                 for start, frame in self._frames if start + frame.height > lo and start < hi]
        while self._frames and self._frames[0][0] + self._frames[0][1].height <= hi:
            self._frames.popleft()
        return parts[0] if len(parts) == 1 else pl.concat(parts)


def streamed_inputs(inputs: EngineInputs, requests: StreamedRequests) -> EngineInputs:
    """`inputs` (built for no request: every pool's columns) with the requests from `requests`."""
    return dataclasses.replace(inputs, requests=requests, num_tenants=max(1, len(requests.tenants)), adapter=None)


class StreamedControl(FleetControl):
    """The control plane, counting each tick's arrivals per pool from the batches as they are
    read (instead of from the whole trace's arrays): the same counts, since arrivals are sorted
    and the window has read every request that arrived by the tick."""

    def __init__(self, pools, num_replicas: int, tick_us: int, requests: StreamedRequests,
                 sees_arrivals_of: dict[int, int] | None = None):
        empty = np.zeros(0, np.int64)
        super().__init__(pools, num_replicas, tick_us, empty, empty, empty, empty, sees_arrivals_of)
        self._watch = {pc.index: (sees_arrivals_of or {}).get(pc.index, pc.index)
                       for pc in pools if pc.decide is not None}  # only autoscalers read arrivals
        self._queues: dict[int, deque] = {index: deque() for index in self._watch}
        requests.listeners.append(self._feed)

    def _feed(self, pools: np.ndarray, arrival: np.ndarray, prompt: np.ndarray, output: np.ndarray) -> None:
        for index, seen in self._watch.items():
            mine = pools == seen
            times, p, o = (arrival, prompt, output) if mine.all() else (arrival[mine], prompt[mine], output[mine])
            # [times, running prompt tokens, running output tokens, where the last take ended]
            self._queues[index].append([times, _running_sum(p), _running_sum(o), 0])

    def _arrivals_since_last(self, pc, t: int) -> tuple[int, int, int]:
        """(requests, their prompt tokens, their output tokens) that arrived in (last tick, t]."""
        queue = self._queues[pc.index]
        self._take(queue, self.last_t)  # (only the first tick's: arrivals at 0 are in no tick)
        return self._take(queue, t)

    @staticmethod
    def _take(queue: deque, t: int) -> tuple[int, int, int]:
        """What arrived by t since the last take: a batch's tokens are differences of its running
        sums, not sums of slices (two numpy sums and three slices a tick were a sixth of the
        control plane's time on the day, issue 15)."""
        n = prompt = output = 0
        while queue:
            batch = queue[0]
            times, p, o, at = batch
            k = int(times.searchsorted(t, side="right"))
            n, prompt, output = n + k - at, prompt + int(p[k] - p[at]), output + int(o[k] - o[at])
            if k < len(times):
                batch[3] = k
                break
            queue.popleft()
        return n, prompt, output


def _running_sum(tokens: np.ndarray) -> np.ndarray:
    """tokens' running sum from 0: sum(tokens[a:b]) = out[b] - out[a]."""
    out = np.zeros(len(tokens) + 1, np.int64)
    np.cumsum(tokens, dtype=np.int64, out=out[1:])
    return out


def simulate_streamed(batches: TraceBatches, trace_block_tokens: int | None, cfg: FleetConfig, plans: list, *,
                      engine: str = "numba", detailed_events: bool = False, progress=None,
                      config_source: str = "config", jobs: int = 1, rows=None):
    """cluster.simulate's serial replay, the trace read batch by batch (`streams` says when);
    the request rows go to `rows` (RequestRows) as they leave the engine."""
    from replay.engine.common import InvariantViolation
    from replay.fleet import parallel
    from replay.fleet.cluster import RawRun, build_inputs, make_control, make_engine, pd_inputs
    from replay.fleet.request_rows import stream_rows
    from replay.fleet.tickloop import TickLoop
    from replay.fleet.ticks import check_tick_count
    from traces.schema import cast_to_schema

    check_tick_count(batches.ends(), cfg)
    requests = StreamedRequests(batches, cfg, plans, config_source)
    none = cast_to_schema(pl.DataFrame(schema={"arrival_us": pl.Int64, "prompt_tokens": pl.Int32,
                                               "output_tokens": pl.Int32}), source="no requests")
    inputs = build_inputs(none, trace_block_tokens, plans, np.zeros(0, np.int64), detailed_events, cfg.seed,
                          cfg.slo.ttft_ms, pd_inputs(cfg, plans), config_source)
    inputs = streamed_inputs(inputs, requests)
    why = parallel.serial_reason(cfg, plans, inputs, engine, jobs, None)
    eng = make_engine(engine, inputs)
    tick_us = max(1, round(cfg.tick_s * 1e6))
    sees = {inputs.pd_prefill_pool: inputs.pd_decode_pool} if inputs.pd_prefill_pool >= 0 else None
    control = StreamedControl(make_control(plans, inputs, cfg, tick_us).pools, len(inputs.replica_pool), tick_us,
                              requests, sees)
    control.start(eng)
    stream = stream_rows(eng, rows, requests, plans, requests.pool_index, inputs, cfg)
    if stream is None:
        raise InvariantViolation("a streamed replay hands its rows over as they leave the engine")
    last = requests.last_arrival_us
    loop = TickLoop(eng, control, len(plans), tick_us, last, last + round(cfg.max_drain_s * 1e6),
                    progress=progress)
    loop.run()
    stream.flush(eng)
    return RawRun(plans, requests.pool_index, loop.tick_arrays(), loop.engine_events(), control.events,
                  inputs.pool_replicas, None, loop.t, tick_us, serial_reason=why)
