"""The first run of a fresh install compiles the kernels (about a minute on an idle 2-core machine,
longer on a busy one): it says so, with an estimate, also without a terminal (in logs), and says
nothing of it once cached."""

from __future__ import annotations

import json
import os

import numba
import pytest

from replay import _numba_cache
from tests.e2e.conftest import small_fleet


def test_a_cold_cache_says_it_is_compiling_and_for_how_long(cli, write, monkeypatch):
    monkeypatch.setattr(_numba_cache, "kernels_cached", lambda variant="plain": False)
    monkeypatch.setattr(_numba_cache, "mark_compiled", lambda *seconds: None)
    monkeypatch.setattr(_numba_cache, "HELPER_CPU_S", {})  # what a helper adds, which nothing marks here
    cfg = write("f.yaml", small_fleet("{path: azure-code-2023, window: {end_s: 10}}"))
    res = cli("run", "--config", cfg, "--out", "o")
    assert res.code == 0, res.err
    first, second = [line for line in res.err.splitlines() if "compil" in line]
    assert first.startswith("llm-replay: compiling the engine's kernels (once per install or upgrade; about ")
    assert " s, " in first and "cached for later runs" in first
    assert second.startswith("llm-replay: compiled the engine in ")
    quiet = cli("run", "--config", cfg, "--out", "q", "-q")
    assert "compiling" not in quiet.err


def test_a_warm_cache_says_nothing_of_compiling(cli, write):
    from replay.run import warm_up

    warm_up()  # compiles what is not yet cached, and marks the cache
    assert _numba_cache.kernels_cached()
    cfg = write("f.yaml", small_fleet("{path: azure-code-2023, window: {end_s: 10}}"))
    res = cli("run", "--config", cfg, "--out", "o")
    assert res.code == 0, res.err
    assert "compil" not in res.err


def test_the_estimate_is_the_recent_compiles_timed_here(tmp_path, monkeypatch):
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path / "kernels-new"))
    monkeypatch.setattr(_numba_cache, "core_share", lambda: 1.0)  # an idle machine
    assert _numba_cache.compile_estimate_s() == (_numba_cache.COLD_COMPILE_CPU_S["plain"], "on a 2-core machine")
    old = tmp_path / "kernels-old"
    old.mkdir()
    (old / "compiled-plain.json").write_text(json.dumps({"compile_s": 116.2}))  # an older version's: wall only
    assert _numba_cache.compile_estimate_s() == (_numba_cache.COLD_COMPILE_CPU_S["plain"], "on a 2-core machine")
    (old / "compiled-plain.json").write_text(json.dumps({"compile_s": 90.0, "compile_cpu_s": 41.5}))
    assert _numba_cache.compile_estimate_s() == (41.5, "the recent compiles on this machine")
    # A compile that found most kernels cached (8.6 s) does not promise the next cold one in seconds.
    for i, seconds in enumerate((180.3, 121.8, 8.6)):
        folder = tmp_path / f"kernels-{i}"
        folder.mkdir()
        (folder / "compiled-plain.json").write_text(json.dumps({"compile_s": seconds * 2, "compile_cpu_s": seconds}))
        os.utime(folder / "compiled-plain.json", (2e9 + i, 2e9 + i))
    assert _numba_cache.compile_estimate_s() == (121.8, "the recent compiles on this machine")
    (tmp_path / "kernels-new").mkdir()
    _numba_cache.mark_compiled(12.0, 10.5)
    assert _numba_cache.kernels_cached() and not _numba_cache.kernels_cached("full")
    assert json.loads((tmp_path / "kernels-new" / "compiled-plain.json").read_text()) == {"compile_s": 12.0,
                                                                                         "compile_cpu_s": 10.5}


def test_each_variant_has_its_own_estimate(tmp_path, monkeypatch):
    """The full variant (P/D, LoRA, ...) takes longer to compile than the plain one: its estimate
    is its own, from its own compiles timed here."""
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path / "kernels-new"))
    monkeypatch.setattr(_numba_cache, "core_share", lambda: 1.0)
    assert _numba_cache.compile_estimate_s("full") == (_numba_cache.COLD_COMPILE_CPU_S["full"], "on a 2-core machine")
    assert _numba_cache.COLD_COMPILE_CPU_S["full"] > _numba_cache.COLD_COMPILE_CPU_S["plain"]
    (tmp_path / "kernels-new").mkdir()
    _numba_cache.mark_compiled(80.0, 64.0, "full")
    assert _numba_cache.kernels_cached("full") and not _numba_cache.kernels_cached("plain")
    assert _numba_cache.compile_estimate_s("full") == (64.0, "the recent compiles on this machine")
    assert _numba_cache.compile_estimate_s("plain") == (_numba_cache.COLD_COMPILE_CPU_S["plain"],
                                                        "on a 2-core machine")


def test_the_estimate_follows_the_machines_load(tmp_path, monkeypatch):
    """numba compiles on one thread: on a 2-core machine with 4 other tasks running, the compile's
    two processes get a third of a core each, and the estimate says three times the CPU
    seconds, and why."""
    from replay.engine import prebuild

    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path / "kernels-new"))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(prebuild, "_cores", lambda: 2)
    monkeypatch.setattr(_numba_cache, "_running_elsewhere", lambda: 4.0)
    assert _numba_cache.core_share() == 2 / 6
    estimate, basis = _numba_cache.compile_estimate_s()
    assert estimate == pytest.approx(_numba_cache.COLD_COMPILE_CPU_S["plain"] * 3)
    assert basis == "on a 2-core machine, at this machine's load (33% of a core)"
    monkeypatch.setattr(_numba_cache, "_running_elsewhere", lambda: 0.0)
    monkeypatch.setattr(os, "getloadavg", lambda: (5.0, 5.0, 5.0))  # the last minute's: not now
    assert _numba_cache.core_share() == 1.0
    assert _numba_cache.compile_estimate_s() == (_numba_cache.COLD_COMPILE_CPU_S["plain"], "on a 2-core machine")
    monkeypatch.setattr(_numba_cache, "_running_elsewhere", lambda: None)  # no /proc: the load average
    assert _numba_cache.core_share() == 2 / 7


def test_the_tasks_running_elsewhere_leave_out_this_process_and_its_helper(monkeypatch):
    """The kernel's count of runnable tasks counts this process's threads (the one reading it,
    polars' pool that spins a while after work) and a helper's: none slows the compile down."""
    import io

    text = ["0.90 1.10 1.30 6/812 12345\n"]
    monkeypatch.setattr(_numba_cache, "open", lambda path: io.StringIO(text[0]), raising=False)
    ours = [1]
    monkeypatch.setattr(_numba_cache, "_running_threads", lambda pids: ours[0] if pids[0] == "self" else 99)
    assert _numba_cache._running_elsewhere() == 5.0
    ours[0] = 3
    assert _numba_cache._running_elsewhere() == 3.0
    text[0] = "0.90 1.10 1.30\n"  # not the format Linux writes: the load average instead
    assert _numba_cache._running_elsewhere() is None


def test_this_process_counts_its_own_running_thread():
    if not os.path.exists("/proc/self/task"):
        pytest.skip("no /proc here")
    assert _numba_cache._running_threads(["self"]) >= 1  # the one reading


def test_the_run_warms_up_the_variant_it_replays(cli, write, monkeypatch):
    """The notice and the warm-up are for the kernels the replay will run: the plain variant for
    one pool of vLLM's defaults, the full one for a prefill/decode split or a non-default router."""
    from replay import run as run_module

    warmed = []
    real = run_module.warm_up
    monkeypatch.setattr(run_module, "warm_up", lambda engine="numba", variant="plain": (warmed.append(variant),
                                                                                       real(engine, variant)))
    plain = write("plain.yaml", small_fleet("{path: azure-code-2023, window: {end_s: 10}}"))
    pd = write("pd.yaml", "model: llama-3.1-8b\ntrace: {window: {end_s: 10}}\nsplit: {policy: prefill-decode}\n"
                          "pools: [{name: prefill, replicas: 1}, {name: decode, replicas: 1}]\n")
    routed = write("rr.yaml", small_fleet("{path: azure-code-2023, window: {end_s: 10}}").replace(
        "tensor_parallel_size: 1", "tensor_parallel_size: 1, router: round-robin"))
    for config, variant in ((plain, "plain"), (pd, "full"), (routed, "full")):
        res = cli("run", "--config", config, "--out", f"o-{variant}-{len(warmed)}", "-q")
        assert res.code == 0, res.err
        assert warmed[-1] == variant, config


def test_a_sweep_and_a_plan_warm_up_every_variant_their_replays_run(cli, write, monkeypatch, tmp_path):
    """A command that replays many fleets compiles (or loads) each variant its replays need once,
    in the parent, before any worker starts: a sweep whose grid mixes a default and a
    non-default router warms both; a plan of a base with default policies warms the plain one."""
    from replay import run as run_module

    warmed = []
    real = run_module.warm_up
    monkeypatch.setattr(run_module, "warm_up", lambda engine="numba", variant="plain": (warmed.append(variant),
                                                                                       real(engine, variant)))
    base = write("base.yaml", small_fleet("{path: azure-code-2023, window: {end_s: 5}}"))
    sweep = write("sweep.yaml", "base: base.yaml\ngrid:\n  router: [least-outstanding, round-robin]\n")
    res = cli("sweep", sweep, "--out", str(tmp_path / "sw"), "--workers", "1", "--quiet")
    assert res.code == 0, res.err
    assert warmed[:2] == ["plain", "full"], warmed
    warmed.clear()
    res = cli("plan", "--config", base, "--slo", "ttft_ms=5000", "--gpu", "h100-sxm-80gb", "--tp", "1",
              "--workers", "1", "--max-replicas", "2")
    assert res.code in (0, 1), res.err
    assert warmed[0] == "plain", warmed
