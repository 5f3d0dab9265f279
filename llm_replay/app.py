"""`llm-replay` as users get it: replay's command table (replay/cli/app.py) with the dashboard's
commands registered into it. Replay sits below tui and cannot start the dashboard itself, so the
registration lives here, in the one layer that may import both."""

from __future__ import annotations

import argparse

import replay.cli.app as replay_cli  # by its full name: a Ctrl-C while it imports reaches llm_replay.entry
from llm_replay import dashboard


def install() -> None:
    """`llm-replay tui` (listed after `catalog`) and the dashboard `run --tui` shows."""
    replay_cli.register("tui", dashboard, after="catalog")
    replay_cli.register_dashboard(dashboard.follow)


def build_parser() -> argparse.ArgumentParser:
    install()
    return replay_cli.build_parser()


def main(argv: list[str] | None = None) -> int:
    install()
    return replay_cli.main(argv)
