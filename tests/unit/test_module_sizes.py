"""No module over 600 lines and no function over 80 (issue 12 item 4), in every package of the
project, so that a module or a function stays readable in one sitting."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("llm_replay", "tui", "replay", "policies", "traces", "common")
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80  # from its `def` line to its last, docstring included


def oversized(root: Path, packages=PACKAGES, exempt=frozenset()) -> list[str]:
    """'path: N lines' for each module over the limit, 'path:line name: N lines' for each function."""
    found = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            name = path.relative_to(root).as_posix()
            if name in exempt:
                continue
            source = path.read_text()
            if (lines := len(source.splitlines())) > MAX_MODULE_LINES:
                found.append(f"{name}: {lines} lines, more than {MAX_MODULE_LINES}")
            for node in ast.walk(ast.parse(source, name)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    if (lines := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES:
                        found.append(f"{name}:{node.lineno} {node.name}: {lines} lines, more than "
                                     f"{MAX_FUNCTION_LINES}")
    return found


def test_no_module_or_function_is_over_its_limit():
    """No exemption: the engine too is modules of its parts (replay/engine/)."""
    assert oversized(ROOT) == []


def test_an_oversized_module_or_function_is_named(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))  # def line + 80: one too many
    padding = "\n" * (MAX_MODULE_LINES - MAX_FUNCTION_LINES)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "big.py").write_text(f"def long_one():\n{body}{padding}")
    (tmp_path / "pkg" / "ok.py").write_text("def short():\n" + body[: body.rindex("    x")])
    assert oversized(tmp_path, ("pkg",)) == [
        f"pkg/big.py: {MAX_MODULE_LINES + 1} lines, more than {MAX_MODULE_LINES}",
        f"pkg/big.py:1 long_one: {MAX_FUNCTION_LINES + 1} lines, more than {MAX_FUNCTION_LINES}",
    ]
