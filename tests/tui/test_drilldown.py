"""Drill-down: the worst requests around the cursor, sortable, and one request's life."""

from __future__ import annotations

import polars as pl

from tests.tui.conftest import AFTER, BEFORE, screen_text
from tests.tui.test_keys import drive
from tui.app import make_app
from tui.data import load_run
from tui.requests import LIMIT, PD_COLUMNS, request_life, request_rows, worst_requests
from tui.timefmt import fmt_duration_ms
from tui.screens import RequestLifeScreen, RequestsScreen

S = 1_000_000


def test_worst_requests_are_those_of_the_window_worst_first():
    run = load_run(BEFORE)
    cursor = 240 * S
    got = worst_requests(run, cursor, "fleet")
    assert 0 < got.height <= LIMIT
    assert (got["arrival_us"] <= cursor).all()
    ttft = got["ttft_us"].drop_nulls().to_list()
    assert ttft == sorted(ttft, reverse=True)
    # nothing worse was left out: the worst TTFT of requests in the window is the first row
    window = run.requests.filter((pl.col("arrival_us") <= cursor)
                                 & (pl.col("finished_us").fill_null(2**62) > cursor - run.window_us))
    assert got["ttft_us"][0] == window["ttft_us"].max()
    by_queue = worst_requests(run, cursor, "fleet", sort="queue")
    queue = (by_queue["first_scheduled_us"] - by_queue["arrival_us"]).drop_nulls().to_list()
    assert queue == sorted(queue, reverse=True)


def test_a_pool_scope_keeps_its_requests():
    run = load_run(AFTER)
    got = worst_requests(run, 300 * S, "docs")
    assert got.height and set(got["pool"]) == {"docs"}


def test_request_life_tells_each_step():
    run = load_run(AFTER)
    preempted = run.events.filter(pl.col("kind") == "preempt")["request_id"][0]
    text = request_life(run, preempted).plain
    for step in ("arrival", "admitted", "preempted", "first token", "TTFT", "status"):
        assert step in text
    rejected = run.requests.filter(pl.col("status") == "rejected")["request_id"][0]
    assert "rejected" in request_life(run, rejected).plain
    assert "not in" in request_life(run, -5).plain


def test_drill_down_table_sort_and_life():
    app = make_app(BEFORE, at="4:00")

    async def script(pilot):
        await pilot.press("d")
        screen = app.screen
        assert isinstance(screen, RequestsScreen) and screen.sort == "TTFT"
        first = screen.ids[0]
        assert "worst by TTFT" in screen_text(app)
        await pilot.press("s")
        assert screen.sort == "queue" and "worst by queue" in screen_text(app)
        await pilot.press("r")
        assert screen.reverse and "best by queue" in screen_text(app)
        await pilot.press("r", "s", "s", "s", "s", "s", "s", "s")
        assert screen.sort == "TTFT" and screen.ids[0] == first
        await pilot.press("down", "enter")
        assert isinstance(app.screen, RequestLifeScreen) and app.screen.request_id == screen.ids[1]
        assert f"request {screen.ids[1]}" in screen_text(app)
        await pilot.press("escape")
        assert app.screen is screen
        await pilot.press("c")  # not comparing: stays on the one run
        assert screen.run_index == 0
        await pilot.press("escape")
        assert not isinstance(app.screen, RequestsScreen)

    drive(app, script, size=(120, 40))


def test_click_on_a_header_sorts_by_it():
    app = make_app(BEFORE, at="4:00")

    async def script(pilot):
        await pilot.press("d")
        screen = app.screen
        table = screen.query_one("DataTable")
        # the 'preempt' header: clicking it sorts by preemptions, again reverses
        x = sum(col.get_render_width(table) for col in list(table.columns.values())[:7]) + 2
        await pilot.click("DataTable", offset=(x, 0))
        assert screen.sort == "preempt" and not screen.reverse
        await pilot.click("DataTable", offset=(x, 0))
        assert screen.sort == "preempt" and screen.reverse

    drive(app, script, size=(140, 40))


def test_a_prefill_decode_run_opens_and_its_drill_down_shows_where_requests_prefilled(pd_run):
    from tests.tui.conftest import pd_config

    run = load_run(pd_run)
    assert run.pools == ["prefill", "decode"] and run.scopes == ["fleet", "prefill", "decode"]
    assert run.series["prefill"]["prompt_tokens_per_s"].sum() > 0  # the prefill pool's tick rows
    cursor = int(run.t_us[len(run.t_us) // 2])
    # the prefill pool's requests are those it prefilled (all of them decode elsewhere)
    prefilled = worst_requests(run, cursor, "prefill")
    assert prefilled.height and set(prefilled["pool"]) == {"decode"} and set(prefilled["prefill_pool"]) == {"prefill"}
    remote = run.requests.filter(pl.col("prefill_replica").is_not_null() & pl.col("finished_us").is_not_null()).row(
        0, named=True)
    text = request_life(run, remote["request_id"]).plain
    assert f"prefilled on pool prefill replica {remote['prefill_replica']}" in text
    for step in ("admitted", "prefilled", "KV transfer", "KV arrived", "first token", "finished", "≈ KV wait"):
        assert step in text, step
    # the KV transfer: its whole time, and the part the prefill did not hide (layerwise)
    shown = remote["kv_transfer_end_us"] - remote["kv_transfer_start_us"]
    assert 0 < shown < remote["kv_transfer_us"]
    assert (f"transfer took {fmt_duration_ms(remote['kv_transfer_us'] / 1000)}, {fmt_duration_ms(shown / 1000)} "
            "of it after the prefill") in text
    around = worst_requests(run, remote["arrival_us"], "prefill", limit=10**6)
    (row,) = request_rows(around.filter(pl.col("request_id") == remote["request_id"]), PD_COLUMNS)
    assert row[PD_COLUMNS.index("KV xfer")] == (f"{fmt_duration_ms(shown / 1000)} of "
                                                f"{fmt_duration_ms(remote['kv_transfer_us'] / 1000)}")
    assert pd_config().split.policy == "prefill-decode"
    app = make_app(pd_run, at=f"{cursor // S}")

    async def script(pilot):
        await pilot.press("p", "d")
        screen = app.screen
        assert isinstance(screen, RequestsScreen)
        assert "prefill r0" in screen_text(app) and "KV xfer" in screen_text(app)
        await pilot.press("enter")
        assert isinstance(app.screen, RequestLifeScreen)
        assert "KV transfer" in screen_text(app)

    drive(app, script, size=(160, 40))


def test_a_run_without_the_prefill_columns_still_shows_a_life(tmp_path):
    """Runs written before P/D lack its request columns: the drill-down does without them."""
    import shutil

    old = tmp_path / "old"
    shutil.copytree(BEFORE, old)
    req = pl.read_parquet(old / "requests.parquet")
    req.drop([c for c in req.columns if c.startswith(("prefill_", "kv_transfer"))]).write_parquet(
        old / "requests.parquet")
    run = load_run(old)
    rid = run.requests["request_id"][0]
    assert "first token" in request_life(run, rid).plain and "KV" not in request_life(run, rid).plain
    assert worst_requests(run, 240 * S, "fleet").height


def test_a_prefill_decode_run_sorts_by_its_kv_transfer_and_prefill_replica(pd_run, one_pool_run):
    run = load_run(pd_run)
    cursor = int(run.t_us[len(run.t_us) // 2])
    by_xfer = worst_requests(run, cursor, "fleet", sort="KV xfer")
    xfer = (by_xfer["kv_transfer_end_us"] - by_xfer["kv_transfer_start_us"]).drop_nulls().to_list()
    assert xfer and xfer == sorted(xfer, reverse=True)  # longest transfer first, locals (none) last
    by_prefill = worst_requests(run, cursor, "fleet", sort="prefill")
    replicas = by_prefill["prefill_replica"].drop_nulls().to_list()
    assert replicas == sorted(replicas)
    app = make_app(pd_run, one_pool_run, at=f"{cursor // S}")

    async def script(pilot):
        await pilot.press("d")
        screen = app.screen
        table = screen.query_one("DataTable")
        x = sum(col.get_render_width(table) for col in list(table.columns.values())[:8]) + 2  # 'KV xfer'
        await pilot.click("DataTable", offset=(x, 0))
        assert screen.sort == "KV xfer"
        await pilot.press("c")  # the other run has no transfers: back to TTFT, not an error
        assert screen.run_index == 1 and screen.sort == "TTFT" and screen.ids
        await pilot.press(*["s"] * 8)  # cycles through that run's eight sorts back to TTFT
        assert screen.sort == "TTFT"

    drive(app, script, size=(180, 40))


def test_compare_a_prefill_decode_run_with_one_without(pd_run, one_pool_run):
    """`c` switches the table to the other run, with that run's columns."""
    app = make_app(pd_run, one_pool_run, at="0:20")

    async def script(pilot):
        await pilot.press("d")
        screen = app.screen
        columns = lambda: [str(c.value) for c in screen.query_one("DataTable").columns]  # noqa: E731
        assert "prefill" in columns() and "KV xfer" in columns()
        await pilot.press("c")
        assert screen.run_index == 1 and "prefill" not in columns() and screen.ids
        await pilot.press("c")
        assert screen.run_index == 0 and "KV xfer" in columns()

    drive(app, script, size=(160, 40))


def test_the_table_pages_through_every_request_of_the_window():
    run = load_run(BEFORE)
    whole = worst_requests(run, 240 * S, "fleet", limit=10**6)
    assert whole.height > 2 * LIMIT
    pages = [worst_requests(run, 240 * S, "fleet", offset=k) for k in range(0, whole.height + LIMIT, LIMIT)]
    assert pl.concat(pages).equals(whole) and pages[-1].height == 0
    ids = whole["request_id"].to_list()
    app = make_app(BEFORE, at="4:00")

    async def script(pilot):
        await pilot.press("d")
        screen = app.screen
        table = screen.query_one("DataTable")
        assert screen.ids == ids[:LIMIT] and table.row_count == LIMIT
        await pilot.press("down")  # not yet the last row: nothing more read
        assert screen.ids == ids[:LIMIT]
        await pilot.press("ctrl+end")  # the last row: the next LIMIT below it
        await pilot.pause()
        assert screen.ids == ids[:2 * LIMIT] and table.row_count == 2 * LIMIT
        assert f"{2 * LIMIT} worst by TTFT" in screen_text(app)
        await pilot.press("enter")  # a row of the next page opens its own request
        assert isinstance(app.screen, RequestLifeScreen) and app.screen.request_id == ids[LIMIT - 1]
        await pilot.press("escape")
        await pilot.press(*["ctrl+end"] * 6)  # up to the window's last request
        assert screen.ids == ids and table.row_count == len(ids) and not screen.more
        assert f"{len(ids)} worst by TTFT" in screen_text(app)
        await pilot.press("s")  # another order starts again from its worst
        assert "worst by queue" in screen_text(app) and len(screen.ids) == LIMIT == table.row_count

    drive(app, script, size=(140, 40))
