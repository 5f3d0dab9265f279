"""The layers of README "Development" are import-linter contracts in pyproject.toml: tui ->
replay -> policies -> traces, with traces' errors and config helpers a common base below the
rest of traces (so every layer may import them). This runs them as `lint-imports` does, and shows
that a breach is reported: the known ones when their ignore entries are dropped, and one planted
in a copy of the packages."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("tui", "replay", "policies", "traces")
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
    done = _lint(ROOT / "pyproject.toml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_the_known_breaches_are_reported_without_their_ignore_entries(tmp_path):
    settings = _settings()
    ignored = [i for c in settings["contracts"] for i in c.get("ignore_imports", [])]
    assert ignored  # else this test shows nothing: plant one as the next test does
    for contract in settings["contracts"]:
        contract.pop("ignore_imports", None)
    done = _lint(_write_config(tmp_path / "contracts.toml", settings))
    assert done.returncode == 1, done.stdout + done.stderr
    for entry in ignored:
        assert entry in done.stdout, (entry, done.stdout)


def test_a_new_breach_is_reported(tmp_path):
    """traces.errors (the common base) importing replay and the trace loader, in a copy of the
    packages: both contracts are broken, each naming its import."""
    for name in PACKAGES:
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("data", "__pycache__"))
    errors = tmp_path / "traces" / "errors.py"
    errors.write_text(errors.read_text() + "\nfrom replay.outputs.schema import SCHEMA_VERSION  # noqa: E402\n"
                      "from traces.loader import load_trace  # noqa: E402\n")
    done = _lint(_write_config(tmp_path / "contracts.toml", _settings()), cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Contracts: 0 kept, 2 broken." in done.stdout, done.stdout
    assert "traces.errors -> replay.outputs.schema" in done.stdout and "traces.errors -> traces.loader" in done.stdout
