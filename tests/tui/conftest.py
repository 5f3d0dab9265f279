"""Runs the dashboard tests read: the committed incident fixtures (tests/fixtures/runs/, made by
its make_runs.py) and, made here by the real replay, a one-pool run without an autoscaler."""

from __future__ import annotations

import io
from pathlib import Path

import polars as pl
import pytest
from rich.console import Console

FIXTURE_RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "runs"
BEFORE = FIXTURE_RUNS / "incident-before"
AFTER = FIXTURE_RUNS / "incident-after"


def tiny_trace(n: int = 400, span_s: int = 40):
    """n requests over span_s seconds, a few long prompts among them (seeded, no randomness)."""
    from traces import LoadedTrace, cast_to_schema

    arrivals = [round(i * span_s * 1e6 / n) for i in range(n)]
    prompts = [6000 if i % 37 == 0 else 300 + (i * 53) % 900 for i in range(n)]
    outputs = [20 + (i * 31) % 200 for i in range(n)]
    frame = cast_to_schema(pl.DataFrame({"arrival_us": arrivals, "prompt_tokens": prompts, "output_tokens": outputs}),
                           source="tiny")
    return LoadedTrace(frame, "tiny", "synthetic", None, "", {}, 0)


def tiny_config():
    from replay.config import EngineArgs, FleetConfig, PoolConfig

    # a small KV cache, so the run has a queue, preemptions and an SLO breach to look at
    pool = PoolConfig(replicas=1, engine=EngineArgs(num_gpu_blocks_override=500, max_model_len=7000))
    return FleetConfig(model="llama-3.1-8b", pools=(pool,))


@pytest.fixture(scope="session")
def one_pool_run(tmp_path_factory) -> Path:
    """A finished run of one pool named 'default', no autoscaler: no scaling events."""
    from replay.outputs.write import write_run
    from replay.run import replay_trace

    out = tmp_path_factory.mktemp("runs") / "one-pool"
    return write_run(out, replay_trace(tiny_trace(), tiny_config()))


@pytest.fixture
def cli(capsys, tmp_path, monkeypatch):
    """`llm-replay ARGV...` in-process, in tmp_path: (exit code, stdout, stderr)."""
    from llm_replay.app import main

    monkeypatch.chdir(tmp_path)

    def call(*argv):
        capsys.readouterr()
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:
            code = exc.code
        out = capsys.readouterr()
        return code, out.out, out.err

    return call


def screen_text(app) -> str:
    """What the dashboard shows, as plain text (for assertions on content, not looks)."""
    w, h = app.size
    console = Console(width=w, height=h, file=io.StringIO(), record=True, force_terminal=True, color_system=None,
                      legacy_windows=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()


def pd_config():
    """Prefill/decode disaggregation on llama-3.1-8b: pools named prefill and decode."""
    from replay.config import EngineArgs, FleetConfig, PoolConfig, SplitConfig

    engine = EngineArgs(num_gpu_blocks_override=2000, max_model_len=7000)
    return FleetConfig(model="llama-3.1-8b", split=SplitConfig(policy="prefill-decode"),
                       pools=(PoolConfig(name="prefill", replicas=1, engine=engine),
                              PoolConfig(name="decode", replicas=2, engine=engine)))


@pytest.fixture(scope="session")
def pd_run(tmp_path_factory) -> Path:
    """A finished prefill/decode run of the tiny trace."""
    from replay.outputs.write import write_run
    from replay.run import replay_trace

    out = tmp_path_factory.mktemp("runs") / "pd"
    return write_run(out, replay_trace(tiny_trace(), pd_config()))
