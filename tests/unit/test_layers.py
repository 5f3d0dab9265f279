"""The layers of README "Development" are an import-linter contract in pyproject.toml:
llm_replay (the application) -> tui -> replay -> policies -> traces -> common (errors and config
helpers, which every layer may import), with no ignored breach. This runs it as `lint-imports`
does, and shows that a breach planted in a copy of the packages is reported."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("llm_replay", "tui", "replay", "policies", "traces", "common")
# lint-imports with the given config, on the packages under `cwd` (it puts cwd first on sys.path)
LINT = ("import sys; from importlinter.cli import lint_imports; "
        "sys.exit(lint_imports(config_filename=sys.argv[1], no_cache=True, no_logo=True))")


def _lint(config: Path, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", LINT, str(config)], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def _settings() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


def _write_config(path: Path, settings: dict) -> Path:
    """The settings as TOML (JSON strings, lists and booleans are TOML values too)."""
    lines = ["[tool.importlinter]", f"root_packages = {json.dumps(settings['root_packages'])}"]
    for contract in settings["contracts"]:
        lines += ["", "[[tool.importlinter.contracts]]", *(f"{k} = {json.dumps(v)}" for k, v in contract.items())]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_layer_contracts_are_kept():
    settings = _settings()
    assert settings["root_packages"] == list(PACKAGES)
    assert next(c for c in settings["contracts"] if c["id"] == "layers")["layers"] == list(PACKAGES)
    assert [c for c in settings["contracts"] if c.get("ignore_imports")] == []  # a breach is fixed, not listed
    done = _lint(ROOT / "pyproject.toml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(("module", "planted", "reported"), [
    # the breach the application layer fixed: replay's CLI starting the dashboard itself
    ("replay/cli/live_run.py", ["from tui.app import make_app"], ["replay.cli.live_run -> tui.app"]),
    # the common base importing upwards, from two layers
    ("common/errors.py", ["from replay.outputs.schema import SCHEMA_VERSION", "from traces.loader import load_trace"],
     ["common.errors -> replay.outputs.schema", "common.errors -> traces.loader"]),
    # a layer importing the application above it
    ("tui/timefmt.py", ["from llm_replay.dashboard import parse_size"], ["tui.timefmt -> llm_replay.dashboard"]),
])
def test_a_new_breach_is_reported(tmp_path, module, planted, reported):
    """An import planted in a copy of the packages breaks the contract, naming the import."""
    for name in PACKAGES:
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("data", "__pycache__"))
    path = tmp_path / module
    path.write_text(path.read_text() + "".join(f"\n{line}  # noqa: E402" for line in planted) + "\n")
    done = _lint(_write_config(tmp_path / "contracts.toml", _settings()), cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Contracts: 0 kept, 1 broken." in done.stdout, done.stdout
    for line in reported:
        assert line in done.stdout, done.stdout
