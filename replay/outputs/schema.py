"""The run directory's contract (README "Run outputs"), declared once: its files, each Parquet
file's columns in the order they are written with their dtypes, the event kinds, the statuses and
the version of the whole. The writers (replay.fleet.metrics, replay.fleet.live, replay.outputs.write) build their
frames from it and the dashboard (tui.validate, tui.data) checks a run against it, so the two
cannot drift apart. Stdlib and polars only: the dashboard imports it without loading an engine.

Columns are only ever appended (README "Migration notes"): `appended` marks those that a run
written before them lacks, so a reader treats them as optional. SCHEMA_VERSION changes only with
a change that is not an append (a column renamed, retyped or dropped); a reader refuses a run
whose version it does not know rather than misread it.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

SCHEMA_VERSION = 1
# Parquet key-value metadata of every Parquet file a run holds; a file without it is version 1
# (written before the key existed).
SCHEMA_KEY = "llm_replay.schema"
SCHEMA_METADATA = {SCHEMA_KEY: str(SCHEMA_VERSION)}

# A finished run directory.
REQUESTS_FILE, TICKS_FILE, EVENTS_FILE = "requests.parquet", "ticks.parquet", "events.parquet"
SUMMARY_FILE, CONFIG_FILE, TIMING_FILE = "summary.json", "config.yaml", "timing.json"
RUN_FILES = (REQUESTS_FILE, TICKS_FILE, EVENTS_FILE, SUMMARY_FILE, CONFIG_FILE)  # byte-identical on a rerun
# A run being written (replay/fleet/live.py): DIR/live/status.json, DIR/live/chunk-NNNNNN/<name>.parquet.
LIVE_DIR = "live"
STATUS_FILE = "status.json"
CHUNK_FILES = ("ticks", "events", "requests", "firsts")


def chunk_name(seq: int) -> str:
    """live/'s folder of flush `seq`."""
    return f"chunk-{seq:06d}"


def inflight_name(seq: int) -> str:
    """live/'s file of the requests in flight at flush `seq`."""
    return f"inflight-{seq:06d}.parquet"


STATUSES = ("finished", "rejected", "unfinished")  # requests.parquet's status
SATURATION_CLASSES = ("stable", "backlogged", "overloaded")  # summary.json's pools.<name>.saturation.class
# events.parquet's kinds: the control plane's (replay/fleet/control.py), the engines' (replay/engine/common.py
# EVENT_NAMES), and those --detailed-events adds, one per step of a request's life.
CONTROL_EVENT_KINDS = ("replica_active", "replica_starting", "replica_draining", "replica_gone", "scale_up",
                       "scale_down")
REQUEST_EVENT_KINDS = ("arrive", "schedule", "first_token", "finish")
EVENT_KINDS = (*CONTROL_EVENT_KINDS, "preempt", "preempt_swap", "reject", *REQUEST_EVENT_KINDS)


@dataclass(frozen=True)
class Column:
    name: str
    dtype: pl.DataType
    appended: bool = False  # added after the first contract: older runs lack it


@dataclass(frozen=True)
class Table:
    """One Parquet file: its columns in the order written, and what holds for its rows."""
    file: str
    columns: tuple[Column, ...]
    not_null: tuple[str, ...] = ()
    unique: tuple[str, ...] = ()  # one row per value of these columns together

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def dtypes(self) -> dict[str, pl.DataType]:
        return {c.name: c.dtype for c in self.columns}


def _cols(dtype: pl.DataType, *names: str, appended: bool = False) -> tuple[Column, ...]:
    return tuple(Column(n, dtype, appended) for n in names)


I64, I32, F64, STR, BOOL = pl.Int64, pl.Int32, pl.Float64, pl.String, pl.Boolean

REQUESTS = Table(REQUESTS_FILE, (
    *_cols(I64, "request_id"), *_cols(STR, "workload", "pool"), *_cols(I32, "replica"), *_cols(I64, "arrival_us"),
    *_cols(I32, "prompt_tokens", "output_tokens", "cached_tokens"),
    *_cols(I64, "first_scheduled_us", "first_token_us", "finished_us", "ttft_us"), *_cols(F64, "tpot_us"),
    *_cols(I64, "e2e_us"), *_cols(I32, "preemptions"), *_cols(STR, "status", "reject_reason"),
    *_cols(BOOL, "slo_met"),
    # prefill/decode disaggregation: null for a request prefilled where it decoded
    *_cols(STR, "prefill_pool", appended=True), *_cols(I32, "prefill_replica", appended=True),
    *_cols(I64, "prefill_end_us", "kv_transfer_start_us", "kv_transfer_end_us", "kv_transfer_us", appended=True),
), not_null=("request_id", "pool", "arrival_us", "prompt_tokens", "output_tokens", "status"), unique=("request_id",))

TICKS = Table(TICKS_FILE, (
    *_cols(I64, "t_us"), *_cols(STR, "pool"), *_cols(I32, "replicas_active", "replicas_loading", "gpus", "waiting",
                                                     "running"),
    *_cols(F64, "kv_usage"), *_cols(I64, "kv_used_blocks", "kv_total_blocks"),
    *_cols(I32, "arrivals", "finished", "rejected", "preemptions"),
    *_cols(F64, "prompt_tokens_per_s", "output_tokens_per_s", "gpu_busy", "cost_usd", "cost_per_mtok_out_usd",
           "ttft_p50_ms", "ttft_p99_ms", "slo_attainment"),
    *_cols(I32, "replicas_draining", "held", appended=True),
), not_null=("t_us", "pool"), unique=("t_us", "pool"))

EVENTS = Table(EVENTS_FILE, (
    *_cols(I64, "t_us"), *_cols(STR, "pool"), *_cols(I32, "replica"), *_cols(STR, "kind", "detail"),
    *_cols(I64, "request_id", appended=True),
), not_null=("t_us", "kind"))

# A live chunk's first tokens since the previous flush (replay/fleet/live.py; no finished run has it).
FIRSTS = Table("firsts.parquet", (
    *_cols(I64, "request_id"), *_cols(STR, "pool"), *_cols(I64, "first_token_us", "ttft_us"),
), not_null=("request_id", "first_token_us", "ttft_us"))

TABLES = (REQUESTS, TICKS, EVENTS)  # a finished run's Parquet files
