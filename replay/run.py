"""One replay, end to end: config + trace in, run outputs (frames, summary) out."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from replay.fleet.cluster import PoolPlan, plan_pools, simulate
from replay.fleet.streamed import simulate_streamed, streams
from replay.config import FleetConfig
from replay.memory import return_freed_memory
from replay.fleet.metrics import event_frame, summarize, tick_frame
from replay.fleet.request_rows import RowMaker
from replay.outputs.rows import RequestRows
from replay.outputs.write import RunOutputs, file_metadata
from replay.outputs.verdict import verdict
from traces import LoadedTrace


def warm_up(engine: str = "numba", variant: str = "plain") -> None:
    """Compile (first run) or load from numba's cache every kernel a replay in `variant` uses
    (replay/engine/variants.py; `run_variant` says which a run needs), on a tiny trace, so that a
    replay's time (timing.json's replay_s) measures the replay and not the compiler."""
    import polars as pl

    from replay.config import PoolConfig
    from replay.engine.variants import at_least
    from traces import cast_to_schema

    frame = cast_to_schema(pl.DataFrame({"arrival_us": [0, 1000, 2000], "prompt_tokens": [40, 20, 30],
                                         "output_tokens": [3, 2, 1]}), source="warm-up")
    from replay._numba_cache import kernels_cached, mark_compiled

    tiny = LoadedTrace(frame, "warm-up", "synthetic", None, "", {}, 0)
    cfg = FleetConfig(model="llama-3.1-8b", pools=(PoolConfig(replicas=1),))
    cold = engine == "numba" and not kernels_cached(variant)
    started, cpu = time.monotonic(), time.process_time()
    with at_least(variant):  # the tiny fleet alone would run the plain variant
        replay_trace(tiny, cfg, engine=engine)
    if cold:
        mark_compiled(time.monotonic() - started, time.process_time() - cpu, variant)


def run_variant(cfg: FleetConfig, plans: list[PoolPlan], frame, source: str = "config") -> str:
    """The kernel variant a replay of this trace on this fleet runs: the engine's own choice
    (replay/engine/variants.py), from the inputs built for none of the trace's requests."""
    import numpy as np

    from replay.engine.variants import features, variant_of
    from replay.fleet.cluster import build_inputs, pd_inputs

    inputs = build_inputs(frame.head(0), None, plans, np.zeros(0, np.int64), pd=pd_inputs(cfg, plans), source=source)
    closed = cfg.trace is not None and cfg.trace.closed_loop  # its columns need the requests
    return variant_of(features(inputs)._replace(sessions=closed))


def fleet_variants(fleets: Iterable[tuple[FleetConfig, str]]) -> list[str]:
    """The kernel variants the replays of these (config, source) fleets run, in
    replay/engine/variants.py's order and at least the plain one: a command that replays many
    fleets (plan, sweep, demo, validate, calibrate) compiles or loads each once, up front and with
    the notice, so that no worker process compiles one. A variant follows from the config alone
    (no feature is read from a trace's rows), so each is `run_variant` on a trace of no requests.
    A config whose pools cannot be planned counts for none (its replay fails as it would have)."""
    import polars as pl

    from common.errors import UserError
    from replay.engine.variants import VARIANTS
    from replay.fleet.cluster import plan_pools
    from traces import cast_to_schema

    empty = cast_to_schema(pl.DataFrame(schema={"arrival_us": pl.Int64, "prompt_tokens": pl.Int64,
                                                "output_tokens": pl.Int64}), source="no requests")
    used = set()
    for cfg, source in fleets:
        try:
            used.add(run_variant(cfg, plan_pools(cfg, source), empty, source))
        except UserError:
            continue
    return [name for name in VARIANTS if name in used] or ["plain"]


def tool_version() -> str:
    try:
        return version("llm-replay")
    except PackageNotFoundError:
        return "0+unknown"


def replay_trace(
    trace: LoadedTrace,
    cfg: FleetConfig,
    *,
    engine: str = "numba",
    detailed_events: bool = False,
    progress: Callable[[int, int], None] | None = None,
    plans: list[PoolPlan] | None = None,
    config_source: str = "config",
    on_tick: Callable[..., None] | None = None,
    jobs: int = 1,
    spill_dir: Path | None = None,
) -> RunOutputs:
    """`jobs` > 1: pools that share nothing are replayed in up to that many processes, with the
    same outputs; RunOutputs.execution then says how the pools were replayed (and why serially,
    when they were). `spill_dir`: the run directory to be, beside which a large run's request
    rows are spilled as they are made (replay/outputs/rows.py; default: the system's temp folder)."""
    started = time.perf_counter()
    # requests.parquet's metadata, known before its rows: a large run's file is made as they come
    ids = {"version": tool_version(), "config_sha256": cfg.sha256(), "trace_sha256": trace.sha256}
    rows = RequestRows(spill_dir, metadata=file_metadata(ids))
    run = dict(engine=engine, detailed_events=detailed_events, progress=progress, config_source=config_source,
               jobs=jobs, rows=rows)
    trace, raw = _simulate(trace, cfg, plans, on_tick, run)
    frame = trace.frame
    return_freed_memory()  # the engine's state, freed: not under the output frames' peak
    if raw.requests is not None:  # the engine kept its columns: rows made from them, a chunk at a time
        request_rows(frame, raw, cfg, rows)
        raw.requests = None
    rows.settle()
    requests = rows.lazy()
    ticks = tick_frame(raw, requests, cfg)
    span_s = raw.end_us / 1e6
    # A few columns of the rows read at a time (a spilled run's from its parts), each percentile found
    # exactly in a few passes without holding its column (replay/fleet/selection.py)
    summary = summarize(requests, ticks, raw, span_s)
    events = event_frame(raw)
    summary = {
        **summary["fleet"],
        "sim_span_s": round(span_s, 3),
        "engine": engine,
        "config_sha256": ids["config_sha256"],
        "trace_sha256": trace.sha256,
        "trace": str(trace.source),
        "trace_rows": trace.rows,
        "trace_dropped": dict(trace.dropped),
        "trace_reordered": trace.reordered,
        "version": ids["version"],
        "pools": summary["pools"],
        "workloads": summary["workloads"],
        "pool_plans": {
            p.name: {
                "model": p.model.id,
                "gpu": p.gpu.id,
                "tensor_parallel_size": p.config.tensor_parallel_size,
                "replicas": p.config.replicas,
                "kv_blocks_per_replica": p.capacity.kv_blocks,
                "kv_tokens_per_replica": p.capacity.kv_tokens,
                # what the KV cache was sized from: bytes per GPU, "cuda" (the GPU's reported
                # total) or "override" (the pool's gpu_memory_bytes)
                "gpu_memory_bytes": p.capacity.gpu_memory_bytes,
                "gpu_memory_source": p.capacity.gpu_memory_source,
                "max_model_len": p.max_model_len,
                "price_usd_per_gpu_hour": p.price_usd_per_gpu_hour,
                "step_model": p.step_model,
                "serving": p.serving.to_dict(),
            }
            for p in raw.plans
        },
    }
    if cfg.trace is not None and cfg.trace.closed_loop:
        from replay.fleet.sessions import session_summary

        summary["closed_loop"] = session_summary(frame, rows.collect())
    summary["verdict"] = verdict(summary, {"ttft_ms": cfg.slo.ttft_ms, "tpot_ms": cfg.slo.tpot_ms}, cfg.max_drain_s)
    # Wall time goes to timing.json, not summary.json: every other file of a rerun is byte-identical.
    return RunOutputs(rows, ticks, events, summary, cfg.to_dict(), {"replay_s": time.perf_counter() - started},
                      execution=execution(raw, jobs))


def _simulate(trace: LoadedTrace, cfg: FleetConfig, plans: list[PoolPlan] | None, on_tick, run: dict):
    """(the trace as replayed, the raw run): a trace read in batches is replayed so where the
    replay can take it (replay/fleet/streamed.py `streams`), else read whole first."""
    if trace.stream is not None:
        plans = plans if plans is not None else plan_pools(cfg, run["config_source"])
        if streams(trace, cfg, plans, run["engine"], run["jobs"], on_tick):
            return trace, simulate_streamed(trace.stream, trace.prefix_block_tokens, cfg, plans, **run)
        trace = trace.whole()
    return trace, simulate(trace.frame, trace.prefix_block_tokens, cfg, plans=plans, on_tick=on_tick, **run)


def request_rows(frame, raw, cfg: FleetConfig, rows: RequestRows) -> None:
    """The run's request rows, made from the engine's columns a chunk at a time."""
    RowMaker(frame, raw.plans, raw.pool_index, raw.replica_slots, cfg).chunks(raw.requests, rows)


def execution(raw, jobs: int) -> str | None:
    """How the pools were replayed, when there was a choice: in how many processes, or why in one."""
    pools = len(raw.plans)
    if pools < 2 or jobs <= 1:
        return None
    if raw.workers > 1:
        return f"replayed the {pools} pools in {raw.workers} worker processes (--jobs {jobs})"
    return f"replayed the {pools} pools in one process: {raw.serial_reason}"
