"""The application layer (llm_replay/) sits above the dashboard: it is the console script and
registers the dashboard's commands into replay's command table, which replay never fills with
them itself (replay must not import tui: tests/unit/test_layers.py)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_the_console_script_is_the_application():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"llm-replay": "llm_replay.entry:main"}
    done = subprocess.run([sys.executable, "-m", "llm_replay", "tui", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and "--screenshot" in done.stdout, done.stderr


def test_replay_alone_has_no_dashboard_commands():
    done = _python("import replay.cli.app as a, replay.cli.live_run, replay.run; "
                   "print(sorted(a.COMMANDS)); print(a._dashboard)")
    assert done.returncode == 0, done.stderr
    names, hooks = done.stdout.splitlines()
    assert "tui" not in names and "run" in names and hooks == "[]"


def test_run_tui_without_a_dashboard_is_one_line_and_writes_nothing(tmp_path):
    """replay's own dispatch (no application around it): --tui fails before anything is read."""
    done = _python("import sys; from replay.cli import main; sys.exit(main(['run', '--tui', '--out', 'out']))",
                   cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr == ("llm-replay: error: --tui: this command line has no dashboard (start it as "
                           "llm-replay, or `python -m llm_replay`)\n")
    assert list(tmp_path.iterdir()) == []


def test_registering_is_idempotent_and_never_replaces_a_command(monkeypatch):
    from llm_replay import dashboard
    from llm_replay.app import install
    from replay.cli import app

    install()
    before = list(app.COMMANDS)
    install()
    assert list(app.COMMANDS) == before and app.COMMANDS["tui"] is dashboard
    with pytest.raises(ValueError, match="'run': already registered"):
        app.register("run", dashboard, after="catalog")
    with pytest.raises(ValueError, match="no command 'nope'"):
        app.register("extra", dashboard, after="nope")
    assert list(app.COMMANDS) == before
