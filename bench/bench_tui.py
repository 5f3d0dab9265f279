"""Dashboard speed on a day-long run: 86,400 ticks x 4 pools (345,600 tick rows) and 400,000
requests, written directly as run files (no replay). Prints medians of:

- open: load the run, mount the app, first frame (in-process), and `llm-replay tui --screenshot`
  in a fresh process (interpreter and imports included);
- seek: a seek key, until the frame is redrawn;
- live key latency: keys while the dashboard follows a live run that a separate process extends
  (replay/fleet/live.py's chunk layout) by 600 ticks every half second, from half the run to its end;
  an unbound key's round trip (the harness alone: Pilot's press and pause) is given beside it;
- frame time: from a key sent to its screen update ready for the terminal, timed at Textual's
  `App._display`, without the harness's idle polling (which waits in 20 ms steps).

    python bench/bench_tui.py [--ticks 86400] [--pools 4] [--requests 400000]
    python bench/bench_tui.py --requests 1000000 --repeat 1     # a run of a million requests
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tui.app import make_app  # noqa: E402


def synthetic_run(out: Path, ticks: int, pools: int, requests: int, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    names = [f"pool{i}" for i in range(pools)]
    t = np.repeat(np.arange(1, ticks + 1, dtype=np.int64) * 1_000_000, pools)
    n = len(t)
    day = np.sin(np.linspace(0, 2 * np.pi, ticks)).repeat(pools)
    waiting = np.maximum(0, rng.poisson(5, n) + (day > 0.9) * rng.poisson(200, n))
    replicas = (2 + (day > 0.5)).astype(np.int32)
    total = replicas.astype(np.int64) * 25_000
    used = (total * np.clip(0.4 + 0.5 * day + rng.normal(0, 0.05, n), 0, 1)).astype(np.int64)
    frame = pl.DataFrame({
        "t_us": t, "pool": names * ticks, "replicas_active": replicas, "replicas_loading": np.zeros(n, np.int32),
        "gpus": replicas * 4, "waiting": waiting.astype(np.int32), "running": rng.integers(0, 256, n, dtype=np.int32),
        "kv_usage": used / total, "kv_used_blocks": used, "kv_total_blocks": total,
        "arrivals": rng.poisson(4, n).astype(np.int32), "finished": rng.poisson(4, n).astype(np.int32),
        "rejected": rng.poisson(0.01, n).astype(np.int32), "preemptions": rng.poisson(0.05, n).astype(np.int32),
        "prompt_tokens_per_s": rng.normal(8000, 500, n), "output_tokens_per_s": rng.normal(1500, 100, n),
        "gpu_busy": np.clip(rng.normal(0.97, 0.02, n), 0, 1), "cost_usd": np.cumsum(replicas * 4 * 3.0 / 3600.0),
        "cost_per_mtok_out_usd": rng.normal(7, 0.5, n), "ttft_p50_ms": rng.gamma(2, 150, n),
        "ttft_p99_ms": rng.gamma(2, 2000, n) * (1 + 10 * (day > 0.9)), "slo_attainment": np.clip(1 - 0.3 * (day > 0.9)
                                                                                                 * rng.random(n), 0, 1),
        "replicas_draining": np.zeros(n, np.int32),
    })
    out.mkdir(parents=True, exist_ok=True)
    frame.write_parquet(out / "ticks.parquet")
    ev_t = np.sort(rng.integers(0, ticks * 1_000_000, 2000))
    kinds = rng.choice(["scale_up", "scale_down", "replica_active", "reject", "preempt"], 2000)
    pl.DataFrame({"t_us": ev_t, "pool": rng.choice(names, 2000), "replica": rng.integers(0, 8, 2000).astype(np.int32),
                  "kind": kinds, "detail": ["hpa: 2 -> 3 replicas (metric=waiting, value=9, target=2)"] * 2000,
                  "request_id": pl.Series([None] * 2000, dtype=pl.Int64)}).write_parquet(out / "events.parquet")
    arrival = np.sort(rng.integers(0, ticks * 1_000_000, requests))
    ttft = rng.gamma(2, 300_000, requests).astype(np.int64)
    sched = arrival + ttft // 2
    first = arrival + ttft
    fin = first + rng.integers(1_000_000, 30_000_000, requests)
    pl.DataFrame({
        "request_id": np.arange(requests), "workload": rng.choice(["chat", "docs"], requests),
        "pool": rng.choice(names, requests), "replica": rng.integers(0, 3, requests).astype(np.int32),
        "arrival_us": arrival, "prompt_tokens": rng.integers(10, 8000, requests).astype(np.int32),
        "output_tokens": rng.integers(2, 800, requests).astype(np.int32), "cached_tokens": np.zeros(requests, np.int32),
        "first_scheduled_us": sched, "first_token_us": first, "finished_us": fin, "ttft_us": ttft,
        "tpot_us": rng.normal(30_000, 3000, requests), "e2e_us": fin - arrival,
        "preemptions": rng.poisson(0.02, requests).astype(np.int32), "status": ["finished"] * requests,
        "reject_reason": pl.Series([None] * requests, dtype=pl.String), "slo_met": rng.random(requests) < 0.95,
    }).write_parquet(out / "requests.parquet")
    cfg = {"tick_s": 1.0, "metrics_window_s": 60.0, "slo": {"ttft_ms": 2000, "tpot_ms": 100},
           "pools": [{"name": p} for p in names]}
    (out / "config.yaml").write_text(yaml.safe_dump(cfg))
    (out / "summary.json").write_text("{}\n")
    return out


OFFSET = 1_733_050_800  # the observed export's wall time of the run's time 0
SCRAPE_S = 30
TTFT_LE = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
           80.0, 160.0, 640.0, 2560.0, np.inf)  # vllm/v1/metrics/loggers.py


def observed_export(run: Path, out: Path) -> Path:
    """The run as its fleet's Prometheus would have scraped it every SCRAPE_S, as range-query JSON
    (as tests/fixtures/observed/make_incident.py makes its example), the waiting queue doubled in
    the run's second quarter so the overlay has somewhere to part; the run's config gains the
    `observed:` section that reads it."""
    ticks = pl.read_parquet(run / "ticks.parquet").sort("t_us")
    req = pl.read_parquet(run / "requests.parquet")
    series = []
    for (pool,), g in ticks.group_by("pool", maintain_order=True):
        t = g["t_us"].to_numpy() / 1e6
        keep = (t % SCRAPE_S) == 0
        at = t[keep]
        col = (lambda c: g[c].cast(pl.Float64).to_numpy()[keep])  # noqa: E731
        labels = {"pool": pool, "pod": f"{pool}-0"}

        def put(name, values, **extra):
            series.append({"metric": {"__name__": name, **labels, **extra},
                           "values": [[OFFSET + s, f"{v:.6g}"] for s, v in zip(at.tolist(), values.tolist())]})

        quarter = (at > at[-1] / 4) & (at <= at[-1] / 2)
        put("vllm:num_requests_waiting", col("waiting") * np.where(quarter, 2.0, 1.0))
        put("vllm:num_requests_running", col("running"))
        put("vllm:kv_cache_usage_perc", col("kv_usage"))
        put("DCGM_FI_DEV_GPU_UTIL", 100 * col("gpu_busy"))
        put("kube_deployment_status_replicas", col("replicas_active") + col("replicas_loading"))
        put("vllm:generation_tokens_total", np.cumsum(g["output_tokens_per_s"].to_numpy())[keep])
        mine = req.filter(pl.col("pool") == pool)
        first = mine["first_token_us"].to_numpy() / 1e6
        ttft = mine["ttft_us"].to_numpy() / 1e6
        for le in TTFT_LE:
            counts = np.searchsorted(np.sort(first[ttft <= le]), at, side="right").astype(np.float64)
            put("vllm:time_to_first_token_seconds_bucket", counts, le="+Inf" if np.isinf(le) else f"{le:g}")
    file = out / "observed.json"
    file.write_text(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": series}}))
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["observed"] = {"offset_s": OFFSET, "window_s": 300, "rate_window_s": 60}
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    return file


def figures(values: list[float]) -> str:
    ms = np.array(values) * 1000
    return (f"median {np.median(ms):6.1f} ms, p90 {np.percentile(ms, 90):6.1f}, max {ms.max():6.1f} "
            f"(n={len(ms)})")


def median_ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:7.1f} ms (max {max(values) * 1000:.1f}, n={len(values)})"


FRAMES: list[float] = []  # when the app handed a screen update to its driver, newest last


def _watch_frames(app) -> None:
    """Record when each screen update is ready for the terminal (Textual's `App._display` gets the
    compositor's update after the layout and every changed line are rendered): a key's frame time
    is then measured without the test harness's idle polling, which waits in 20 ms steps."""
    display = app._display

    def timed(screen, renderable):
        if renderable is not None:
            FRAMES.append(time.perf_counter())
        return display(screen, renderable)

    app._display = timed


async def _press(pilot, key: str, frames: list[float] | None = None) -> float:
    """The round trip of a key through the harness; with `frames`, also appends the key's frame
    time (key sent -> its first screen update ready, None when it drew nothing)."""
    t0 = time.perf_counter()
    seen = len(FRAMES)
    await pilot.press(key)
    await pilot.pause()
    if frames is not None:
        drawn = [t for t in FRAMES[seen:] if t > t0]
        frames.append(drawn[0] - t0 if drawn else None)
    return time.perf_counter() - t0


SCORED: list[float] = []  # with an export: open -> its divergence scored (off the interface's thread)


async def open_and_seek(path: Path, size=(200, 60), seeks: int = 40, observed: Path | None = None):
    """(open time, seek round trips, round trips of an unbound key: the test harness's own floor);
    with `observed`, the export drawn over the charts (the seeks wait for its scoring first)."""
    began = time.perf_counter()
    app = make_app(path, at="12:00:00", observed=[str(observed)] if observed else None)
    _watch_frames(app)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        opened = time.perf_counter() - began
        if observed is not None:
            await app.workers.wait_for_complete()
            await pilot.pause()
            SCORED.append(time.perf_counter() - began)
        keys = ["right", "shift+right", "pagedown", "left", "b", "w", "n", "p"]
        frames: list[float] = []
        times = [await _press(pilot, keys[i % len(keys)], frames) for i in range(seeks)]
        floor = [await _press(pilot, "x") for _ in range(seeks // 2)]
        return opened, times, floor, [f for f in frames if f is not None]


LIVE_KEYS = ("left", "right", "p", "shift+left")


async def live_keys(path: Path, size=(200, 60), presses: int = 60) -> tuple[list[float], list[float], int]:
    """(seek keys' round trips, an unbound key's round trips, reloads seen) while following."""
    app = make_app(path, poll_s=0.5)
    reloads = 0
    original = app.model.set_runs

    def counted(runs):
        nonlocal reloads
        reloads += 1
        original(runs)

    app.model.set_runs = counted
    _watch_frames(app)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        times, idle, frames = [], [], []
        for i in range(presses):
            times.append(await _press(pilot, LIVE_KEYS[i % len(LIVE_KEYS)], frames))
            await asyncio.sleep(0.1)  # spread the presses over the follower's reloads
            idle.append(await _press(pilot, "x"))
            await asyncio.sleep(0.05)
        return times, idle, reloads, [f for f in frames if f is not None]


def feed_live(src: str, dst: str, ready, stop, start_share: float = 0.5, chunks_before: int = 100,
              step_ticks: int = 600, interval_s: float = 0.5) -> None:
    """A 'replay', in its own process as `run --tui`'s is: DIR/live/ in replay/fleet/live.py's layout,
    holding `start_share` of the run in `chunks_before` chunks, then a chunk of the next
    `step_ticks` ticks (with the requests that ended, the first tokens, the in-flight requests)
    every `interval_s`, until stopped."""
    from replay.fleet.live import drop_old_inflight, write_atomic, write_chunk

    src, live = Path(src), Path(dst) / "live"
    live.mkdir(parents=True)
    shutil.copy(src / "config.yaml", live / "config.yaml")
    ticks = pl.read_parquet(src / "ticks.parquet")
    events = pl.read_parquet(src / "events.parquet")
    requests = pl.read_parquet(src / "requests.parquet")
    tick_us = int(ticks["t_us"].min())
    total = int(ticks["t_us"].max()) // tick_us
    ended = pl.coalesce("finished_us", "arrival_us")
    seq, done = 0, 0

    def chunk(hi: int) -> None:
        nonlocal seq, done
        lo, seq = done, seq + 1
        span = lambda c: (pl.col(c) > lo) & (pl.col(c) <= hi)  # noqa: E731
        write_chunk(live, seq, ticks.filter(span("t_us")), events.filter(span("t_us")),
                    requests.filter(span("finished_us")),
                    requests.filter(span("first_token_us")).select("request_id", "pool", "first_token_us",
                                                                   "ttft_us"),
                    requests.filter((pl.col("arrival_us") <= hi) & (ended > hi)).with_columns(
                        status=pl.lit("unfinished")))
        done = hi
        body = {"state": "running", "seq": seq, "done_us": hi, "end_us": total * tick_us}
        write_atomic(live / "status.json", lambda p: p.write_text(json.dumps(body)))
        drop_old_inflight(live, seq)

    start = int(total * start_share)
    for k in range(1, chunks_before + 1):
        chunk(start * k // chunks_before * tick_us)
    ready.set()
    while not stop.wait(interval_s) and done < total * tick_us:
        chunk(min(done + step_ticks * tick_us, total * tick_us))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ticks", type=int, default=86_400)
    ap.add_argument("--pools", type=int, default=4)
    ap.add_argument("--requests", type=int, default=400_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-tui-"))
    try:
        run = synthetic_run(tmp / "run", args.ticks, args.pools, args.requests)
        print(f"run: {args.ticks:,} ticks x {args.pools} pools = {args.ticks * args.pools:,} tick rows, "
              f"{args.requests:,} requests ({sum(f.stat().st_size for f in run.iterdir()) / 1e6:.1f} MB)")
        opens, seeks, floor, seek_frames = [], [], [], []
        for _ in range(args.repeat):
            opened, times, idle, frames = asyncio.run(open_and_seek(run))
            opens.append(opened)
            seeks += times
            floor += idle
            seek_frames += frames
        print(f"open (load + mount + first frame, in-process): {median_ms(opens)}   target < 2000 ms")
        cold = []
        for _ in range(3):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "llm_replay", "tui", str(run), "--screenshot", str(tmp / "s.svg"),
                            "--size", "200x60"], check=True, capture_output=True, cwd=ROOT)
            cold.append(time.perf_counter() - t0)
        # the largest of those processes (no other child has run yet): what opening the run costs in memory
        peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        print(f"open, fresh process (`llm-replay tui --screenshot`, imports and SVG included): {median_ms(cold)}; "
              f"peak RSS {peak_mb:,.0f} MB")
        print(f"harness floor (an unbound key through Pilot press + pause): {figures(floor)}")
        print(f"seek redraw (key -> frame drawn, floor included): {figures(seeks)}   target < 100 ms")
        net_seek = np.array(seeks) - statistics.median(floor)
        print(f"seek redraw, net of the floor's median: median {np.median(net_seek) * 1000:.1f} ms, p90 "
              f"{np.percentile(net_seek, 90) * 1000:.1f}, max {net_seek.max() * 1000:.1f}")
        print(f"seek frame time (key sent -> screen update ready, no harness polling): {figures(seek_frames)}   "
              "target < 100 ms")
        export = observed_export(run, tmp)
        print(f"observed export: {export.stat().st_size / 1e6:.1f} MB of range-query JSON, every {SCRAPE_S} s")
        opens, seek_frames = [], []
        for _ in range(args.repeat):
            opened, _, _, frames = asyncio.run(open_and_seek(run, observed=export))
            opens.append(opened)
            seek_frames += frames
        print(f"with the observed overlay: open {median_ms(opens)}   target < 2000 ms")
        print(f"  open -> divergence scored (a worker thread; marks and o's table then): {median_ms(SCORED)}")
        print(f"  seek frame time: {figures(seek_frames)}   target < 100 ms")
        ctx = multiprocessing.get_context("spawn")
        ready, stop = ctx.Event(), ctx.Event()
        feeder = ctx.Process(target=feed_live, args=(str(run), str(tmp / "live-run"), ready, stop))
        feeder.start()
        try:
            ready.wait(300)
            keys, idle, reloads, live_frames = asyncio.run(live_keys(tmp / "live-run"))
        finally:
            stop.set()
            feeder.join()
        floor_med = statistics.median(floor)
        print(f"live, following a replay that adds 600 ticks every 0.5 s ({reloads} reloads while keys were "
              "pressed):")
        print(f"  seek keys (floor included):    {figures(keys)}   target < 100 ms")
        for k, name in enumerate(LIVE_KEYS):
            print(f"    {name:<11} {figures(keys[k::len(LIVE_KEYS)])}")
        print(f"  unbound key (floor included):  {figures(idle)}")
        print(f"  seek keys' frame time (no harness polling): {figures(live_frames)}   target < 100 ms")
        net = np.array(keys) - floor_med
        print(f"  seek keys net of the floor's median: median {np.median(net) * 1000:.1f} ms, p90 "
              f"{np.percentile(net, 90) * 1000:.1f}, max {net.max() * 1000:.1f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
