"""The engine package reads as its architecture (issue 12): small modules and functions, the
reference engine mirrored module for module under the kernels' names, and the entry points that
the policies are wired into kept as separate functions with their arguments."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "replay" / "engine"
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 600, 80


def _modules() -> list[Path]:
    return sorted(ENGINE.rglob("*.py"))


def test_no_engine_module_or_function_is_too_long():
    long_modules, long_functions = [], []
    for path in _modules():
        text = path.read_text()
        if text.count("\n") > MAX_MODULE_LINES:
            long_modules.append(path.name)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                if node.end_lineno - first + 1 > MAX_FUNCTION_LINES:
                    long_functions.append(f"{path.relative_to(ENGINE)}:{node.name}")
    assert not long_modules and not long_functions, (long_modules, long_functions)


def test_the_reference_engine_mirrors_the_kernel_modules():
    kernel = {p.name for p in ENGINE.glob("*.py")}
    reference = {p.name for p in (ENGINE / "reference").glob("*.py")}
    # engine.py is numba_engine.py's twin; the reference's waiting queues are deques (no queues.py);
    # user.py is the twin of numba_engine.user_calls (the users' policies' views); lazy.py has none:
    # the reference engine steps every request at every step, as the kernels do with lazy=False;
    # nor has quiet.py: the reference takes a replica's steps one event each; nor variants.py: the
    # reference has every feature, the kernels compile those a run uses; nor window.py: the
    # reference holds every request of the trace; nor prebuild.py: the reference compiles nothing.
    assert reference - {"engine.py", "user.py"} <= kernel, reference - kernel
    twinless = {"common.py", "numba_engine.py", "queues.py", "lazy.py", "quiet.py", "variants.py", "window.py",
                "prebuild.py"}
    assert kernel - reference == twinless, kernel - reference


def _params(fn) -> list[str]:
    return list(inspect.signature(getattr(fn, "py_func", fn)).parameters)


def test_the_policy_entry_points_keep_their_names_and_arguments():
    from replay.engine import loop, routing, scheduling
    from replay.engine.reference.engine import ReferenceEngine

    assert _params(routing.route) == ["rq", "blocks", "reps", "pools", "th", "tbs", "p", "q", "t"]
    assert _params(routing.admit) == ["rq", "reps", "pools", "p", "r", "q", "t"]
    assert _params(routing.check_policy_ids) == ["pools", "ev"]
    assert _params(routing.unknown_policy) == ["ev", "family", "p", "t"]
    assert _params(scheduling.pick_victim) == ["rq", "reps", "pools", "p", "off", "nrun", "i"]
    assert _params(scheduling.pick_waiting) == ["rq", "blocks", "reps", "pools", "th", "tbs", "p", "r", "cutoff"]
    assert _params(loop.advance_nb) == ["rq", "blocks", "reps", "pools", "ev", "th", "tbs", "until"]
    assert _params(ReferenceEngine._route) == ["self", "p", "req", "t"]
    assert _params(ReferenceEngine._admit) == ["self", "p", "rep", "req", "t"]
    assert _params(ReferenceEngine._victim) == ["self", "rep", "i"]
    assert _params(ReferenceEngine._next_waiting) == ["self", "rep", "bs", "cutoff"]
    assert _params(ReferenceEngine._check_policy_ids) == ["self"]
    assert _params(ReferenceEngine.advance) == ["self", "until_us"]
