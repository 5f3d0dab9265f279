"""Drill-down as pure functions: the worst requests around the cursor and one request's life.
Times are int64 microseconds.

Each reads only what it shows (RequestTable.query): the worst requests are a top-k over the
columns that choose them (the scope, the window, the sort column), then the other columns of
those rows alone; a request's life is its row, by its id. Neither reads a column whole."""

from __future__ import annotations

import polars as pl
from rich.text import Text

from tui.data import FLEET, RunData
from tui.timefmt import fmt_duration_ms, fmt_time

LIMIT = 200
# column label -> (expression, worst first = descending)
SORTS = {
    "TTFT": (pl.col("ttft_us"), True),
    "queue": (pl.col("queue_us"), True),
    "preempt": (pl.col("preemptions"), True),
    "E2E": (pl.col("e2e_us"), True),
    "arrival": (pl.col("arrival_us"), False),
    "pool": (pl.col("pool"), False),
    "replica": (pl.col("replica"), False),
    "prompt": (pl.col("prompt_tokens"), True),
}
SORT_ORDER = tuple(SORTS)
# prefill/decode runs also sort by where a request prefilled (locals last) and by its KV transfer
PD_SORTS = {
    "prefill": (pl.struct("prefill_pool", "prefill_replica"), False),
    "KV xfer": (pl.col("kv_transfer_end_us") - pl.col("kv_transfer_start_us"), True),
}
COLUMNS = ("id", "pool", "replica", "workload", "arrival", "TTFT", "queue", "preempt", "E2E", "prompt", "output",
           "status")
PD_COLUMNS = ("id", "prefill", "pool", "replica", "workload", "arrival", "TTFT", "queue", "KV xfer", "preempt",
              "E2E", "prompt", "output", "status")


def disaggregated(run: RunData) -> bool:
    """A prefill/decode run: some request was prefilled on another pool's replica."""
    return "prefill_replica" in run.table.columns and _any(run, pl.col("prefill_replica").is_not_null())


# a run from a request log that recorded each request's TTFT and E2E (traces/records.py;
# requests.parquet's observed_ttft_us / observed_e2e_us, replay/outputs/observed_requests.py)
OBSERVED = {"obs TTFT": "observed_ttft_us", "obs E2E": "observed_e2e_us"}


def has_observed(run: RunData) -> bool:
    return (all(c in run.table.columns for c in OBSERVED.values())
            and _any(run, pl.col("observed_ttft_us").is_not_null()))


def _any(run: RunData, expr: pl.Expr) -> bool:
    """Whether some request holds `expr` (asked of the file once, a column a batch at a time)."""
    key = ("any", str(expr), run.table.height)
    if key not in run._memo:
        run._memo[key] = bool(run.table.query(lambda req: req.select(expr.any())).item())
    return run._memo[key]


def columns_of(run: RunData) -> tuple[str, ...]:
    """The table's columns: a P/D run's add where each request was prefilled and its KV transfer;
    a run from a request log with observed latencies, each beside the replayed one."""
    columns = PD_COLUMNS if disaggregated(run) else COLUMNS
    if has_observed(run):
        columns = tuple(c for name in columns for c in ((name, "obs " + name) if "obs " + name in OBSERVED else (name,)))
    return columns


def sorts_of(run: RunData) -> tuple[str, ...]:
    """The columns the table sorts by, in the order `s` cycles through them."""
    return SORT_ORDER + tuple(PD_SORTS) if disaggregated(run) else SORT_ORDER


def worst_requests(run: RunData, cursor_us: int, scope: str, sort: str = "TTFT", reverse: bool = False,
                   limit: int = LIMIT, offset: int = 0) -> pl.DataFrame:
    """Requests that were in the system during the metrics window ending at the cursor (arrived by
    then, not ended before it began), in the scope, worst first by `sort` (nulls last, then by
    id): the `limit` from the `offset`-th on, every column, with queue_us and e2e_us."""
    expr, descending = SORTS[sort] if sort in SORTS else PD_SORTS[sort]
    order = dict(by=[expr, pl.col("request_id")], descending=[descending != reverse, False], nulls_last=True)
    chosen = _in_view(run, cursor_us, scope)
    # the rows: a top-k over the few columns that choose them (the filter's row groups skipped
    # by their statistics), then only those rows' other columns, by their ids
    ids = run.table.query(lambda req: _with_spans(req.filter(chosen)).sort(**order).slice(offset, limit)
                          .select("request_id"))["request_id"]
    if not len(ids):
        return _with_spans(run.table.query(lambda req: req.head(0)).lazy()).collect()
    lo, hi = ids.min(), ids.max()
    rows = run.table.query(lambda req: req.filter(pl.col("request_id").is_between(lo, hi)
                                                  & pl.col("request_id").is_in(ids.implode())))
    return _with_spans(rows.lazy()).sort(**order).collect()


def _in_view(run: RunData, cursor_us: int, scope: str) -> pl.Expr:
    """The requests of the table's view: in the scope, in the system during the window ending at the cursor."""
    if scope.startswith("workload:"):  # the per-workload view (tui/views.py): that label's requests
        mine = pl.col("workload") == scope[len("workload:"):]
    elif scope != FLEET:  # a pool's requests: those it decoded, and those it prefilled for another
        mine = pl.col("pool") == scope
        if "prefill_pool" in run.table.columns:
            mine = mine | (pl.col("prefill_pool") == scope).fill_null(False)
    else:
        mine = pl.lit(True)
    start = cursor_us - run.window_us
    never = pl.lit(2**62, pl.Int64)
    rejected = pl.col("status") == "rejected"
    ended = pl.when(rejected).then(pl.col("arrival_us")).otherwise(pl.coalesce("finished_us", never))
    # (ended > start implies the term before it, which a row group's statistics can rule out)
    maybe = (pl.col("finished_us") > start) | pl.col("finished_us").is_null() | rejected
    return mine & (pl.col("arrival_us") <= cursor_us) & maybe & (ended > start)


def _with_spans(req: pl.LazyFrame) -> pl.LazyFrame:
    return req.with_columns(queue_us=pl.col("first_scheduled_us") - pl.col("arrival_us"),
                            e2e_us=pl.col("finished_us") - pl.col("arrival_us"))


def request_rows(frame: pl.DataFrame, columns: tuple[str, ...] = COLUMNS) -> list[tuple]:
    """The table's cells, in `columns` order (COLUMNS or PD_COLUMNS)."""
    ms = lambda v: fmt_duration_ms(None if v is None else v / 1000)  # noqa: E731
    rows = []
    for r in frame.iter_rows(named=True):
        cells = {
            "id": str(r["request_id"]), "pool": r["pool"],
            "replica": "-" if r["replica"] is None else str(r["replica"]), "workload": r["workload"] or "-",
            "arrival": fmt_time(r["arrival_us"]), "TTFT": ms(r["ttft_us"]),
            "queue": ms(r["queue_us"]), "preempt": str(r["preemptions"]), "E2E": ms(r["e2e_us"]),
            "prompt": f"{r['prompt_tokens']:,}", "output": f"{r['output_tokens']:,}",
            "status": r["status"] if r["status"] != "rejected" else f"rejected: {r['reject_reason']}",
        }
        for name, column in OBSERVED.items():
            if name in columns:
                cells[name] = ms(r.get(column))
        if "prefill" in columns:
            local = r.get("prefill_replica") is None
            cells["prefill"] = "local" if local else f"{r['prefill_pool']} r{r['prefill_replica']}"
            shown, whole = kv_transfer(r)
            cells["KV xfer"] = "-" if shown is None else ms(shown) if whole in (None, shown) else \
                f"{ms(shown)} of {ms(whole)}"
        rows.append(tuple(cells[c] for c in columns))
    return rows


def kv_transfer(r: dict) -> tuple[int | None, int | None]:
    """(the part of a request's KV transfer that outlasted its prefill, the transfer's whole time),
    in us. A layerwise transfer overlaps the prefill, so the KV arrives kv_transfer_end_us -
    kv_transfer_start_us after it ended; kv_transfer_us (absent from older runs) is the whole."""
    start, end = r.get("kv_transfer_start_us"), r.get("kv_transfer_end_us")
    if start is None or end is None:
        return None, None
    return end - start, r.get("kv_transfer_us")


def _clock(t_us: int) -> str:
    """M:SS.mmm: a request's life happens within seconds."""
    return f"{fmt_time(t_us)}.{(t_us // 1000) % 1000:03d}"


def _targets(run: RunData, workload: str | None) -> tuple[float, float]:
    slo = run.slo or {}
    own = (slo.get("by_workload") or {}).get(workload) or {}
    return float(own.get("ttft_ms", slo.get("ttft_ms", 2000))), float(own.get("tpot_ms", slo.get("tpot_ms", 100)))


def request_life(run: RunData, request_id: int, width: int = 80) -> Text:
    """Arrival, admission, preemptions, first token, finish (or rejection), each at its time with
    what it cost, then a bar: queue, prefill, decode, preemptions marked x."""
    rows = run.table.query(lambda req: req.filter(pl.col("request_id") == request_id))
    if rows.height == 0:
        return Text(f"request {request_id}: not in {run.name}", "red")
    r = rows.row(0, named=True)
    ttft_target, tpot_target = _targets(run, r["workload"])
    t = Text()
    t.append(f"request {request_id}", "bold")
    t.append(f"  {run.name} · workload {r['workload'] or '-'} · pool {r['pool']} · replica "
             f"{'-' if r['replica'] is None else r['replica']}")
    if r.get("prefill_replica") is not None:
        t.append(f" · prefilled on pool {r['prefill_pool']} replica {r['prefill_replica']}")
    t.append("\n")
    t.append(f"prompt {r['prompt_tokens']:,} tokens ({r['cached_tokens']:,} from the prefix cache) · output "
             f"{r['output_tokens']:,} tokens\n\n")
    arrival = r["arrival_us"]

    def step(label: str, at: int | None, note: str, style: str = "") -> None:
        t.append(f"  {label:<13}", "bold " + style)
        t.append(f"{_clock(at) if at is not None else '-':>12}  ", style)
        t.append(note + "\n", style)

    step("arrival", arrival, "")
    if r["status"] == "rejected":
        step("rejected", arrival, f"reason: {r['reject_reason']}", "red")
    remote = r.get("prefill_replica") is not None
    if r["first_scheduled_us"] is not None:
        where = f" (prefill: pool {r['prefill_pool']} replica {r['prefill_replica']})" if remote else ""
        step("admitted", r["first_scheduled_us"],
             f"after {fmt_duration_ms((r['first_scheduled_us'] - arrival) / 1000)} in the queue{where}")
    if remote and r.get("prefill_end_us") is not None:
        step("prefilled", r["prefill_end_us"], f"on pool {r['prefill_pool']} replica {r['prefill_replica']}",
             "cyan")
    xfer_start, xfer_end = r.get("kv_transfer_start_us"), r.get("kv_transfer_end_us")
    if xfer_start is not None:
        step("KV transfer", xfer_start, f"to pool {r['pool']} replica {'-' if r['replica'] is None else r['replica']}"
             + (f", waited {fmt_duration_ms((xfer_start - r['prefill_end_us']) / 1000)} for room"
                if r.get("prefill_end_us") is not None and xfer_start > r["prefill_end_us"] else ""), "blue")
    if xfer_end is not None:
        step("KV arrived", xfer_end, _transfer_note(r), "blue")
    preempts = run.request_events(request_id).filter(pl.col("kind").str.starts_with("preempt")).sort("t_us")
    for ev in preempts.iter_rows(named=True):
        step("preempted", ev["t_us"], ev["detail"] or ev["kind"], "magenta")
    if r["first_token_us"] is not None:
        ok = r["ttft_us"] <= ttft_target * 1000
        step("first token", r["first_token_us"], f"TTFT {fmt_duration_ms(r['ttft_us'] / 1000)} "
             f"(target {fmt_duration_ms(ttft_target)}: {'met' if ok else 'missed'})", "" if ok else "red")
    if r["finished_us"] is not None:
        tpot = r.get("tpot_us")
        note = f"E2E {fmt_duration_ms((r['finished_us'] - arrival) / 1000)}"
        if tpot is not None:
            ok = tpot <= tpot_target * 1000
            note += f" · TPOT {fmt_duration_ms(tpot / 1000)} (target {fmt_duration_ms(tpot_target)}: " \
                    f"{'met' if ok else 'missed'})"
        step("finished", r["finished_us"], note, "" if tpot is None or tpot <= tpot_target * 1000 else "red")
    elif r["status"] == "unfinished":
        step("unfinished", None, "still in flight when the replay ended", "yellow")
    _observed_lines(t, r)
    t.append(f"\n  status {r['status']} · SLO {'met' if r['slo_met'] else 'missed'}\n\n",
             "bold green" if r["slo_met"] else "bold red")
    t.append_text(_life_bar(r, preempts["t_us"].to_list(), max(width - 4, 10)))
    return t


def _observed_lines(t: Text, r: dict) -> None:
    """What the request log recorded of this request beside what the replay made of it."""
    replayed = {"TTFT": r.get("ttft_us"), "E2E": None if r["finished_us"] is None else r["finished_us"] - r["arrival_us"]}
    shown = False
    for name, column in OBSERVED.items():
        observed = r.get(column)
        if observed is None:
            continue
        label = name.removeprefix("obs ")
        mine = replayed[label]
        t.append(f"\n  {'observed ' + label:<13}", "bold yellow")
        note = f"{fmt_duration_ms(observed / 1000)} in the request log"
        if mine is not None:
            note += f", replayed {fmt_duration_ms(mine / 1000)}"
            if observed > 0:
                note += f" ({(mine - observed) / observed:+.0%})"
        t.append(f"{'':>12}  {note}", "yellow")
        shown = True
    if shown:
        t.append("\n")


def _transfer_note(r: dict) -> str:
    shown, whole = kv_transfer(r)
    if shown is None:
        return ""
    if whole is None or whole == shown:
        return f"transfer took {fmt_duration_ms(shown / 1000)}"
    return (f"transfer took {fmt_duration_ms(whole / 1000)}, {fmt_duration_ms(shown / 1000)} of it after the prefill "
            "(the rest hidden behind it, layer by layer)")


def _life_bar(r: dict, preempt_us: list[int], width: int) -> Text:
    start = r["arrival_us"]
    marks = [r["first_scheduled_us"], r["first_token_us"], r["finished_us"], r.get("kv_transfer_end_us")]
    end = max([m for m in marks if m is not None] + [start + 1])
    col = lambda t_us: min(int((t_us - start) / (end - start) * (width - 1)), width - 1)  # noqa: E731
    cells = [(" ", "")] * width
    spans = [("░", "yellow", start, r["first_scheduled_us"]),
             ("▒", "cyan", r["first_scheduled_us"], r["first_token_us"]),
             ("█", "green", r["first_token_us"], r["finished_us"])]
    remote = r.get("prefill_replica") is not None
    if remote:  # prefill on another replica, then the KV's wait and transfer, then the decode replica
        spans[1] = ("▒", "cyan", r["first_scheduled_us"], r.get("prefill_end_us"))
        spans.insert(2, ("≈", "blue", r.get("prefill_end_us"), r.get("kv_transfer_end_us")))
        spans.insert(3, ("░", "yellow", r.get("kv_transfer_end_us"), r["first_token_us"]))
    for ch, style, a, b in spans:
        if a is not None and b is not None:
            for i in range(col(a), col(b) + 1):
                cells[i] = (ch, style)
    for p in preempt_us:
        cells[col(p)] = ("x", "bold magenta")
    bar = Text("  ")
    for ch, style in cells:
        bar.append(ch, style)
    bar.append("\n  ")
    legend = [("░", "yellow", "queue"), ("▒", "cyan", "prefill"), ("█", "green", "decode"),
              ("x", "bold magenta", "preempted")]
    if remote:
        legend.insert(2, ("≈", "blue", "KV wait + transfer"))
    for ch, style, label in legend:
        bar.append(ch, style)
        bar.append(f" {label}  ")
    return bar
