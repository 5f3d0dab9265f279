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


def _when(values: np.ndarray) -> pl.Series:
    return pl.Series(values, dtype=pl.Int64).replace(-1, None)


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
        slo = cfg.slo
        self.targets = {
            name: pl.col("workload").replace_strict({w: getattr(c, name) * 1000 for w, c in slo.by_workload.items()},
                                                    default=getattr(slo, name) * 1000, return_dtype=pl.Float64)
            for name in ("ttft_ms", "tpot_ms")}

    def frame(self, lo: int, cols: dict[str, np.ndarray]) -> pl.DataFrame:
        """The rows of requests [lo, lo + n), n the length of `cols`' arrays (`sent_us` among
        them: a closed-loop run's)."""
        n = len(cols["state"])
        trace = self.trace.slice(lo, n)
        pools = self.pool_index[lo:lo + n]
        state = cols["state"]
        status = np.where(state == FINISHED, 0, np.where(state == REJECTED, 1, 2))
        prefill = cols["prefill_replica"]
        if len(self.replica_pool):
            prefill_pool = pl.Series(np.where(prefill >= 0, self.replica_pool[np.maximum(prefill, 0)], -1))
        else:
            prefill_pool = pl.Series(np.full(n, -1, np.int64))
        df = pl.DataFrame(
            {
                "request_id": trace["request_id"],
                "workload": trace["workload"],
                "pool": self.pool_names.gather(pools),
                "replica": _when(cols["replica"]).cast(pl.Int32),
                # closed loop: when the client sent it, after the turn before it ended
                "arrival_us": pl.Series(cols["sent_us"], dtype=pl.Int64) if "sent_us" in cols else trace["arrival_us"],
                "prompt_tokens": trace["prompt_tokens"],
                "output_tokens": trace["output_tokens"],
                "cached_tokens": pl.Series(cols["cached_tokens"]).cast(pl.Int32),
                "first_scheduled_us": _when(cols["first_scheduled_us"]),
                "first_token_us": _when(cols["first_token_us"]),
                "finished_us": _when(cols["finished_us"]),
                "preemptions": pl.Series(cols["preemptions"]).cast(pl.Int32),
                "status": pl.Series(STATUS_NAMES, dtype=pl.String).gather(status),
                "reject_reason": pl.Series(REJECT_NAMES, dtype=pl.String).gather(cols["reject"].astype(np.int64))
                .replace("", None),
                "prefill_pool": self.pool_names.gather(prefill_pool.replace(-1, None)),
                "prefill_replica": _when(prefill).cast(pl.Int32),
                "prefill_end_us": _when(cols["prefill_end_us"]),
                "kv_transfer_start_us": _when(cols["kv_transfer_start_us"]),
                "kv_transfer_end_us": _when(cols["kv_transfer_end_us"]),
            }
        )
        held = None
        if self.windowed:
            held = window_delay_us(trace["output_tokens"].to_numpy(), cols["first_token_us"], cols["finished_us"],
                                   cols["replica"], self.windows[pools], self.window_step_us)
        return self._derived(df, trace, pools, "sent_us" in cols, held)

    def _derived(self, df: pl.DataFrame, trace: pl.DataFrame, pools: np.ndarray, sent: bool,
                 held: np.ndarray | None) -> pl.DataFrame:
        # The KV transfer's whole time: the engines' transfer_us before a layerwise transfer's overlap
        # with the prefill (replay/engine/transfer.py), so kv_transfer_end_us - kv_transfer_start_us is only
        # the part that outlasted the prefill
        pd = self.pd
        if pd:
            whole = np.ceil(trace["prompt_tokens"].to_numpy() * pd["pd_us_per_token"]).astype(np.int64) + pd["pd_base_us"]
            df = df.with_columns(kv_transfer_us=pl.when(pl.col("kv_transfer_end_us").is_not_null()).then(pl.Series(whole)))
        else:
            df = df.with_columns(kv_transfer_us=pl.lit(None, pl.Int64))
        # Tokens reach the client token_return_us after their step (replay/model/serving.py): the request's
        # first_token_us and finished_us are when its client sees them.
        lag = pl.Series(token_return_us(pools, self.servings))
        df = df.with_columns(first_token_us=pl.col("first_token_us") + lag, finished_us=pl.col("finished_us") + lag)
        if held is not None:  # a decode window's end, past the last token's step
            df = df.with_columns(finished_us=pl.col("finished_us") + pl.Series(held))
        df = df.with_columns(
            ttft_us=pl.col("first_token_us") - pl.col("arrival_us"),
            tpot_us=pl.when(pl.col("output_tokens") > 1).then(
                (pl.col("finished_us") - pl.col("first_token_us")) / (pl.col("output_tokens") - 1)
            ),
            e2e_us=pl.col("finished_us") - pl.col("arrival_us"),
        )
        # Each request against its class's targets (slo.by_workload), else the fleet's.
        met = (
            (pl.col("status") == "finished")
            & (pl.col("ttft_us") <= self.targets["ttft_ms"])
            & (pl.col("tpot_us").is_null() | (pl.col("tpot_us") <= self.targets["tpot_ms"]))
        )
        df = df.with_columns(slo_met=met.fill_null(False)).select(REQUEST_COLUMNS)
        # A closed-loop run keeps the trace's own arrival too, last (only there: other runs keep their shape).
        return df.with_columns(recorded_arrival_us=trace["arrival_us"]) if sent else df

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
