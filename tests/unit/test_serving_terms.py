"""What lies outside the engine's step and between steps: async scheduling, CUDA-graph padding,
the API server's way in and the tokens' way out (replay/model/serving.py, replay/model/stepmodel.py)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from common.configtools import from_dict
from replay.config import FleetConfig
from replay.engine.reference.engine import ReferenceEngine
from replay.engine.numba_engine import NumbaEngine
from replay.run import replay_trace
from common.errors import ConfigError
from replay.model.serving import ServingTerms, engine_arrivals, window_delay_us
from replay.model.stepmodel import cuda_graph_tokens, cudagraph_capture_limit
from tests.strategies import make_inputs, run_to_end
from traces import LoadedTrace, cast_to_schema


@pytest.mark.parametrize(("tokens", "padded"), [
    (1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (9, 16), (250, 256), (256, 256), (257, 272), (300, 304),
    (512, 512), (513, 513), (9000, 9000),
])
def test_a_step_is_padded_to_the_next_capture_size(tokens, padded):
    assert cuda_graph_tokens(tokens, 512) == padded


def test_capture_sizes_follow_vllm_defaults():
    assert cudagraph_capture_limit(128, 2048) == 256  # 2 x max_num_seqs
    assert cudagraph_capture_limit(256, 8192) == 512  # capped at 512
    assert cudagraph_capture_limit(256, 300) == 288  # the largest capture size within the token budget
    assert cudagraph_capture_limit(128, 2048, num_speculative_tokens=3) == 512
    assert cudagraph_capture_limit(128, 2048, enforce_eager=True) == 0
    assert cuda_graph_tokens(5, 0) == 5  # eager: no padding


def _first_tokens(async_scheduling: int, engine_cls) -> np.ndarray:
    # A long request decodes alone; a second arrives in the middle of a step.
    inputs = make_inputs([0, 25_000], [16, 16], [40, 2], max_num_seqs=(4,), async_scheduling=(async_scheduling,))
    engine = engine_cls(inputs)
    run_to_end(engine)
    cols = engine.request_columns()
    return cols["first_scheduled_us"], cols["first_token_us"]


@pytest.mark.parametrize("engine_cls", [ReferenceEngine, NumbaEngine])
def test_async_scheduling_makes_a_request_that_arrives_mid_step_wait_one_step_more(engine_cls):
    sync_sched, _ = _first_tokens(0, engine_cls)
    async_sched, _ = _first_tokens(1, engine_cls)
    assert sync_sched[0] == async_sched[0] == 0  # an idle engine schedules at once either way
    # Sync: the step after the arrival; async: the one after that (the next was already scheduled).
    assert async_sched[1] > sync_sched[1] > 25_000


def test_engine_arrivals_keep_order_and_add_the_api_server_time():
    arrival = np.array([0, 100, 100, 5_000, 20_000])
    prompt = np.array([10_000, 10, 10, 10, 10])
    terms = [ServingTerms(api_server_us=2000.0, tokenize_us_per_token=1.0, token_return_us=0.0)]
    got = engine_arrivals(arrival, prompt, np.zeros(5, np.int64), terms)
    # The long prompt's tokenising holds the next three behind it (one tokeniser thread).
    assert got.tolist() == [12_000, 12_000, 12_000, 12_000, 22_010]
    assert (np.diff(got) >= 0).all()


def _replay(serving: dict) -> tuple[pl.DataFrame, dict]:
    frame = cast_to_schema(pl.DataFrame({"arrival_us": [0, 400_000, 800_000], "prompt_tokens": [500, 500, 500],
                                         "output_tokens": [50, 50, 50]}), source="test")
    cfg = from_dict(FleetConfig, {"model": "llama-3.1-8b", "gpu": "h100-sxm-80gb",
                                  "pools": [{"name": "p", "replicas": 1, "serving": serving}]}, "", source="test")
    out = replay_trace(LoadedTrace(frame, "test", "synthetic", None, "x", {}, 0), cfg)
    return out.requests, out.summary


def test_token_return_time_adds_to_ttft_and_e2e_but_not_tpot():
    base, _ = _replay({"api_server_us": 0, "tokenize_us_per_token": 0, "token_return_us": 0})
    lagged, summary = _replay({"api_server_us": 0, "tokenize_us_per_token": 0, "token_return_us": 7000})
    assert (lagged["ttft_us"] - base["ttft_us"]).to_list() == [7000] * 3
    assert (lagged["e2e_us"] - base["e2e_us"]).to_list() == [7000] * 3
    assert lagged["tpot_us"].to_list() == base["tpot_us"].to_list()
    assert summary["pool_plans"]["p"]["serving"]["token_return_us"] == 7000.0


def test_api_server_time_delays_the_engine():
    base, _ = _replay({"api_server_us": 0, "tokenize_us_per_token": 0, "token_return_us": 0})
    slow, summary = _replay({"api_server_us": 3000, "tokenize_us_per_token": 2, "token_return_us": 0})
    # Each request reaches the idle engine 3 ms + 500 tokens x 2 us later; its engine time is the same.
    assert (slow["ttft_us"] - base["ttft_us"]).to_list() == [4000] * 3
    assert (slow["first_scheduled_us"] - base["first_scheduled_us"]).to_list() == [4000] * 3
    assert summary["pool_plans"]["p"]["step_model"]["async_scheduling"] is True
    assert summary["pool_plans"]["p"]["step_model"]["cuda_graph_max_tokens"] == 512


def _windowed(window: int | None, outputs: list[int]) -> tuple[pl.DataFrame, dict]:
    # Requests far apart, each decoding alone; no API-server terms, so only the windows differ.
    serving = {"api_server_us": 0, "tokenize_us_per_token": 0, "token_return_us": 0}
    if window is not None:
        serving["decode_window_steps"] = window
    frame = cast_to_schema(pl.DataFrame({"arrival_us": [2_000_000 * i for i in range(len(outputs))],
                                         "prompt_tokens": [100] * len(outputs), "output_tokens": outputs}),
                           source="test")
    cfg = from_dict(FleetConfig, {"model": "llama-3.1-8b", "gpu": "h100-sxm-80gb",
                                  "pools": [{"name": "p", "replicas": 1, "serving": serving}]}, "", source="test")
    out = replay_trace(LoadedTrace(frame, "test", "synthetic", None, "x", {}, 0), cfg)
    return out.requests, out.summary


def test_decode_windows_hold_a_last_token_to_its_windows_end():
    outputs = [3, 11, 21, 50]
    every_step, plain_summary = _windowed(None, outputs)
    windowed, summary = _windowed(10, outputs)
    assert windowed["ttft_us"].to_list() == every_step["ttft_us"].to_list()  # a prompt's step is not held
    step = every_step["tpot_us"].median()
    held = (windowed["e2e_us"] - every_step["e2e_us"]).to_list()
    # 3 tokens: 2 decode steps, held 8 more; 11 and 21 fill their windows; 50: 49 steps, held 1.
    assert held[1] == held[2] == 0
    assert held[0] == pytest.approx(8 * step, rel=1e-6) and held[3] == pytest.approx(step, rel=1e-6)
    assert windowed["tpot_us"][0] == pytest.approx(5 * every_step["tpot_us"][0], rel=0.05)
    assert summary["pool_plans"]["p"]["serving"]["decode_window_steps"] == 10
    assert "decode_window_steps" not in plain_summary["pool_plans"]["p"]["serving"]


def test_one_step_windows_are_every_step():
    plain, _ = _windowed(None, [3, 50])
    one, _ = _windowed(1, [3, 50])
    assert one.equals(plain)


def test_window_delay_counts_the_windows_missing_steps_at_the_replicas_median_step():
    output = np.array([1, 4, 5, 6, 4, 4])
    first = np.array([0, 0, 0, 0, 0, 0])
    finished = np.array([0, 300, 400, 500, -1, 3_000])  # request 4 unfinished; 5 on another replica
    replica = np.array([0, 0, 0, 0, 0, 1])
    got = window_delay_us(output, first, finished, replica, np.full(6, 4))
    # replica 0's time per output token: 100 for each; decode steps 3, 4, 5 of windows of 4 miss 1, 0, 3
    assert got.tolist() == [0, 100, 0, 300, 0, 1_000]
    assert window_delay_us(output, first, finished, replica, np.ones(6, np.int64)).tolist() == [0] * 6


def test_a_closed_loop_trace_refuses_decode_windows():
    with pytest.raises(ConfigError, match=r"pools\[0\]\.serving\.decode_window_steps: got 10, expected 1 with a "
                                          r"closed-loop trace"):
        from_dict(FleetConfig, {"trace": {"path": "t.jsonl", "closed_loop": True},
                                "pools": [{"name": "p", "replicas": 1, "serving": {"decode_window_steps": 10}}]},
                  "", source="test")


@pytest.mark.parametrize("value", [0, 2.5, "ten", True])
def test_decode_window_steps_must_be_a_whole_number_of_steps(value):
    with pytest.raises(ConfigError, match=r"pools\[0\]\.serving\.decode_window_steps: got"):
        from_dict(FleetConfig, {"pools": [{"name": "p", "replicas": 1, "serving": {"decode_window_steps": value}}]},
                  "", source="test")


def test_a_pool_without_decode_windows_keeps_its_config_shape():
    cfg = from_dict(FleetConfig, {"pools": [{"name": "p", "replicas": 1}]}, "", source="test")
    assert "decode_window_steps" not in cfg.to_dict()["pools"][0]["serving"]
