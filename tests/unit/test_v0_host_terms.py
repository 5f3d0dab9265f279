"""vLLM V0's host terms (`serving: {engine_version: v0, v0_step_us, v0_seq_us}`, replay/model/serving.py),
the Lambda V0 scenario set they are fitted on and the fit's cross-validation (replay/calibration/v0.py)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from common.configtools import from_dict
from common.errors import ConfigError
from replay.calibration.v0 import fit_v0, score, with_v0_terms
from replay.cli.validate import scenario_path
from replay.config import FleetConfig, ServingArgs
from replay.model import serving
from replay.model.serving import serving_terms, with_host_terms
from replay.model.stepmodel import NUM_PARAMS, SEQ_OVERHEAD_US, STEP_OVERHEAD_US
from replay.run import replay_trace
from replay.validate import Row, load_scenarios
from traces import LoadedTrace, cast_to_schema


def test_a_v1_pool_has_no_host_terms_and_its_params_are_untouched():
    terms = serving_terms(ServingArgs())
    assert terms.engine_version == "v1" and terms.v0_step_us == terms.v0_seq_us == 0
    params = np.arange(NUM_PARAMS, dtype=np.float64)
    assert with_host_terms(params, terms) is params
    assert "engine_version" not in terms.to_dict()


def test_a_v0_pool_adds_its_terms_to_every_steps_overheads():
    terms = serving_terms(ServingArgs(engine_version="v0", v0_step_us=300.0, v0_seq_us=7.0))
    params = np.zeros(NUM_PARAMS)
    params[STEP_OVERHEAD_US], params[SEQ_OVERHEAD_US] = 1000.0, 10.0
    out = with_host_terms(params, terms)
    assert (out[STEP_OVERHEAD_US], out[SEQ_OVERHEAD_US]) == (1300.0, 17.0)
    assert (params[STEP_OVERHEAD_US], params[SEQ_OVERHEAD_US]) == (1000.0, 10.0)  # a copy
    assert terms.to_dict()["engine_version"] == "v0" and terms.to_dict()["v0_seq_us"] == 7.0


def test_a_v0_pool_without_its_terms_takes_the_fitted_defaults():
    terms = serving_terms(ServingArgs(engine_version="v0"))
    assert (terms.v0_step_us, terms.v0_seq_us) == (serving.DEFAULT_V0_STEP_US, serving.DEFAULT_V0_SEQ_US)


@pytest.mark.parametrize(("serving_keys", "message"), [
    ({"engine_version": "v2"}, r"serving\.engine_version: got 'v2', expected v0 or v1"),
    ({"v0_step_us": 100}, r"serving\.v0_step_us: got 100\.0, expected it only with engine_version: v0"),
    ({"engine_version": "v1", "v0_seq_us": 5}, r"serving\.v0_seq_us: got 5\.0, expected it only with engine_version"),
    ({"engine_version": "v0", "v0_seq_us": -1}, r"serving\.v0_seq_us: got -1"),
])
def test_bad_v0_keys_name_the_key_and_what_was_expected(serving_keys, message):
    with pytest.raises(ConfigError, match=r"pools\[0\]\." + message):
        from_dict(FleetConfig, {"pools": [{"name": "p", "replicas": 1, "serving": serving_keys}]}, "", source="test")


def test_a_pool_without_v0_keys_keeps_its_config_shape():
    cfg = from_dict(FleetConfig, {"pools": [{"name": "p", "replicas": 1}]}, "", source="test")
    assert not {"engine_version", "v0_step_us", "v0_seq_us"} & set(cfg.to_dict()["pools"][0]["serving"])


def _replay(serving_keys: dict) -> tuple[pl.DataFrame, dict]:
    frame = cast_to_schema(pl.DataFrame({"arrival_us": [0] * 8, "prompt_tokens": [100] * 8,
                                         "output_tokens": [40] * 8}), source="test")
    cfg = from_dict(FleetConfig, {"model": "llama-3.1-8b", "gpu": "h100-sxm-80gb",
                                  "pools": [{"name": "p", "replicas": 1, "serving": serving_keys}]}, "", source="test")
    out = replay_trace(LoadedTrace(frame, "test", "synthetic", None, "x", {}, 0), cfg, engine="reference")
    return out.requests, out.summary


def test_v0_host_time_lengthens_every_step_by_its_terms():
    v1, _ = _replay({})
    v0, summary = _replay({"engine_version": "v0", "v0_step_us": 500, "v0_seq_us": 10})
    # 8 sequences decode together: each step 500 + 8 x 10 us longer.
    assert (v0["tpot_us"] - v1["tpot_us"]).to_list() == pytest.approx([580.0] * 8, abs=2)
    assert summary["pool_plans"]["p"]["serving"]["v0_step_us"] == 500.0


def test_the_lambda_v0_set_loads_and_leaves_the_published_rows_out():
    scenarios = load_scenarios(scenario_path("lambda-v0"))
    published = load_scenarios(scenario_path("published"))
    held_out = {s.source.split(":")[1].strip() for s in published if s.name.startswith("lambda")}
    assert len(scenarios) >= 6 and len({str(s.fleet.model) for s in scenarios}) >= 2
    for s in scenarios:
        assert all(p.serving.engine_version == "v0" and p.serving.decode_window_steps == 10 for p in s.fleet.pools)
        assert "a4f9f4371a1ccac781293837fce2bce0cc6d25cc" in s.source
        assert not any(f in s.source for f in ("Meta-Llama-3-8B-Instruct_tp1_len2048",) + tuple(held_out))


def _row(scenario: str, group: str, err: float) -> Row:
    return Row(scenario, "w", f"{group}_p50_ms", group, 1.0, 1.0 + err / 100, err, 20.0, True, "", "src")


def test_the_fit_takes_the_best_point_and_cross_validates_by_model():
    class Fake:  # a scenario's name and model are all the fit reads of it
        def __init__(self, name, model):
            self.name, self.fleet = name, type("F", (), {"model": model})()

    fakes = [Fake("a1", "m1"), Fake("a2", "m1"), Fake("b1", "m2")]
    # m1's scenarios fit best at (100, 0); m2's at (200, 0); together (100, 0) wins (two rows to one).
    errors = {(100.0, 0.0): [1.0, 1.0, 9.0], (200.0, 0.0): [9.0, 9.0, 1.0], (0.0, 0.0): [20.0, 20.0, 20.0]}
    grid = {p: [[_row(f.name, "tpot", e)] for f, e in zip(fakes, errs)] for p, errs in errors.items()}
    fit = fit_v0(fakes, grid)
    assert (fit.step_us, fit.seq_us) == (100.0, 0.0)
    assert fit.cv_points == {"m1": (200.0, 0.0), "m2": (100.0, 0.0)}
    assert fit.cv_mape["tpot"] == pytest.approx((9 + 9 + 9) / 3)  # each model at the other's point
    assert fit.mape_zero["tpot"] == pytest.approx(20.0)
    assert score([_row("x", "ttft", 10.0), _row("x", "tpot", 2.0), _row("y", "tpot", 4.0)]) == pytest.approx(6.5)


def test_the_fit_needs_two_models():
    class Fake:
        name, fleet = "a", type("F", (), {"model": "m"})()

    with pytest.raises(ValueError, match="needs scenarios of 2 models or more"):
        fit_v0([Fake()], {(0.0, 0.0): [[_row("a", "tpot", 1.0)]]})


def test_with_v0_terms_sets_only_the_v0_pools():
    s = load_scenarios(scenario_path("lambda-v0"))[0]
    got = with_v0_terms(s, 250.0, 5.0)
    assert [(p.serving.v0_step_us, p.serving.v0_seq_us) for p in got.fleet.pools] == [(250.0, 5.0)]
    assert s.fleet.pools[0].serving.v0_step_us is None


def test_v0_host_terms_need_the_roofline():
    with pytest.raises(ConfigError, match=r"pools\[0\]\.serving\.engine_version: got 'v0' with step_model\.backend "
                                          r"table"):
        from_dict(FleetConfig, {"pools": [{"name": "p", "replicas": 1, "serving": {"engine_version": "v0"},
                                           "step_model": {"backend": "table", "table": "t.csv"}}]}, "", source="test")
