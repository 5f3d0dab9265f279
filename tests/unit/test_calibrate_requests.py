"""The request-level fit (replay/calibration/requests.py) on experiments whose replays are a known
closed form: it must find the parameters that made the measurements, say which terms the data
cannot pin, and cross-validate by model."""

from __future__ import annotations

import math

import pytest

from common.errors import UserError
from replay.calibration.requests import PARAMS, EngineMeans, Target, cross_validate, fit

TRUE = {"mbu": 0.72, "attention_mbu": 0.9, "per_step_overhead_us": 300.0, "per_seq_overhead_us": 12.0,
        "allreduce_latency_us": 9.0, "expert_mbu": 0.6}
START = {"mbu": 0.8, "attention_mbu": 0.8, "per_step_overhead_us": 500.0, "per_seq_overhead_us": 10.0,
         "allreduce_latency_us": 6.0}
LAG_MS = 7.0


def _means(keys: dict[str, float], weights_gb: float, kv_gb: float, seqs: int, layers: int, tp: int,
           experts_gb: float = 0.0) -> EngineMeans:
    """A decode step as the roofline prices it at fixed load, and TTFT as 2.5 steps (async scheduling)."""
    step_ms = (weights_gb / (3.35 * keys["mbu"]) + kv_gb / (3.35 * keys.get("attention_mbu", keys["mbu"]))
               + experts_gb / (3.35 * keys.get("expert_mbu", keys["mbu"]))
               + (keys["per_step_overhead_us"] + keys["per_seq_overhead_us"] * seqs
                  + 2 * layers * keys["allreduce_latency_us"] * math.log2(tp)) / 1000.0)
    ttft = 2.5 * step_ms
    return EngineMeans(ttft, ttft + 247 * step_ms, 248.0)


def _targets(shapes, truth=TRUE) -> list[Target]:
    out = []
    for i, (model, w, kv, seqs, layers, tp, *moe) in enumerate(shapes):
        experts = moe[0] if moe else 0.0
        m = _means(truth, w, kv, seqs, layers, tp, experts).metrics(LAG_MS)

        def replay(keys, w=w, kv=kv, seqs=seqs, layers=layers, tp=tp, experts=experts):
            return _means(keys, w, kv, seqs, layers, tp, experts)

        out.append(Target(f"e{i}", model, m, replay, prompt_tokens=600.0))
    return out


SHAPES = [("a", 13.5, 3.0, 10, 32, 1), ("a", 13.5, 20.0, 60, 32, 1), ("b", 24.0, 1.5, 12, 40, 1),
          ("c", 12.0, 0.5, 8, 40, 2), ("c", 12.0, 2.0, 30, 40, 2), ("d", 35.0, 1.0, 20, 80, 4),
          ("d", 35.0, 3.0, 50, 80, 4), ("b", 24.0, 6.0, 40, 40, 1), ("e", 8.0, 1.0, 10, 48, 2, 30.0),
          ("e", 8.0, 3.0, 30, 48, 2, 45.0)]


def test_the_fit_finds_the_parameters_that_made_the_measurements():
    got = fit(_targets(SHAPES), START, max_iterations=40)
    assert got.cost < 1e-6
    for p in PARAMS:
        assert got.step_model[p.name] == pytest.approx(TRUE[p.name], rel=0.05, abs=2.0), p.name
    total_us = got.serving["api_server_us"] + got.serving["tokenize_us_per_token"] * 600 + got.serving["token_return_us"]
    assert total_us == pytest.approx(LAG_MS * 1000, rel=0.01)


def test_a_term_that_follows_another_is_left_to_follow_it_when_the_data_cannot_pin_it():
    # every experiment reads its KV at the weights' rate: attention_mbu has nothing to tell apart
    same = {**TRUE, "attention_mbu": TRUE["mbu"]}
    flat = [(m, w + kv, 0.0, seqs, layers, tp) for m, w, kv, seqs, layers, tp, *_ in SHAPES]
    got = fit(_targets(flat, same), START, max_iterations=40)
    # and no MoE model among them: expert_mbu has nothing to pin it either
    assert "attention_mbu" not in got.step_model and got.unpinned == ["attention_mbu", "expert_mbu"]
    assert got.step_model["mbu"] == pytest.approx(TRUE["mbu"], rel=0.05)


def test_a_term_the_experiments_cannot_pin_is_named_and_nothing_is_fitted():
    tp1_only = [s for s in SHAPES if s[5] == 1]
    with pytest.raises(UserError, match=r"cannot pin step_model.allreduce_latency_us .*tensor_parallel_size > 1"):
        fit(_targets(tp1_only), START)


def test_too_few_experiments_for_the_terms_is_an_error():
    with pytest.raises(UserError, match="1 experiment"):
        fit(_targets(SHAPES[:1]), START)


def test_cross_validation_holds_out_each_model():
    cv = cross_validate(_targets(SHAPES), START, max_iterations=30)
    assert cv["folds"] == 5
    assert {r["model"] for r in cv["rows"]} == {"a", "b", "c", "d", "e"}
    assert len(cv["rows"]) == len(SHAPES)
    # the closed form is the truth for every model, so held-out dense models are predicted well too
    # (the MoE model's own fold cannot pin expert_mbu: see the next test)
    assert max(abs(e) for r in cv["rows"] if r["model"] != "e" for e in r["error_pct"].values()) < 2.0


def test_two_fixed_costs_per_step_on_one_model_at_one_tp_cannot_be_told_apart():
    # one model at TP4 only: the all-reduce latency is a fixed cost per step, as the per-step overhead
    one_model = [("d", 35.0, 1.0, 20, 80, 4), ("d", 35.0, 3.0, 50, 80, 4), ("d", 35.0, 6.0, 90, 80, 4)]
    with pytest.raises(UserError, match=r"cannot pin step_model.allreduce_latency_us apart from "
                                        r"step_model.per_step_overhead_us"):
        fit(_targets(one_model), START)


def test_the_experts_share_is_fitted_on_an_moe_model_and_followed_when_it_is_held_out():
    # the MoE model "e" alone pins expert_mbu: in-sample it is found; its fold cannot pin it, so
    # there it follows mbu and the held-out MoE model reads at the weights' share
    got = fit(_targets(SHAPES), START, max_iterations=40)
    assert got.step_model["expert_mbu"] == pytest.approx(TRUE["expert_mbu"], rel=0.05)
    cv = cross_validate(_targets(SHAPES), START, max_iterations=30)
    moe = [r for r in cv["rows"] if r["model"] == "e"]
    dense = [r for r in cv["rows"] if r["model"] != "e"]
    # experts read at mbu 0.72 instead of 0.6: the held-out MoE model reads fast
    assert all(r["error_pct"]["itl_mean"] < -5.0 for r in moe)
    assert max(abs(e) for r in dense for e in r["error_pct"].values()) < 2.0


def test_a_held_out_fold_reads_no_term_from_the_shipped_defaults():
    # A real replay fills a key its step model leaves out from the GPU's shipped defaults, and the
    # shipped expert_mbu is the in-sample fit, which saw the MoE model. Its fold cannot pin
    # expert_mbu, so the held-out MoE model must still read at the fold's mbu, not at that value.
    def with_defaults(t: Target) -> Target:
        def replay(keys, inner=t.replay):
            return inner({"expert_mbu": TRUE["expert_mbu"], **keys})
        return Target(t.name, t.model, t.measured, replay, t.prompt_tokens)

    cv = cross_validate([with_defaults(t) for t in _targets(SHAPES)], START, max_iterations=30)
    moe = [r for r in cv["rows"] if r["model"] == "e"]
    assert all(r["error_pct"]["itl_mean"] < -5.0 for r in moe)
