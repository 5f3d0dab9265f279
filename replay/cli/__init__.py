"""The command line: `app` holds the command table and the dispatch, one module per command
(run, capacity, trace, demo, policies, catalog, tui, calibrate, validate, profile) and
`entry` the console script.

Importing this package imports nothing else, so that the console script (replay.cli.entry) can
turn a Ctrl-C during the heavy imports into one line; `from replay.cli import main` loads the
dispatch when it is asked for.
"""

from __future__ import annotations


def __getattr__(name: str):
    if name == "main":
        from replay.cli.app import main

        return main
    raise AttributeError(f"module 'replay.cli' has no attribute {name!r}")
