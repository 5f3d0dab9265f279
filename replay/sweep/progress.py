"""A sweep's progress: a bar on a terminal (cells done, failed, ETA), a plain line per finished
cell without one (a log, CI), nothing with --quiet."""

from __future__ import annotations

import time
from contextlib import contextmanager
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


def eta_s(started: float, done: int, left: int) -> float | None:
    """Seconds left at the rate of the cells this sweep ran so far (None before the first)."""
    if done == 0:
        return None
    return (time.monotonic() - started) / done * left


def _human(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


@contextmanager
def sweep_progress(console: Console, total: int, mode: str) -> Iterator[Callable[[object, dict], None]]:
    """Yields `update(cell, record)`, called as each cell to run finishes; `mode` is bar, lines or off."""
    counts = {"done": 0, "failed": 0}
    started = time.monotonic()
    if mode == "bar":
        columns = (TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[failed]} failed"),
                   TextColumn("ETA"), TimeRemainingColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task("sweep", total=total, failed=0)

            def update_bar(cell, record: dict) -> None:
                counts["failed"] += record["status"] != "ok"
                bar.update(task, advance=1, failed=counts["failed"])

            yield update_bar
        return

    def update_line(cell, record: dict) -> None:
        counts["done"] += 1
        counts["failed"] += record["status"] != "ok"
        if mode == "off":
            return
        left = total - counts["done"]
        what = "failed" if record["status"] != "ok" else "done"
        console.print(f"llm-replay: sweep: {counts['done']}/{total} cells ({counts['failed']} failed), ETA "
                      f"{_human(eta_s(started, counts['done'], left))}; cell {cell.id} {what}: {escape(cell.label)}",
                      soft_wrap=True, highlight=False)

    yield update_line
