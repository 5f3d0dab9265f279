"""Will the run fit? `llm-replay run --max-memory`: the run's peak RSS estimated before anything is
loaded, from the trace's row count (Parquet: the footer; text: its line endings, counted in
fixed-size chunks) and the bytes per request that `bench/bench_memory.py` measures, against the
memory the machine (or the cgroup the process runs in) has. The figures are the engine's of
today: a change to the engine's per-request state or to the outputs moves them (rerun the bench).

The estimate is deliberately an upper bound: a window or a filter only removes rows, and a trace
that `grow_rate` / `scale_workload` grows is counted at its largest factor.
"""

from __future__ import annotations

import gzip
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from common.errors import TraceError, UserError
from traces import BUNDLED, DEFAULT_TRACE
from traces.config import reads_as_is
from traces.stream import batch_rows_for, readable_in_batches
from traces.stream import hashes_per_row as _sampled_hashes_per_row
from traces.limits import DEFAULT_LIMITS, human_bytes

# bench/bench_day.py's KPA-scaled m-large day, `llm-replay run` in a fresh process: its first 4 h
# (3.10M requests) peaked at ~0.96 GB and the whole day (24.13M) at 4.1-4.4 GB, ~160 bytes a
# request over ~0.47 GB. The engine keeps no per-request output columns (its window hands finished
# requests over as rows, replay/engine/window.py), the rows are written to requests.parquet as they come past 1M
# (replay/outputs/rows.py) and the summary reads them a few columns at a time; what is left per
# request is the trace's frame (~75 B: two String columns, an empty List one) and the engine's input
# columns (~24 B). A replay that keeps every request's output columns to its end (the reference
# engine, pools in worker processes, a closed loop, `run --tui`) adds ~90 B of them (not measured
# here). Rounded up (about 1.8x the day's peak): an estimate that refuses a run that would fit is a
# nuisance, one that lets the kernel kill it loses the replay. (Before the rows were chunked: 256 MiB
# + 750 B; the day peaked at 9.26 GB.)
BASELINE_BYTES = 512 << 20
BYTES_PER_REQUEST = 300
# A canonical Parquet trace read in batches (traces/stream.py; replay/fleet/streamed.py) leaves no
# trace frame and no engine input column: the window and the batches it reads are bounded, and
# the summary finds its percentiles in a few passes of the spilled rows without holding a column
# of them (replay/fleet/selection.py). What grows with the requests is the tick windows' reads (a
# span of first tokens, per-edge counts) and a byte of pool each where there are several. Measured
# in batches, `llm-replay run` in a fresh process on bench_day.py's KPA fleet: the m-large day
# (24.13M) peaked at 1.26 GB (the replay's window; the summary 1.00 GB), m-mid's day (115.4M) at
# 2.83 GB (the tick windows; the replay 1.60, the summary 1.24, the write 1.34): 20-30 B a request
# over the baseline, rounded up as above. (Before the summary's selection, ~120 B: the summary held
# a narrow frame of every request, m-mid's day peaking at 6.8-8.0 GB.)
STREAMED_BASELINE_BYTES = BASELINE_BYTES
STREAMED_BYTES_PER_REQUEST = 50
# A Parquet trace's prefix hashes (bench/bench_stream_hashes.py, 2M rows of ~22 hashes): read whole,
# ~15 B a hash of the trace (the frame's list column, the engine's flat copy of it); read in batches,
# 0.23 GB over a plain trace's, however long the trace: ~57 B a hash of one batch of ~4M hashes
# (traces/stream.py HASH_BATCH; the batch's lists and flat copy, two batches held while the window
# crosses from one to the next, and the Parquet reader's decoded pages). The hashes a row are the mean
# of the file's first rows (traces/stream.py hashes_per_row: a pass over every list would cost
# seconds a run). Rounded up as above.
HASH_BYTES = 24
STREAMED_HASH_BYTES = 80
_CHUNK = 16 << 20


@dataclass(frozen=True)
class Estimate:
    rows: int  # requests the trace may hold (an upper bound)
    peak_bytes: int


def estimate_run(trace_cfg, max_bytes: int = DEFAULT_LIMITS.max_bytes, streamed: bool = False,
                 lora: bool = False) -> Estimate | None:
    """The run's peak RSS for the trace section `trace_cfg` (paths already resolved, as
    `effective_trace` gives them); None where the rows cannot be known before the trace is made
    (a synthetic trace, or a what-if that adds a synthetic tenant). `streamed`: the replay reads a
    trace that `traces.stream.readable_in_batches` (`lora`: on a pool serving LoRA adapters) in
    batches, as replay/fleet/streamed.py says it can; it then holds no frame of the trace."""
    if streamed and reads_as_is(trace_cfg):
        path = trace_cfg.path if trace_cfg is not None and trace_cfg.path else DEFAULT_TRACE
        if path not in BUNDLED and readable_in_batches(Path(path).expanduser(), lora):
            rows = count_rows(path, max_bytes)
            per_row = hashes_per_row(path)
            batch = round(per_row * min(rows, batch_rows_for(per_row)))
            return Estimate(rows, STREAMED_BASELINE_BYTES + STREAMED_BYTES_PER_REQUEST * rows
                            + STREAMED_HASH_BYTES * batch)
    if trace_cfg is None:
        paths = [DEFAULT_TRACE]
    elif trace_cfg.synthetic is not None or (trace_cfg.whatif is not None and trace_cfg.whatif.add_tenant):
        return None
    else:
        paths = ([trace_cfg.path] if trace_cfg.path or not trace_cfg.merge else [DEFAULT_TRACE]) \
            + [m.path for m in trace_cfg.merge]
        paths = [p or DEFAULT_TRACE for p in paths]
    counts = [count_rows(p, max_bytes) for p in paths]
    hashes = sum(n * hashes_per_row(p) for n, p in zip(counts, paths))
    rows = round(sum(counts) * _growth(trace_cfg))
    sample = trace_cfg.sample if trace_cfg is not None else None
    if sample is not None:
        rows = min(rows, sample.n) if sample.n is not None else round(rows * sample.fraction)
    return Estimate(rows, BASELINE_BYTES + BYTES_PER_REQUEST * rows + round(HASH_BYTES * hashes * _growth(trace_cfg)))


def _growth(trace_cfg) -> float:
    whatif = trace_cfg.whatif if trace_cfg is not None else None
    if whatif is None:
        return 1.0
    return max(1.0, whatif.grow_rate or 1.0, *(whatif.scale_workload or {}).values())


def count_rows(path: str, max_bytes: int = DEFAULT_LIMITS.max_bytes) -> int:
    """Rows of a trace file without loading it: a Parquet footer's count, else its line endings
    (a header line or blank lines make this a slight over-count), counted over at most
    `max_bytes` (decompressed; past them the loader refuses the file). 0 for what is no regular
    file or cannot be read: the loader then says what is wrong with it, as without --max-memory."""
    from traces.bundled import bundled_trace_path

    file = bundled_trace_path(path) if path in BUNDLED else Path(path).expanduser()
    try:
        if not stat.S_ISREG(os.stat(file).st_mode):
            return 0  # a FIFO or a device: never opened here (the loader refuses it by its kind)
        with open(file, "rb") as fh:
            head = fh.read(4)
            if head == b"PAR1":
                return _parquet_rows(file)
            fh.seek(0)
            reader = gzip.GzipFile(fileobj=fh) if head[:2] == b"\x1f\x8b" else fh
            lines = read = 0
            last = b"\n"
            while read <= max_bytes and (chunk := reader.read(_CHUNK)):
                lines += chunk.count(b"\n")
                read += len(chunk)
                last = chunk[-1:]
            return lines + (last != b"\n")
    except (OSError, EOFError, gzip.BadGzipFile):
        return 0


def hashes_per_row(path: str) -> float:
    """Prefix hashes a row of a Parquet trace with a `prefix_hashes` column (sampled: traces/stream.py
    hashes_per_row); 0 for any other file (a text trace's hashes are not counted)."""
    import polars as pl

    from traces.bundled import bundled_trace_path

    file = bundled_trace_path(path) if path in BUNDLED else Path(path).expanduser()
    try:
        if not stat.S_ISREG(os.stat(file).st_mode):
            return 0.0
        with open(file, "rb") as fh:
            if fh.read(4) != b"PAR1":
                return 0.0
        return _sampled_hashes_per_row(file)
    except (OSError, pl.exceptions.PolarsError):
        return 0.0


def _parquet_rows(file: Path) -> int:
    import polars as pl

    try:
        return pl.scan_parquet(file).select(pl.len()).collect().item()
    except pl.exceptions.PolarsError:
        return 0


def available_bytes() -> int:
    """MemAvailable of /proc/meminfo, lowered to the cgroup's memory limit where one is set (v2
    memory.max, v1 memory.limit_in_bytes)."""
    best = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                best = int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    for limit in _cgroup_limits():
        best = limit if best is None else min(best, limit)
    return best if best is not None else 1 << 62  # nothing says: no bound


def _cgroup_limits() -> list[int]:
    found = []
    try:
        own = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        own = []
    places = [Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")]
    for line in own:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            places.append(Path("/sys/fs/cgroup") / path.lstrip("/") / "memory.max")
        elif "memory" in controllers.split(","):
            places.append(Path("/sys/fs/cgroup/memory") / path.lstrip("/") / "memory.limit_in_bytes")
    for place in places:
        try:
            text = place.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:  # "max", or v1's page-rounded 2^63: no limit
            found.append(int(text))
    return found


def check_fits(trace_cfg, max_memory: int | None, source: str, max_bytes: int = DEFAULT_LIMITS.max_bytes,
               streamed: bool = False, lora: bool = False) -> Estimate | None:
    """Refuse, before the trace is read, a run whose estimated peak exceeds `max_memory` (None:
    what the machine has). The estimate, or None where there is none. `streamed`, `lora`: as
    `estimate_run` takes them."""
    try:
        estimate = estimate_run(trace_cfg, max_bytes, streamed, lora)
    except TraceError:
        return None  # the loader names the problem
    if estimate is None:
        return None
    limit = available_bytes() if max_memory is None else max_memory
    if estimate.peak_bytes > limit:
        given = "--max-memory" if max_memory is not None else "the memory available (MemAvailable or the cgroup limit)"
        raise UserError(
            f"{source}: the trace holds up to {estimate.rows:,} requests, an estimated peak of "
            f"{human_bytes(estimate.peak_bytes)}, more than {given} of {human_bytes(limit)}; replay part of it "
            f"(--window, --sample) or on a machine with more memory"
            + (", or raise --max-memory" if max_memory is not None else ", or pass a larger --max-memory"))
    return estimate


def return_freed_memory() -> None:
    """Give the C heap's free pages back to the system (glibc's malloc_trim(3)); a no-op where the
    C library has none. Called when the engine's state has just been freed: numpy's arrays live in
    glibc's heap, whose free space otherwise stays in the process's RSS while the output frames
    are built on top of it (bench/bench_memory.py: the run's peak moved there)."""
    import ctypes

    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim.argtypes, trim.restype = (ctypes.c_size_t,), ctypes.c_int
    trim(0)
