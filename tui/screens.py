"""Screens over the dashboard: help, go-to-time, the worst requests around the cursor, and the
life of one request."""

from __future__ import annotations

import polars as pl
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Input, Static

from common.errors import UserError
from tui.requests import LIMIT, columns_of, request_life, request_rows, sorts_of, worst_requests
from tui.timefmt import fmt_time, parse_time

MOUSE_HELP = (
    ("click", "timeline, chart: go there"),
    ("wheel", "timeline: seek a minute"),
    ("wheel", "metrics: scroll the rows"),
    ("click col", "requests: sort by it"),
)
# The help's description column at 80 columns: longer ones drop their "(...)" aside
HELP_DESC_W = 26


class HelpScreen(ModalScreen):
    """Every key of the dashboard and its screens, from their bindings (so it cannot go stale), in
    two columns with a key and its opposite on one row (← →), so it fits an 80x24 terminal whole."""

    BINDINGS = [Binding("escape,question_mark,q", "app.pop_screen", "close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 100%; max-width: 130; height: auto; max-height: 100%;
                                  border: round $accent; background: $surface; padding: 0; }
    """

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(help_table())


def help_table() -> Table:
    from tui.app import Dashboard

    rows: list[tuple] = []
    sections = (("dashboard", Dashboard.BINDINGS), ("requests (d)", RequestsScreen.BINDINGS),
                ("request life", RequestLifeScreen.BINDINGS), ("go to time (g)", GotoScreen.BINDINGS),
                ("replicas (r), observed (o)", merged(ReplicasScreen.BINDINGS, ObservedScreen.BINDINGS)))
    for title, bindings in sections:
        rows.append(("", Text(title, "bold underline")))  # in the wide column: the key column stays narrow
        rows += paired(bindings)
    rows.append(("", Text("mouse, and notes", "bold underline")))  # one title: the help fits 80x24
    rows += MOUSE_HELP
    rows += NOTES
    half = (len(rows) + 1) // 2
    table = Table(box=None, show_header=False, padding=(0, 1, 0, 0), expand=True)
    for _ in range(2):
        table.add_column(style="bold cyan", no_wrap=True)
        table.add_column(ratio=1)
    for left, right in zip(rows[:half], [*rows[half:], ("", "")]):
        table.add_row(*left, *right)
    return table


NOTES = (
    ("GPU-Util", "reads ~100% at any load"),
    ("SLO breach", "window SLO met under 99%"),
    ("warm-up", "b skips it: tui --warmup S"),
)


def merged(*screens) -> list[Binding]:
    """The bindings of screens shown as one help section: one row for a description they share
    ("esc r o  back to the dashboard"), each key once."""
    out: list[Binding] = []
    for bindings in screens:
        for b in bindings:
            same = next((i for i, o in enumerate(out) if o.description == b.description), None)
            if same is None:
                out.append(b)
                continue
            keys = [k for k in out[same].key.split(",")]
            keys += [k for k in b.key.split(",") if k not in keys]
            out[same] = Binding(",".join(keys), out[same].action, b.description)
    return out


def paired(bindings) -> list[tuple[str, str]]:
    """(keys, what) per binding; a binding whose action is the previous one's with the opposite
    argument (step(1) / step(-1)) joins its row: "→ ←  next tick / previous"."""
    out: list[tuple[str, str]] = []
    prev = None
    for b in bindings:
        name, _, arg = b.action.partition("(")
        if prev is not None and prev[0] == name and arg == "-" + prev[1]:
            keys, what = out[-1]
            out[-1] = (f"{keys} {key_names(b.key).removeprefix('shift+')}",
                       f"{what.split(' (')[0]} / {b.description.split(' (')[0]}")
            prev = None
            continue
        what = b.description if len(b.description) <= HELP_DESC_W else b.description.split(" (")[0]
        out.append((key_names(b.key), what))
        prev = (name, arg)
    return out


def key_names(keys: str) -> str:
    pretty = {"question_mark": "?", "space": "space", "plus": "+", "minus": "-", "equals_sign": "=",
              "shift+left": "shift+←", "shift+right": "shift+→", "pagedown": "pgdn", "pageup": "pgup", "escape": "esc", "left": "←", "right": "→", "up": "↑",
              "down": "↓", "N": "N", "P": "P"}
    return " ".join(pretty.get(k, k) for k in keys.split(","))


class ReplicasScreen(Screen):
    """A pool's replicas side by side (tui/views.py); the dashboard's keys (seek, p) still work."""

    BINDINGS = [Binding("escape,r", "app.pop_screen", "back to the dashboard")]
    DEFAULT_CSS = "ReplicasScreen #replicas { height: 1fr; }"

    def compose(self) -> ComposeResult:
        from tui.views import replica_lines
        from tui.widgets import Panel

        yield Panel(replica_lines, id="replicas")


class GotoScreen(ModalScreen):
    """Type a time (14:05, 1:02:03, 845) and go there."""

    BINDINGS = [Binding("escape", "app.pop_screen", "cancel"), Binding("enter", "noop", "go to the time typed")]
    DEFAULT_CSS = """
    GotoScreen { align: center middle; }
    GotoScreen > Vertical { width: 50; height: auto; border: round $accent; background: $surface; padding: 0 1; }
    """

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("go to time (M:SS, H:MM:SS or seconds from the start)")
            yield Input(placeholder="14:05", id="goto")
            yield Static("", id="goto-error")

    def action_noop(self) -> None:
        """Enter is handled by the Input's submit."""

    def on_input_submitted(self, event: Input.Submitted) -> None:
        try:
            t_us = parse_time(event.value, "time")
        except UserError as exc:
            self.query_one("#goto-error", Static).update(Text(str(exc), "red"))
            return
        self.app.pop_screen()
        self.app.seek_to(t_us)


class RequestsScreen(Screen):
    """The worst requests in the metrics window ending at the cursor, in the scope: LIMIT of them,
    and LIMIT more each time the cursor reaches the last (each page read alone, tui/requests.py)."""

    BINDINGS = [
        Binding("escape,d", "app.pop_screen", "back to the dashboard"),
        Binding("enter", "open", "open the request's life"),
        Binding("s", "next_sort", "sort by the next column"),
        Binding("r", "reverse", "reverse the order"),
        Binding("c", "other_run", "the other run's requests"),
    ]
    DEFAULT_CSS = """
    RequestsScreen #req-title { height: 1; }
    RequestsScreen DataTable { height: 1fr; }
    """

    def __init__(self, run_index: int = 0):
        super().__init__()
        self.run_index = run_index
        self.sort = "TTFT"
        self.reverse = False
        self.more = False  # whether requests follow the rows shown
        self.ids: list[int] = []

    def compose(self) -> ComposeResult:
        yield Static(id="req-title")
        yield DataTable(cursor_type="row", zebra_stripes=True, id="requests")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        self.fill()
        table.focus()

    def fill(self) -> None:
        model = self.app.model
        run = model.runs[self.run_index]
        if self.sort not in sorts_of(run):  # compare mode: the other run has no P/D columns
            self.sort, self.reverse = "TTFT", False
        self.ids = []
        frame = self._page(run)
        table = self.query_one(DataTable)
        columns = columns_of(run)
        if tuple(str(c.value) for c in table.columns) != columns:  # compare mode: the runs may differ
            table.clear(columns=True)
            for name in columns:
                table.add_column(name, key=name)
        table.clear()
        for row in request_rows(frame, columns):
            table.add_row(*row)
        self._title(run)

    def _page(self, run) -> pl.DataFrame:
        """The next LIMIT requests after those shown (their ids now among `ids`)."""
        view = self.app.model.view
        frame = worst_requests(run, view.cursor_us, view.scope, self.sort, self.reverse, LIMIT + 1, len(self.ids))
        self.more = frame.height > LIMIT
        frame = frame.head(LIMIT)
        self.ids += frame["request_id"].to_list()
        return frame

    def _title(self, run) -> None:
        view = self.app.model.view
        order = "best" if self.reverse else "worst"
        self.query_one("#req-title", Static).update(Text.assemble(
            (f" {run.name} ", "bold reverse"),
            f" {view.scope}: {len(self.ids)} {order} by {self.sort}, in the window ending {fmt_time(view.cursor_us)}  ",
            ("enter", "bold"), " life  ", ("s", "bold"), " sort  ", ("r", "bold"), " reverse  ", ("esc", "bold"),
            " back"))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        """At the last row shown: the next LIMIT below it."""
        if self.more and event.cursor_row == len(self.ids) - 1:
            run = self.app.model.runs[self.run_index]
            table = self.query_one(DataTable)
            for row in request_rows(self._page(run), columns_of(run)):
                table.add_row(*row)
            self._title(run)

    def action_open(self) -> None:
        table = self.query_one(DataTable)
        if self.ids and 0 <= table.cursor_row < len(self.ids):
            self.app.push_screen(RequestLifeScreen(self.run_index, self.ids[table.cursor_row]))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open()

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        name = str(event.column_key.value)
        if name in sorts_of(self.app.model.runs[self.run_index]):
            self.reverse = self.reverse if name != self.sort else not self.reverse
            self.sort = name
            self.fill()

    def action_next_sort(self) -> None:
        order = sorts_of(self.app.model.runs[self.run_index])
        self.sort = order[(order.index(self.sort) + 1) % len(order)] if self.sort in order else order[0]
        self.fill()

    def action_reverse(self) -> None:
        self.reverse = not self.reverse
        self.fill()

    def action_other_run(self) -> None:
        if self.app.model.compare:
            self.run_index = 1 - self.run_index
            self.fill()


class RequestLifeScreen(ModalScreen):
    BINDINGS = [Binding("escape,enter,q", "app.pop_screen", "back to the requests")]
    DEFAULT_CSS = """
    RequestLifeScreen { align: center middle; }
    RequestLifeScreen > VerticalScroll { width: 100; max-width: 100%; height: auto; max-height: 100%;
                                         border: round $accent; background: $surface; padding: 0 1; }
    """

    def __init__(self, run_index: int, request_id: int):
        super().__init__()
        self.run_index = run_index
        self.request_id = request_id

    def compose(self) -> ComposeResult:
        run = self.app.model.runs[self.run_index]
        width = min(self.app.size.width, 100) - 4
        with VerticalScroll():
            yield Static(request_life(run, self.request_id, width), id="life")


class ObservedScreen(Screen):
    """Observed vs replayed per signal and pool (tui/observed_view.py): MAPE, r, the largest gap
    and when; enter goes there, in that pool."""

    BINDINGS = [Binding("escape,o", "app.pop_screen", "back to the dashboard"),
                Binding("enter", "go", "observed: go to its gap")]
    DEFAULT_CSS = """
    ObservedScreen #obs-title { height: auto; }
    ObservedScreen DataTable { height: 1fr; }
    ObservedScreen #obs-notes { height: auto; color: $text-muted; }
    """

    def compose(self) -> ComposeResult:
        yield Static(id="obs-title")
        yield DataTable(cursor_type="row", zebra_stripes=True, id="divergence")
        yield Static(id="obs-notes")

    def on_mount(self) -> None:
        self.fill()
        self.query_one(DataTable).focus()

    def fill(self) -> None:
        from tui.observed_view import HEADERS, divergence_cells, divergence_rows, divergence_title

        overlay = self.app.model.observed
        self.rows = divergence_rows(overlay) if overlay is not None else []
        table = self.query_one(DataTable)
        table.clear(columns=True)
        if overlay is None:
            self.query_one("#obs-title", Static).update(Text(" no observed export: tui RUN --observed FILE", "italic"))
            return
        self.query_one("#obs-title", Static).update(divergence_title(overlay))
        for name in HEADERS:
            table.add_column(name, key=name)
        for row in divergence_cells(overlay):
            table.add_row(*row)
        notes = list(overlay.notes)
        if not self.rows and overlay.section is not None:
            notes.insert(0, "no signal of the export was replayed for any pool")
        self.query_one("#obs-notes", Static).update(Text("\n".join(notes)))

    def action_go(self) -> None:
        table = self.query_one(DataTable)
        if not self.rows or not 0 <= table.cursor_row < len(self.rows):
            return
        _, pool, d = self.rows[table.cursor_row]
        model = self.app.model
        if d["gap_at_s"] is None:
            return
        model.view.scope = pool if pool in model.scopes else "fleet"
        self.app.pop_screen()
        self.app.seek_to(round(d["gap_at_s"] * 1e6))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_go()
