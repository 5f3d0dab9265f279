"""How the dashboard looks, at fixed terminal sizes, on the committed incident runs. Nothing here
depends on a clock: playback is paused and no run is live. After an intended change of looks:
pytest tests/tui/test_snapshots.py --snapshot-update, then review the SVGs in __snapshots__/."""

from __future__ import annotations

from tests.tui.conftest import AFTER, BEFORE
from tui.app import make_app


def test_dashboard_80x24(snap_compare):
    assert snap_compare(make_app(BEFORE, at="4:05"), terminal_size=(80, 24))


def test_dashboard_large_terminal(snap_compare):
    assert snap_compare(make_app(AFTER, at="4:16"), terminal_size=(160, 50))


def test_pool_view(snap_compare):
    assert snap_compare(make_app(AFTER, at="4:16"), press=["p"], terminal_size=(100, 30))


def test_compare(snap_compare):
    assert snap_compare(make_app(BEFORE, compare=AFTER, at="4:16"), terminal_size=(120, 40))


def test_help(snap_compare):
    assert snap_compare(make_app(BEFORE), press=["question_mark"], terminal_size=(80, 24))


def test_drill_down(snap_compare):
    assert snap_compare(make_app(BEFORE, at="4:00"), press=["d"], terminal_size=(120, 30))


def test_request_life(snap_compare):
    assert snap_compare(make_app(AFTER, at="5:00"), press=["d", "enter"], terminal_size=(120, 30))


def test_compare_workload_view(snap_compare):
    """chat before (a shared pool) vs chat after (its own pool): the per-workload view."""
    assert snap_compare(make_app(BEFORE, compare=AFTER, at="4:16"), press=["l", "l"], terminal_size=(120, 40))


def test_replicas_view(snap_compare):
    assert snap_compare(make_app(BEFORE, at="4:00"), press=["r"], terminal_size=(120, 30))
