"""The dashboard app and its factory (shared by the CLI and the tests). State lives in a Model;
widgets redraw from it. A live run is followed by a worker thread that reads what the replay added
and posts the new data; it never touches widgets."""

from __future__ import annotations

import gc
import math
import sys
import threading
import time
from pathlib import Path

from textual import events, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.message import Message

from common.errors import UserError
from tui.data import LiveFollower, RunData, load_run, run_source
from tui.model import Model
from tui.panels import METRICS, OBSERVED_METRICS, max_metric_offset, row_groups
from tui.observed_view import scored_only_keys
from tui.screens import GotoScreen, HelpScreen, ObservedScreen, ReplicasScreen, RequestsScreen
from tui.timefmt import fmt_time, parse_time
from tui.widgets import Events, Metrics, Panel, Timeline, header, hints

PLAY_INTERVAL_S = 0.1
FOLLOW_COST_FACTOR = 4.0
EVENTS_MIN = 5
# While a follower thread loads, the UI thread waits for the GIL up to one switch interval per
# acquisition; Python's 5 ms default adds up to a visible lag per key.
FOLLOW_SWITCH_INTERVAL_S = 0.001
# A live run's new data is shown once no key (or click, or wheel) came for this long, so its
# redraw does not sit in front of the next key; but never later than LIVE_DEFER_MAX_S.
INPUT_QUIET_S = 0.1
LIVE_DEFER_MAX_S = 1.0


class RunUpdated(Message):
    """A followed run has new data (or finished, or failed)."""

    def __init__(self, index: int, data: RunData | None, error: str | None = None):
        super().__init__()
        self.index, self.data, self.error = index, data, error


class ObservedScored(Message):
    """The export's overlay, scored against the finished first run (tui/observed.py)."""

    def __init__(self, overlay):
        super().__init__()
        self.overlay = overlay


class Dashboard(App):
    TITLE = "llm-replay"
    ENABLE_COMMAND_PALETTE = False
    CSS = """
    Screen { layout: vertical; }
    #header { height: 1; background: $boost; }
    #metrics { height: 1fr; min-height: 4; }
    #timeline { height: 2; }
    #events { height: 5; border-top: solid $primary-darken-2; }
    #hints { height: 1; background: $boost; }
    """
    BINDINGS = [
        Binding("space", "play_pause", "play / pause"),
        Binding("plus,equals_sign", "speed(1)", "play faster"),
        Binding("minus", "speed(-1)", "slower"),
        Binding("right", "step(1)", "next tick"),
        Binding("left", "step(-1)", "previous"),
        Binding("shift+right", "seek(60)", "a minute later"),
        Binding("shift+left", "seek(-60)", "earlier"),
        Binding("pagedown", "seek(600)", "10 minutes later"),
        Binding("pageup", "seek(-600)", "earlier"),
        Binding("home", "home", "start of the run"),
        Binding("end", "end", "end of the run (live: follow)"),
        Binding("g", "goto", "go to a time (M:SS)"),
        Binding("b", "first_breach", "first SLO breach (past warm-up)"),
        Binding("w", "worst_window", "worst window (lowest SLO met)"),
        Binding("n", "scaling(1)", "next scaling (up or down)"),
        Binding("N", "scaling(-1)", "previous"),
        Binding("p", "scope(1)", "next pool (fleet, then each)"),
        Binding("P", "scope(-1)", "previous"),
        Binding("f", "fleet", "whole fleet"),
        Binding("l", "workload(1)", "next workload (any pool layout)"),
        Binding("L", "workload(-1)", "previous"),
        Binding("r", "replicas", "replicas side by side"),
        Binding("down", "scroll_metrics(1)", "more metric rows"),
        Binding("up", "scroll_metrics(-1)", "back up"),
        Binding("v", "decisions", "log: decisions only / all"),
        Binding("d", "requests", "worst requests at cursor"),
        Binding("o", "observed", "observed vs replayed"),
        Binding("question_mark", "help", "this help"),
        Binding("q", "quit", "quit"),
    ]

    def __init__(self, runs: list[RunData], at_us: int | None = None, follow: bool = True, poll_s: float = 0.5,
                 exit_on_failure: bool = False, followers: dict | None = None, clock=time.monotonic,
                 warmup_us: int | None = None, observed=None):
        super().__init__()
        self.clock = clock  # seconds; the input-quiet rule below reads it (tests drive it by hand)
        # live runs: index -> tui.data.LiveFollower (one is made for a live run given as data)
        self.followers = followers if followers is not None else {
            i: LiveFollower(r.path) for i, r in enumerate(runs) if r.live is not None}
        self.model = Model(runs, at_us, warmup_us, observed)
        self.follow = follow
        self.exit_on_failure = exit_on_failure
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._pending: dict[int, RunUpdated] = {}
        self._last_input = -math.inf
        self._deferred_since: float | None = None
        self._apply_timer = None

    def compose(self) -> ComposeResult:
        yield Panel(header, id="header")
        yield Metrics(id="metrics")
        yield Timeline(id="timeline")
        yield Events(id="events")
        yield Panel(hints, id="hints")

    def on_mount(self) -> None:
        # The loaded run is long-lived: move it out of the garbage collector's scans, whose full
        # collections otherwise land in a keypress now and then (measured: the slowest frames
        # of a seek went from 67 ms to 39 ms). Reloads freeze what they add (`on_run_updated`).
        gc.freeze()
        self._player = self.set_interval(PLAY_INTERVAL_S, self._play_tick, pause=True)
        self._fit_events()
        # after the first frame: the scoring thread would hold the GIL in front of it
        self.call_after_refresh(self._score_when_finished)
        if self.follow and self.followers:
            self._switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(FOLLOW_SWITCH_INTERVAL_S)
            self._follow_runs()

    def on_resize(self) -> None:
        self._fit_events()

    def _fit_events(self) -> None:
        """The metric rows get whole lines each (up to 4 per metric on a tall terminal); the
        event log takes every line left, and at least 4 (plus its rule)."""
        rows_left = self.size.height - 4  # header, timeline (2), key hints
        needed = row_groups(self.model, len(self.model.runs)) * len(METRICS + scored_extra(self.model))
        per_metric = min(4, max(1, (rows_left - EVENTS_MIN) // needed))
        self.query_one("#events").styles.height = max(EVENTS_MIN, rows_left - needed * per_metric)

    def on_unmount(self) -> None:
        self._stop.set()
        if hasattr(self, "_switch_interval"):
            sys.setswitchinterval(self._switch_interval)

    def redraw(self) -> None:
        # the dashboard's panels, and those of a screen over it that draws the model (ReplicasScreen)
        panels = list(self.query(Panel))
        if self.screen is not self.screen_stack[0]:
            panels += self.screen.query(Panel)
        for widget in panels:
            widget.redraw()

    # -- time ---------------------------------------------------------------------------------
    def seek_to(self, t_us: int) -> None:
        self.model.view.message = ""
        self.model.seek_to(t_us)
        self.redraw()

    def action_step(self, n: int) -> None:
        self.model.view.message = ""
        self.model.seek_ticks(n)
        self.redraw()

    def action_seek(self, seconds: int) -> None:
        self.model.view.message = ""
        self.model.seek_by(seconds * 1_000_000)
        self.redraw()

    def action_home(self) -> None:
        self.model.home()
        self.redraw()

    def action_end(self) -> None:
        self.model.end()
        self.redraw()

    def action_play_pause(self) -> None:
        view = self.model.view
        view.playing = not view.playing
        if view.playing and len(self.model.axis) and view.cursor_us >= self.model.axis[-1] and not self.model.live:
            self.model.home()  # play from the start once the end is reached
        self._player.resume() if view.playing else self._player.pause()
        self.redraw()

    def _play_tick(self) -> None:
        self.model.advance(PLAY_INTERVAL_S)
        if not self.model.view.playing:
            self._player.pause()
        self.redraw()

    def action_speed(self, step: int) -> None:
        self.model.change_speed(step)
        self.redraw()

    def action_goto(self) -> None:
        self.push_screen(GotoScreen())

    # -- jumps and scope ----------------------------------------------------------------------
    def action_first_breach(self) -> None:
        self.model.jump_first_breach()
        self.redraw()

    def action_worst_window(self) -> None:
        self.model.jump_worst_window()
        self.redraw()

    def action_scaling(self, direction: int) -> None:
        self.model.jump_scaling(direction)
        self.redraw()

    def action_scope(self, step: int) -> None:
        self.model.cycle_scope(step)
        self.redraw()

    def action_workload(self, step: int) -> None:
        self.model.cycle_workload(step)
        self.redraw()

    def action_replicas(self) -> None:
        self.push_screen(ReplicasScreen())

    def action_fleet(self) -> None:
        self.model.view.scope = "fleet"
        self.redraw()

    def action_scroll_metrics(self, step: int) -> None:
        view = self.model.view
        most = max_metric_offset(self.model, self.query_one("#metrics").size.height)
        view.metric_offset = min(max(view.metric_offset + step, 0), most)
        self.redraw()

    def action_decisions(self) -> None:
        self.model.view.decisions_only = not self.model.view.decisions_only
        self.redraw()

    def action_requests(self) -> None:
        self.push_screen(RequestsScreen())

    def action_observed(self) -> None:
        self.push_screen(ObservedScreen())

    # -- the observed export ------------------------------------------------------------------
    def _score_when_finished(self) -> None:
        """Score the export once the first run is whole (a finished run at once; a live one when
        its replay has written it), off the interface's thread."""
        overlay, run = self.model.observed, self.model.runs[0]
        if overlay is None or overlay.scored or overlay.error is not None or run.live is not None:
            return
        if getattr(self, "_scoring", False):
            return
        self._scoring = True
        self._score(overlay, run)

    @work(thread=True, exclusive=True, group="observed")
    def _score(self, overlay, run) -> None:
        from tui.observed import score_data

        self.post_message(ObservedScored(score_data(overlay, run)))

    def on_observed_scored(self, message: ObservedScored) -> None:
        self._scoring = False
        self.model.observed = message.overlay
        gc.freeze()  # long-lived as the run is (on_mount)
        if message.overlay.error is not None:
            self.model.view.message = f"observed: not scored: {message.overlay.error}"
        self._fit_events()
        self.redraw()
        if isinstance(self.screen, ObservedScreen):
            self.screen.fill()

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    # -- live ---------------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="follow")
    def _follow_runs(self) -> None:
        """Poll each live run: each poll reads only the chunks the replay added since the last
        (tui.data.LiveFollower), so a reload costs what is new, not the whole run."""
        following = {i: f for i, f in self.followers.items()
                     if f.data.live is not None and f.data.live.state != "failed"}
        misses = dict.fromkeys(following, 0)
        wait_s = self.poll_s
        while following and not self._stop.wait(wait_s):
            began = time.perf_counter()
            for i in sorted(following):
                follower = following[i]
                try:
                    data = follower.poll()
                    misses[i] = 0
                    if data is None:
                        continue
                    if data.live is None or data.live.state == "failed":
                        del following[i]
                    self.post_message(RunUpdated(i, data))
                except UserError as exc:  # between the final rename's two steps, or gone
                    misses[i] += 1
                    if misses[i] >= 10:
                        del following[i]
                        self.post_message(RunUpdated(i, None, str(exc)))
            # Reading holds the GIL in bursts: wait several times as long as it took.
            wait_s = max(self.poll_s, FOLLOW_COST_FACTOR * (time.perf_counter() - began))

    async def on_event(self, event: events.Event) -> None:
        if isinstance(event, (events.Key, events.MouseDown, events.MouseScrollDown, events.MouseScrollUp)):
            self._last_input = self.clock()
        await super().on_event(event)

    def on_run_updated(self, message: RunUpdated) -> None:
        """New data waits while the user is pressing keys (a redraw for it would delay the next
        key's), at most LIVE_DEFER_MAX_S; the newest of each run is what is then shown."""
        self._pending[message.index] = message
        now = self.clock()
        if self._deferred_since is None:
            self._deferred_since = now
        quiet = now - self._last_input
        if quiet >= INPUT_QUIET_S or now - self._deferred_since >= LIVE_DEFER_MAX_S:
            self._apply_pending()
        elif self._apply_timer is None:
            self._apply_timer = self.set_timer(INPUT_QUIET_S - quiet, self._apply_later)

    def _apply_later(self) -> None:
        self._apply_timer = None
        now = self.clock()
        quiet = now - self._last_input
        if quiet >= INPUT_QUIET_S or now - self._deferred_since >= LIVE_DEFER_MAX_S:
            self._apply_pending()
        else:
            self._apply_timer = self.set_timer(INPUT_QUIET_S - quiet, self._apply_later)

    def _apply_pending(self) -> None:
        # Shown now (the reload itself may come at LIVE_DEFER_MAX_S): a timer set for held data
        # would otherwise fire later with nothing held and the defer start reset (a TypeError
        # on the next key: bench_tui's "live-key race").
        if self._apply_timer is not None:
            self._apply_timer.stop()
            self._apply_timer = None
        pending, self._pending, self._deferred_since = self._pending, {}, None
        if not pending:
            return
        runs = list(self.model.runs)
        for index, message in sorted(pending.items()):
            if message.data is not None:
                runs[index] = message.data
                if self.exit_on_failure and message.data.live is not None and message.data.live.state == "failed":
                    self.exit()
            else:
                self.model.view.message = f"stopped following: {message.error}"
        self.model.set_runs(runs)
        gc.freeze()
        self._score_when_finished()
        self.redraw()


def scored_extra(model: Model) -> tuple:
    keys = scored_only_keys(model)
    return tuple(spec for spec in OBSERVED_METRICS if spec.key in keys)


def make_app(run: str | Path, compare: str | Path | None = None, at: str | None = None, *,
             follow: bool = True, poll_s: float = 0.5, exit_on_failure: bool = False,
             warmup_s: float | None = None, observed=None, diverge_threshold: float | None = None) -> Dashboard:
    """Load the run(s) (a UserError for anything unreadable) and build the dashboard, its cursor
    at `at` (M:SS from the start) when given; "first SLO breach" skips `warmup_s` (default: the
    run's first metrics window). `observed`: export files read against the first run (its
    config.yaml's `observed:` section), drawn under its charts and scored against it."""
    if warmup_s is not None and not (math.isfinite(warmup_s) and warmup_s >= 0):
        raise UserError(f"--warmup {warmup_s:g}: expected a number of seconds, 0 or more")
    runs, followers = [], {}
    for i, path in enumerate([run] + ([compare] if compare is not None else [])):
        _, status = run_source(Path(path))
        if status is None:
            runs.append(load_run(path))
        else:
            followers[i] = LiveFollower(path)
            runs.append(followers[i].data)
    overlay = None
    if observed:
        from tui.data import load_run_config
        from tui.observed import DEFAULT_THRESHOLD, load_overlay

        threshold = DEFAULT_THRESHOLD if diverge_threshold is None else diverge_threshold
        overlay = load_overlay(observed, runs[0], load_run_config(Path(run)), threshold)
    at_us = None
    if at is not None:
        at_us = parse_time(at)
        end = max(max(r.end_us, r.live.end_us if r.live else 0) for r in runs)
        if at_us > end:
            raise UserError(f"--at {at}: outside the run (0:00 to {fmt_time(end)})")
    return Dashboard(runs, at_us, follow=follow, poll_s=poll_s, exit_on_failure=exit_on_failure,
                     followers=followers, warmup_us=None if warmup_s is None else round(warmup_s * 1e6),
                     observed=overlay)


async def render_svg(app: Dashboard, size: tuple[int, int]) -> str:
    """The dashboard drawn headless at `size` (columns, rows), as SVG."""
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        await app.workers.wait_for_complete()  # an export's scoring: the picture shows its marks
        await pilot.pause()
        return app.export_screenshot(title=f"llm-replay: {app.model.runs[0].name}", simplify=True)

