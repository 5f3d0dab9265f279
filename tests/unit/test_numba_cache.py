"""numba checks a cached kernel against its own file only, so replay/_numba_cache.py keys the cache
directory on every source whose code or constants end up in a kernel. A module left out of
that list would let a changed engine load a stale kernel; these tests catch it."""

from __future__ import annotations

import ast
import importlib.util
import shutil
from pathlib import Path

import numba

from replay import _numba_cache

ROOT = Path(__file__).resolve().parents[2]
REPLAY = ROOT / "replay"


def _defines_kernels(path: Path) -> bool:
    """The module imports numba's jit decorators (so it compiles kernels of its own)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "numba":
            if {alias.name for alias in node.names} & {"njit", "jit", "vectorize", "cfunc"}:
                return True
    return False


def _engine_imports(path: Path) -> set[Path]:
    """The replay.engine modules that `path` imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("replay.engine."):
            found.add(ROOT / (node.module.replace(".", "/") + ".py"))
    return found


def test_every_module_with_kernels_keys_the_cache():
    keyed = set(_numba_cache.kernel_sources())
    with_kernels = {path for path in REPLAY.rglob("*.py") if _defines_kernels(path)}
    assert with_kernels, "no kernel module found: the scan is broken"
    assert with_kernels <= keyed, sorted(str(p.relative_to(ROOT)) for p in with_kernels - keyed)


def _policy_imports(path: Path) -> set[Path]:
    """The policies modules that `path` imports (a package's __init__ for a package)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("policies."):
            base = ROOT / node.module.replace(".", "/")
            found.add(base / "__init__.py" if base.is_dir() else base.with_suffix(".py"))
    return found


def test_every_policies_module_a_kernel_imports_keys_the_cache():
    """The users' policies' intrinsic, the links' helpers and the view columns are compiled into the
    engine as the built-in policies are. (The registry is keyed for its order only: the pure-Python
    autoscalers it imports are not compiled.)"""
    keyed = set(_numba_cache.kernel_sources())
    kernels = {path for path in keyed if path.name != "registry.py"}
    imported = set().union(*(_policy_imports(path) for path in kernels))
    assert ROOT / "policies" / "_native.py" in imported and ROOT / "policies" / "user.py" in imported
    assert imported <= keyed, sorted(str(p.relative_to(ROOT)) for p in imported - keyed)


def test_every_engine_module_a_kernel_imports_keys_the_cache():
    """Constants (state codes, column indices) are frozen into the kernels that import them."""
    keyed = set(_numba_cache.kernel_sources())
    imported = set().union(*(_engine_imports(path) for path in keyed if path.is_relative_to(REPLAY)))
    assert REPLAY / "engine" / "common.py" in imported and REPLAY / "engine" / "state.py" in imported
    assert imported <= keyed, sorted(str(p.relative_to(ROOT)) for p in imported - keyed)


def _cache_dir(root: Path) -> str:
    """The cache directory the copy of the sources under `root` would use."""
    before = numba.config.CACHE_DIR
    try:
        spec = importlib.util.spec_from_file_location("_numba_cache_copy", root / "replay" / "_numba_cache.py")
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
        return numba.config.CACHE_DIR
    finally:
        numba.config.CACHE_DIR = before


def test_a_change_to_any_engine_kernel_module_moves_the_cache(tmp_path: Path):
    for name in ("replay", "policies"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "data"))
    base = _cache_dir(tmp_path)
    assert base == _cache_dir(tmp_path)
    modules = sorted(p for p in (tmp_path / "replay" / "engine").glob("*.py") if p.name != "__init__.py")
    seen = {base}
    for path in modules:
        if path.name in ("numba_engine.py", "window.py", "prebuild.py"):  # the host side: never compiled
            continue
        text = path.read_text()
        path.write_text(text + "\n# changed\n")
        moved = _cache_dir(tmp_path)
        path.write_text(text)
        assert moved not in seen, f"changing replay/engine/{path.name} leaves the cache where it was"
        seen.add(moved)
