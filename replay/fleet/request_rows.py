"""requests.parquet's rows, made from the engine's output columns a chunk of requests at a time.

A row depends on its request alone (the trace's row, the engine's columns, its pool's terms), so
the rows of requests [lo, hi) are made from those slices only: a replay hands them over as they
leave the engine, or in chunks at its end, and never builds the whole trace's frame at once.
String columns are gathered from their few distinct values by index (no Python object per row).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from replay.config import FleetConfig
from replay.engine.common import FINISHED, REJECT_NAMES, REJECTED
from replay.model.serving import token_return_us, window_delay_us, window_step_us
from replay.outputs.schema import REQUESTS

REQUEST_COLUMNS = REQUESTS.names
STATUS_NAMES = ("finished", "rejected", "unfinished")
CHUNK_ROWS = 1 << 18  # requests a frame of rows is made from (as the engine hands them over, or at the end)


_STATUS = pl.Series(STATUS_NAMES, dtype=pl.String)
_REJECT = pl.Series([name or None for name in REJECT_NAMES], dtype=pl.String)  # none: null


def _masked(values: np.ndarray, valid: np.ndarray) -> pl.Series:
    """`values`, null where not `valid` (polars reads a masked array's mask as its validity)."""
    return pl.Series(np.ma.masked_array(values, ~valid))


def _when(values: np.ndarray, dtype=np.int64) -> pl.Series:
    """An engine column with -1 for none, as `dtype` with nulls."""
    return _masked(values.astype(dtype, copy=False), values != -1)


def windowed(plans: list) -> bool:
    """Whether a pool returns decode tokens once per window of steps (vLLM V0's multi-step)."""
    return any(p.serving.decode_window_steps > 1 for p in plans)


class RowMaker:
    """Makes the rows of requests [lo, hi) from the engine's columns for them."""

    def __init__(self, trace: pl.DataFrame, plans: list, pool_index: np.ndarray, replica_slots,
                 cfg: FleetConfig):
        from replay.fleet.cluster import pd_inputs

        self.trace, self.pool_index = trace, pool_index
        self.pool_names = pl.Series([p.name for p in plans], dtype=pl.String)
        self.replica_pool = np.repeat(np.arange(len(plans)), [int(n) for n in replica_slots])
        self.servings = [p.serving for p in plans]
        # vLLM V0's decode windows (replay/model/serving.py) hold a request's last token by its
        # replica's median step, read from the whole run's columns: such runs keep them to the end.
        self.windows = np.array([s.decode_window_steps for s in self.servings], np.int64)
        self.windowed = windowed(plans)
        self.window_step_us: dict[int, float] | None = None
        self.pd = pd_inputs(cfg, plans)
        self.slo = cfg.slo
        self._pool_or_none = pl.Series([*self.pool_names, None], dtype=pl.String)  # the last: no prefill pool

    def frame(self, lo: int, cols: dict[str, np.ndarray]) -> pl.DataFrame:
        """The rows of requests [lo, lo + n), n the length of `cols`' arrays (`sent_us` among
        them: a closed-loop run's).

        Every column is made in numpy and handed to polars once, its nulls as a mask (a numpy
        masked array: a bitmap, no copy): the polars expressions this was (a replace per column,
        five with_columns, ~19 small queries a chunk) took 3.4 s of m-large's day. The trace's
        columns are its own slices, in its batches' chunks: requests.parquet's row groups are cut
        at those (replay/outputs/rows.py), every other column is one chunk, as before."""
        n = len(cols["state"])
        trace = self.trace.slice(lo, n)
        pools = self.pool_index[lo:lo + n]
        state = cols["state"]
        status = np.where(state == FINISHED, 0, np.where(state == REJECTED, 1, 2))
        prefill = cols["prefill_replica"]
        prefill_pool = (np.where(prefill >= 0, self.replica_pool[np.maximum(prefill, 0)], -1) if len(self.replica_pool)
                        else np.full(n, -1, np.int64))
        output = trace["output_tokens"].to_numpy()
        sent = "sent_us" in cols  # closed loop: when the client sent it, after the turn before it ended
        arrival = cols["sent_us"].astype(np.int64, copy=False) if sent else trace["arrival_us"].to_numpy()
        # Tokens reach the client token_return_us after their step (replay/model/serving.py): the request's
        # first_token_us and finished_us are when its client sees them; a decode window's end is later still.
        lag = token_return_us(pools, self.servings)
        first, finished = cols["first_token_us"], cols["finished_us"]
        has_first, has_finished = first != -1, finished != -1
        first_us = first + lag
        finished_us = finished + lag
        if self.windowed:
            finished_us += window_delay_us(output, first, finished, cols["replica"], self.windows[pools],
                                           self.window_step_us)
        ttft = first_us - arrival
        decoded = (output > 1) & has_first & has_finished
        with np.errstate(divide="ignore", invalid="ignore"):  # one output token: no TPOT (masked below)
            # as polars divided them: both sides as float64
            tpot = (finished_us - first_us).astype(np.float64) / (output.astype(np.float64) - 1.0)
        # Each request against its class's targets (slo.by_workload), else the fleet's: ints
        # compared as float64, as polars compares an Int64 column with a Float64 one.
        met = ((status == 0) & has_first & (ttft <= self._target("ttft_ms", trace))
               & (~decoded | (tpot <= self._target("tpot_ms", trace))))
        columns = {
            "request_id": trace["request_id"],
            "workload": trace["workload"],
            "pool": self.pool_names.gather(pools),
            "replica": _when(cols["replica"], np.int32),
            "arrival_us": pl.Series(arrival, dtype=pl.Int64) if sent else trace["arrival_us"],
            "prompt_tokens": trace["prompt_tokens"],
            "output_tokens": trace["output_tokens"],
            "cached_tokens": pl.Series(cols["cached_tokens"].astype(np.int32, copy=False)),
            "first_scheduled_us": _when(cols["first_scheduled_us"]),
            "first_token_us": _masked(first_us, has_first),
            "finished_us": _masked(finished_us, has_finished),
            "ttft_us": _masked(ttft, has_first),
            "tpot_us": _masked(tpot, decoded),
            "e2e_us": _masked(finished_us - arrival, has_finished),
            "preemptions": pl.Series(cols["preemptions"].astype(np.int32, copy=False)),
            "status": _STATUS.gather(status),
            "reject_reason": _REJECT.gather(cols["reject"].astype(np.int64)),
            "slo_met": pl.Series(met),
            "prefill_pool": self._pool_or_none.gather(np.where(prefill_pool >= 0, prefill_pool, len(self.pool_names))),
            "prefill_replica": _when(prefill, np.int32),
            "prefill_end_us": _when(cols["prefill_end_us"]),
            "kv_transfer_start_us": _when(cols["kv_transfer_start_us"]),
            "kv_transfer_end_us": _when(cols["kv_transfer_end_us"]),
            "kv_transfer_us": self._transfer_us(trace, cols["kv_transfer_end_us"]),
        }
        df = pl.DataFrame([s.alias(name) for name, s in columns.items()]).select(REQUEST_COLUMNS)
        # A closed-loop run keeps the trace's own arrival too, last (only there: other runs keep their shape).
        return df.with_columns(recorded_arrival_us=trace["arrival_us"]) if sent else df

    def _target(self, name: str, trace: pl.DataFrame) -> np.ndarray | float:
        """A latency target (us, float64) per request, by its workload's class, or the fleet's."""
        slo = self.slo
        default = getattr(slo, name) * 1000
        if not slo.by_workload:
            return default
        targets = {w: getattr(c, name) * 1000 for w, c in slo.by_workload.items()}
        return trace["workload"].replace_strict(targets, default=default, return_dtype=pl.Float64).to_numpy()

    def _transfer_us(self, trace: pl.DataFrame, end_us: np.ndarray) -> pl.Series:
        """The KV transfer's whole time: the engines' transfer_us before a layerwise transfer's overlap
        with the prefill (replay/engine/transfer.py), so kv_transfer_end_us - kv_transfer_start_us is only
        the part that outlasted the prefill."""
        pd = self.pd
        if not pd:
            return pl.repeat(None, len(end_us), dtype=pl.Int64, eager=True)
        whole = np.ceil(trace["prompt_tokens"].to_numpy() * pd["pd_us_per_token"]).astype(np.int64) + pd["pd_base_us"]
        return _masked(whole, end_us != -1)

    def chunks(self, cols: dict[str, np.ndarray], rows, chunk_rows: int | None = None) -> None:
        """Every request's rows, from the whole trace's columns, appended to `rows` a chunk at a time."""
        total = len(cols["state"])
        chunk_rows = chunk_rows or CHUNK_ROWS
        if self.windowed:
            self.window_step_us = window_step_us(self.trace["output_tokens"].to_numpy(), cols["first_token_us"],
                                                 cols["finished_us"], cols["replica"], self.windows[self.pool_index])
        for lo in range(0, max(total, 1), chunk_rows):
            rows.append(self.frame(lo, {k: v[lo:lo + chunk_rows] for k, v in cols.items()}))


class RowStream:
    """The engine's columns as it hands them over (in id order, a window slide's at a time:
    engine/window.py), made into rows CHUNK_ROWS at a time and appended to `rows`."""

    def __init__(self, maker: RowMaker, rows):
        self.maker, self.rows = maker, rows
        self.next = 0  # the first id not handed over yet
        self._held: list[dict[str, np.ndarray]] = []
        self._from = 0
        self._count = 0

    def __call__(self, lo: int, cols: dict[str, np.ndarray]) -> None:
        if lo != self.next:
            raise ValueError(f"request rows handed over out of order: {lo}, expected {self.next}")
        n = len(cols["state"])
        self.next += n
        self._held.append(cols)
        self._count += n
        if self._count >= (CHUNK_ROWS or 1):
            self.flush()

    def flush(self, eng=None) -> None:
        """Rows for what is held; at the end, with the engine: it hands over the rest first."""
        if eng is not None:
            eng.flush_rows()
        if not self._held:
            return
        held = self._held
        cols = {k: np.concatenate([c[k] for c in held]) for k in held[0]} if len(held) > 1 else held[0]
        self.rows.append(self.maker.frame(self._from, cols))
        self._from, self._held, self._count = self.next, [], 0


def stream_rows(eng, rows, frame: pl.DataFrame, plans: list, pool_index: np.ndarray, inputs, cfg: FleetConfig):
    """The RowStream that `eng` hands its requests' columns to as they leave it, into `rows`;
    None where there are no rows to gather, the engine keeps its columns to the end, or a pool's
    decode windows need the whole run's columns (RowMaker.windowed)."""
    if rows is None or not callable(getattr(eng, "stream_rows", None)) or not inputs.num_requests or windowed(plans):
        return None
    stream = RowStream(RowMaker(frame, plans, pool_index, inputs.pool_replicas, cfg), rows)
    eng.stream_rows(stream)
    return stream
