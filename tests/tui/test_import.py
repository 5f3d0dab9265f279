"""The replay core never loads Textual (DESIGN.md: tui -> replay -> policies -> traces), nor does
the application's command line until the dashboard is asked for."""

from __future__ import annotations

import subprocess
import sys


def test_import_replay_leaves_textual_out():
    code = (
        "import sys\n"
        "import replay, replay.cli.app, replay.run, replay.fleet.live, replay.cli.live_run, replay.outputs.report\n"
        "import policies, traces, common, llm_replay.app, llm_replay.dashboard\n"
        "llm_replay.app.build_parser().parse_args(['tui', 'x'])\n"
        "bad = sorted(m for m in sys.modules if m == 'textual' or m.startswith('textual.'))\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
