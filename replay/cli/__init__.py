"""The command line: `app` holds the command table and the dispatch, one module per command
(run, capacity, trace, demo, policies, catalog, calibrate, validate, profile; `live_run` is
`run --tui`). The console script and the `tui` command are the application's (llm_replay/), a
layer above the dashboard, which registers them into this table.

Importing this package imports nothing else, so that the console script (llm_replay.entry) can
turn a Ctrl-C during the heavy imports into one line; `from replay.cli import main` loads the
dispatch (without the dashboard's commands) when it is asked for.
"""

from __future__ import annotations


def __getattr__(name: str):
    if name == "main":
        from replay.cli.app import main

        return main
    raise AttributeError(f"module 'replay.cli' has no attribute {name!r}")
