"""`llm-replay tui` (the dashboard over a run directory, or an SVG of it), and `follow`, the
dashboard `llm-replay run --tui` shows while replay/cli/live_run.py replays in a child process.

Textual is imported only inside these functions: `import replay` (and `--help`) never loads it.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from common.errors import UserError

SIZE = re.compile(r"^(\d+)x(\d+)$")
MIN_SIZE = (40, 12)


def add_parser(sub) -> None:
    from replay.cli.observed import add_observed_option

    tui = sub.add_parser("tui", help="the incident dashboard over a run directory (Textual)")
    tui.add_argument("run", help="run directory (the --out of llm-replay run), finished or being written")
    tui.add_argument("--compare", metavar="RUN2", help="a second run on the same time axis, differences highlighted")
    tui.add_argument("--at", metavar="TIME", help="start with the cursor at TIME from the run's start: M:SS, "
                     "H:MM:SS or seconds (e.g. 14:05)")
    tui.add_argument("--warmup", type=float, metavar="SECONDS", help="'first SLO breach' (b, and the "
                     "timeline's !) skips this start-up transient (default: the run's metrics_window_s)")
    add_observed_option(tui, help="observed serving metrics of the run's window (the formats of run --observed), "
                        "read with the run's config.yaml `observed:` section: drawn under each chart, marked where "
                        "the replay parts from them, scored per signal (o); with --compare, against the first run")
    tui.add_argument("--diverge-threshold", type=float, metavar="SHARE", help="mark a divergence window whose gap "
                     "exceeds this share of the larger of the two values (default 0.25)")
    tui.add_argument("--screenshot", metavar="FILE.svg", help="draw the dashboard without a terminal into an SVG "
                     "file and exit")
    tui.add_argument("--size", default="120x40", metavar="COLSxROWS", help="terminal size of --screenshot "
                     "(default 120x40)")


def parse_size(text: str) -> tuple[int, int]:
    m = SIZE.match(text.strip())
    if not m or int(m.group(1)) < MIN_SIZE[0] or int(m.group(2)) < MIN_SIZE[1]:
        raise UserError(f"--size {text!r}: expected COLUMNSxROWS of at least {MIN_SIZE[0]}x{MIN_SIZE[1]} "
                        "(e.g. 120x40)")
    return int(m.group(1)), int(m.group(2))


def run(args: argparse.Namespace) -> int:
    from replay.files import check_output_file, write_atomically

    shot = None
    if args.screenshot is not None:
        shot = Path(args.screenshot)
        if shot.suffix.lower() != ".svg":
            raise UserError(f"--screenshot {shot}: expected a file name ending in .svg")
        # before drawing: opening a FIFO to write would block forever; a device or a link is not replaced
        check_output_file(shot, force=True, flag="--screenshot")
    size = parse_size(args.size)
    from tui.app import make_app

    if args.diverge_threshold is not None and not args.observed:
        raise UserError("--diverge-threshold: applies to an observed export; give --observed FILE too")
    app = make_app(args.run, args.compare, args.at, follow=shot is None, warmup_s=args.warmup,
                   observed=args.observed, diverge_threshold=args.diverge_threshold)
    if shot is not None:
        import asyncio

        from tui.app import render_svg

        svg = asyncio.run(render_svg(app, size))
        # a read-only directory or a full disk is one line and leaves no half-written SVG
        write_atomically(shot, lambda fh: fh.write(svg), flag="--screenshot")
        print(f"dashboard of {args.run} written to {shot}")
        return 0
    app.run()
    return 0


def follow(out: Path, observed: list[str] | None = None) -> None:
    """The dashboard over run directory `out` while it is being written, until the user quits
    (or, the replay having failed, at once with its error: exit_on_failure); `observed`: the
    export of `run --tui --observed`, drawn from the start and scored once the run is written."""
    from tui.app import make_app

    make_app(out, exit_on_failure=True, observed=observed).run()
