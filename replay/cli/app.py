"""`llm-replay`: the command table and the dispatch. Each command is one module of replay/cli/
with `add_parser(sub)` and `run(args) -> exit code`; a new command is a module plus a row of
COMMANDS. The dashboard's commands (`tui`, and what `run --tui` shows) sit in a layer above
replay, which never imports tui: the application (llm_replay/app.py) adds them with `register`
and `register_dashboard`.

A user mistake (a `UserError`) prints one line on stderr and exits with code 2, no traceback and
no output directory; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Callable

from common.errors import UserError
from replay.cli import (
    calibrate, capacity, catalog, demo, export, plan, policies, profile, run, sweep, synth, trace, validate,
)
from replay.cli.parsing import EXIT_USAGE, OneLineParser

# Command name -> its module, in the order `llm-replay --help` lists them. Every module's
# imports are light: what a command needs is imported when it runs.
COMMANDS = {
    "run": run,
    "capacity": capacity,
    "plan": plan,
    "sweep": sweep,
    "trace": trace,
    "synth": synth,
    "demo": demo,
    "policies": policies,
    "catalog": catalog,
    "calibrate": calibrate,
    "validate": validate,
    "profile": profile,
    "export": export,
}

# What `run --tui` shows while the replay runs: show(run_dir) returns when the user quits.
_dashboard: list[Callable] = []


def register(name: str, module, *, after: str) -> None:
    """Add command `name` (a module with `add_parser` and `run`) to COMMANDS, listed after
    `after`; registering the same module again changes nothing."""
    if COMMANDS.get(name, module) is not module or after not in COMMANDS:
        raise ValueError(f"command {name!r}: already registered, or no command {after!r} to follow")
    rows = [(k, v) for k, v in COMMANDS.items() if k != name]
    at = [k for k, _ in rows].index(after) + 1
    COMMANDS.clear()
    COMMANDS.update([*rows[:at], (name, module), *rows[at:]])


def register_dashboard(show: Callable) -> None:
    _dashboard[:] = [show]


def dashboard() -> Callable:
    """The registered dashboard, for `run --tui` (a UserError before anything is read or written
    when this command line was built without one)."""
    if not _dashboard:
        raise UserError("--tui: this command line has no dashboard (start it as llm-replay, "
                        "or `python -m llm_replay`)")
    return _dashboard[0]


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="llm-replay",
        description="Replay LLM request traces through a simulated fleet of vLLM-like engines.",
    )
    # every subcommand's parser is a OneLineParser
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=OneLineParser)
    for module in COMMANDS.values():
        module.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    # SIGINT and SIGTERM end a command alike: one line, nothing partial (replay.outputs.rundir.Interrupted).
    import signal

    previous: dict = {}  # the handlers to restore (main may run inside a test process)
    try:
        from replay.outputs.rundir import forget_signals, raise_interrupted

        forget_signals()
        if threading.current_thread() is threading.main_thread():
            previous.update({s: signal.signal(s, raise_interrupted) for s in (signal.SIGINT, signal.SIGTERM)})

        args = build_parser().parse_args(argv)
        return COMMANDS[args.command].run(args)
    except UserError as exc:
        print(f"llm-replay: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as exc:
        # replay.outputs.rundir.Interrupted says which signal, and whether the run was already in place
        signum, written = getattr(exc, "signum", signal.SIGINT), getattr(exc, "written", None)
        what = "terminated" if signum == signal.SIGTERM else "interrupted"
        print(f"llm-replay: {what}; " + (f"the run was written to {written}" if written else "nothing written"),
              file=sys.stderr)
        return 128 + signum
    finally:
        for signum, handler in previous.items():
            if handler is not None:
                signal.signal(signum, handler)
