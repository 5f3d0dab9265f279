"""A cold compile's helper process (replay/engine/prebuild.py) compiles advance_nb's callees for
the argument types advance_nb calls them with, so that advance_nb finds them in the cache: a plan
whose types drifted from the code would compile them twice, in the helper and again here."""

from __future__ import annotations

import types as pytypes

import pytest
from numba import njit

from replay.engine import prebuild
from replay.engine.loop import advance_nb
from replay.engine.numba_engine import NumbaEngine
from replay.engine.variants import specialise
from tests.strategies import tiny_inputs


@pytest.mark.parametrize("variant", ["plain", "full"])
def test_the_plan_has_the_types_advance_nb_calls_its_callees_with(variant):
    engine = NumbaEngine(tiny_inputs(), variant=variant)
    args = (engine.rq, engine.blocks, engine.reps, engine.pools, engine.ev, engine.th, engine.tbs)
    # advance_nb typed afresh (not loaded from the cache): it compiles, or loads, each callee for
    # the types it calls it with, and each callee has no other caller.
    jobs = prebuild._jobs(prebuild.HELPER + prebuild.OWN, variant, args)
    _typed_afresh(specialise(advance_nb, variant), tuple(njit(lambda: 0).typeof_pyval(a) for a in (*args, engine.tbs)))
    callees = [(job, sig) for job, sig in jobs if job[1] not in _HOST_CALLED]
    assert len(callees) >= 6
    for (module, name, _, _), sig in callees:
        kernel = prebuild._kernel(module, name, variant)
        assert set(kernel.overloads) == {sig}, f"{module}.{name}: advance_nb calls it with {list(kernel.overloads)}"


def _typed_afresh(kernel, sig):
    """A copy of the kernel, not cached, compiled for sig: its callees are compiled (or loaded)
    for the types it calls them with."""
    py = kernel.py_func
    fresh = njit(cache=False, **{k: v for k, v in kernel.targetoptions.items() if k != "nopython"})(
        pytypes.FunctionType(py.__code__, py.__globals__, py.__name__, py.__defaults__, py.__closure__))
    fresh.compile(sig)


_HOST_CALLED = ("enter_nb", "snapshot_nb", "sync_lazy_nb", "_window_percentiles_ranked", "scrape_nb")


@pytest.mark.parametrize("variant", ["plain", "full"])
def test_the_kernels_the_host_calls_have_the_types_a_replay_calls_them_with(variant):
    from replay.run import warm_up

    warm_up(variant=variant)  # a replay: compiles or loads each kernel for the types it is called with
    engine = NumbaEngine(tiny_inputs(), variant=variant)
    args = (engine.rq, engine.blocks, engine.reps, engine.pools, engine.ev, engine.th, engine.tbs)
    jobs = [(job, sig) for job, sig in prebuild._jobs(prebuild.HELPER + prebuild.HOST, variant, args)
            if job[1] in _HOST_CALLED]
    assert len(jobs) == len(_HOST_CALLED)
    for (module, name, _, _), sig in jobs:
        kernel = prebuild._kernel(module, name, variant)
        assert sig in kernel.overloads, f"{module}.{name}: called with {list(kernel.overloads)}"


def _tiny_plan(monkeypatch, helper_kernel="quiet_begin"):
    """Plans of one cheap kernel each (cached already), the variant not marked compiled."""
    job = ("replay.engine.quiet", helper_kernel, ("reps", "pools", "int64"), None)
    monkeypatch.setattr(prebuild, "HELPER", (job,))
    monkeypatch.setattr(prebuild, "HOST", (job,))
    monkeypatch.setattr(prebuild, "OWN", (("replay.engine.quiet", "quiet_begin", ("reps", "pools", "int64"), None),))
    monkeypatch.setattr(prebuild, "_STARTED", set())
    monkeypatch.setattr(prebuild, "_SPAWNED", [])
    monkeypatch.setattr(prebuild, "helps", lambda: True)
    monkeypatch.setattr("replay._numba_cache.kernels_cached", lambda variant="plain": False)
    monkeypatch.setattr("replay._numba_cache.HELPER_CPU_S", {})
    engine = NumbaEngine(tiny_inputs(), variant="plain")
    return (engine.rq, engine.blocks, engine.reps, engine.pools, engine.ev, engine.th, engine.tbs)


def _start(args, monkeypatch):
    # advance_nb not yet compiled in this process, as on a cold cache
    monkeypatch.setattr(prebuild, "_kernel", lambda module, name, variant, real=prebuild._kernel: (
        pytypes.SimpleNamespace(overloads={}) if name == "advance_nb" else real(module, name, variant)))
    monkeypatch.setattr(prebuild, "_STARTED", set())  # (the engine made for the types did not start one)
    prebuild.start("plain", args)
    assert "plain" in prebuild._HELPERS
    return prebuild._HELPERS["plain"][0]


def test_the_helper_compiles_its_part_and_is_gone_when_advance_nb_is_compiled(monkeypatch):
    from replay import _numba_cache

    args = _tiny_plan(monkeypatch)
    proc = _start(args, monkeypatch)
    with prebuild.compile_ahead("plain", args):
        pass  # advance_nb's compile
    assert proc.returncode == 0 and "plain" not in prebuild._HELPERS
    assert _numba_cache.HELPER_CPU_S["plain"] >= 0.0


def test_a_helper_spawned_ahead_imports_first_and_takes_the_jobs_start_hands_it(monkeypatch):
    args = _tiny_plan(monkeypatch)
    prebuild.spawn()  # as llm_replay/entry.py does before the command's imports
    (spawned,) = prebuild._SPAWNED
    prebuild.spawn()  # one is enough
    assert len(prebuild._SPAWNED) == 1
    proc = _start(args, monkeypatch)
    assert proc is spawned and not prebuild._SPAWNED
    with prebuild.compile_ahead("plain", args):
        pass
    assert proc.returncode == 0


def test_a_spawned_helper_given_no_jobs_exits_when_its_stdin_closes(monkeypatch):
    _tiny_plan(monkeypatch)
    prebuild.spawn()
    (proc,) = prebuild._SPAWNED
    proc.stdin.close()  # as when this process exits without having needed it
    assert proc.wait(timeout=120) == 0
    proc.stdout.close()


def test_the_helper_imports_this_process_package_not_one_in_the_working_directory(monkeypatch, tmp_path):
    # The Quick start runs a `pip install .` from its checkout: a helper that imported the checkout's
    # files would fill cache entries numba keys by those files, which this process never reads.
    decoy = tmp_path / "replay"
    decoy.mkdir()
    (decoy / "__init__.py").write_text("raise SystemExit(7)  # not the package this process runs\n")
    monkeypatch.chdir(tmp_path)
    proc = prebuild._start_helper()
    proc.stdin.close()
    assert proc.wait(timeout=120) == 0
    proc.stdout.close()


def test_no_helper_is_spawned_once_the_kernels_are_cached(monkeypatch):
    _tiny_plan(monkeypatch)
    monkeypatch.setattr("replay._numba_cache.kernels_cached", lambda variant="plain": True)
    monkeypatch.setattr(prebuild, "_start_helper", lambda: pytest.fail("spawned a helper on a warm cache"))
    prebuild.spawn()
    assert not prebuild._SPAWNED


def test_a_run_spawns_the_helper_before_its_imports_and_other_commands_do_not(monkeypatch):
    from llm_replay import entry

    calls = []
    monkeypatch.setattr(prebuild, "spawn", lambda: calls.append(True))
    for argv, spawns in ((["run"], True), (["run", "t.csv", "--out", "o"], True), (["run", "--engine", "reference"], False),
                         (["run", "--engine=reference"], False), (["run", "--tui"], False), (["run", "-h"], False),
                         (["tui", "runs/x"], False), ([], False)):
        calls.clear()
        entry._start_compiling(argv)
        assert calls == ([True] if spawns else []), argv


def test_a_helper_that_fails_only_costs_time(monkeypatch):
    args = _tiny_plan(monkeypatch, helper_kernel="no_such_kernel")
    proc = _start(args, monkeypatch)
    with prebuild.compile_ahead("plain", args):
        pass
    assert proc.returncode not in (0, None)


def test_one_core_starts_no_helper_and_estimates_one_process(monkeypatch, tmp_path):
    import numba

    from replay import _numba_cache

    monkeypatch.setattr(prebuild, "_cores", lambda: 1)
    monkeypatch.setattr(prebuild, "_start_helper", lambda *a: pytest.fail("started a helper on one core"))
    monkeypatch.setattr("replay._numba_cache.kernels_cached", lambda variant="plain": False)
    monkeypatch.setattr(prebuild, "_STARTED", set())
    prebuild.start("plain", ())
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path / "kernels-new"))  # no compile timed here
    monkeypatch.setattr(_numba_cache, "core_share", lambda: 1.0)
    assert _numba_cache.compile_estimate_s() == (_numba_cache.ONE_CORE_COMPILE_CPU_S["plain"], "on one core")
    assert _numba_cache.ONE_CORE_COMPILE_CPU_S["plain"] > _numba_cache.COLD_COMPILE_CPU_S["plain"]
