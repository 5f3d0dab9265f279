"""Speculative decoding and multi-LoRA in the engines (both, compared) and in fleet configs: a
verify step advances a request by its expected tokens; a step holds at most max_loras adapters
and loads a missing one; bad keys are one-line config errors naming the key."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

from common.errors import ConfigError
from replay.engine.common import FINISHED
from replay.engine.reference.engine import ReferenceEngine
from replay.engine.numba_engine import NumbaEngine
from tests.strategies import engine_inputs, make_inputs, run_to_end


def _run(cls, inputs):
    engine = cls(inputs)
    run_to_end(engine)
    return engine


def _both(inputs):
    a, b = _run(NumbaEngine, inputs), _run(ReferenceEngine, inputs)
    ra, rb = a.request_columns(), b.request_columns()
    for name in ra:
        np.testing.assert_array_equal(ra[name], rb[name], err_msg=name)
    np.testing.assert_array_equal(a.snapshot(10**12), b.snapshot(10**12))
    return a


def test_speculation_takes_fewer_steps_and_emits_every_output_token():
    plain = _both(make_inputs([0], [10], [101], kv_blocks=(64,)))
    spec = _both(make_inputs([0], [10], [101], kv_blocks=(64,), spec=[(4, 0.7)]))
    steps = {name: int(e.replica_state()["steps"][0]) for name, e in (("plain", plain), ("spec", spec))}
    assert steps["plain"] == 101  # one prefill step, then 100 decode steps
    # 100 tokens at (1 - 0.7^5) / 0.3 = 2.77 per verify step: 37 steps (the last one shortened).
    assert steps["spec"] == 1 + 37
    for e in (plain, spec):
        assert int(e.request_columns()["generated"][0]) == 101
        assert int(e.replica_state()["output_tokens"][0]) == 101


def test_speculation_with_zero_acceptance_still_emits_one_token_per_step_but_pays_for_drafts():
    plain = _both(make_inputs([0], [10], [50]))
    spec = _both(make_inputs([0], [10], [50], spec=[(3, 0.0)]))
    assert spec.replica_state()["steps"][0] == plain.replica_state()["steps"][0] == 50
    assert spec.request_columns()["finished_us"][0] > plain.request_columns()["finished_us"][0]


def test_a_step_holds_at_most_max_loras_adapters_and_loads_a_miss():
    # Three requests at t=0 with adapters 0, 1, 2 on a replica with two slots: the third waits for
    # a slot; a fourth with adapter 0 joins the running batch meanwhile (it needs no new slot).
    kw = dict(adapter=[0, 1, 2, 0], lora_slots=(2,), max_num_seqs=(8,), max_batched=(512,), kv_blocks=(80,))
    loaded = _both(make_inputs([0, 0, 0, 0], [20, 20, 20, 20], [30, 30, 5, 5], lora_load_us=(5000,), **kw))
    free = _both(make_inputs([0, 0, 0, 0], [20, 20, 20, 20], [30, 30, 5, 5], lora_load_us=(0,), **kw))
    cols = loaded.request_columns()
    assert cols["first_scheduled_us"][0] == cols["first_scheduled_us"][1] == cols["first_scheduled_us"][3] == 0
    assert cols["first_scheduled_us"][2] >= min(cols["finished_us"][0], cols["finished_us"][1])
    # Two adapters loaded at the first step, one later: the load time is on the clock.
    assert loaded.request_columns()["first_token_us"][0] - free.request_columns()["first_token_us"][0] == 2 * 5000
    off = _both(make_inputs([0, 0, 0, 0], [20, 20, 20, 20], [30, 30, 5, 5], adapter=[0, 1, 2, 0]))
    assert off.request_columns()["first_scheduled_us"][2] == 0  # no LoRA pool: adapters are ignored


def _fleet(tmp_path, engine_yaml: str, model="llama-3.1-8b", step_model=""):
    from replay.fleet.cluster import plan_pools
    from replay.config import load_config

    path = tmp_path / "fleet.yaml"
    path.write_text(f"model: {model}\ngpu: h100-sxm-80gb\npools:\n  - replicas: 1\n    tensor_parallel_size: 8\n"
                    f"    engine:\n{engine_yaml}{step_model}")
    return plan_pools(load_config(path), str(path))


def test_fleet_config_reaches_the_step_model_and_the_memory_fit(tmp_path):
    from replay.model import stepmodel as sm

    base = _fleet(tmp_path, "      max_num_seqs: 64\n")[0]
    spec = _fleet(tmp_path, "      speculative_config:\n        method: draft_model\n        model: llama-3.1-8b\n"
                            "        num_speculative_tokens: 4\n        acceptance_rate: 0.7\n",
                  model="llama-3.1-70b")[0]
    assert spec.step_params[sm.SPEC_DRAFT_PASSES] == 4 and spec.terms.spec_k == 4
    assert spec.terms.spec_credit[-1] == round((1 - 0.7**5) / 0.3 * 1e6)
    assert spec.capacity.extra_weights_bytes_per_gpu == pytest.approx(16.06e9 / 8, rel=0.01)
    eagle = _fleet(tmp_path, "      speculative_config: {method: eagle, num_speculative_tokens: 3, "
                             "acceptance_rate: 0.8}\n")[0]
    assert eagle.capacity.kv_blocks < base.capacity.kv_blocks  # the head's weights and its layer of KV
    lora = _fleet(tmp_path, "      enable_lora: true\n      max_loras: 4\n      max_lora_rank: 64\n")[0]
    assert lora.terms.lora_slots == 4 and lora.step_params[sm.LORA_BYTES_PER_ADAPTER] == pytest.approx(109.05e6 / 8,
                                                                                                         rel=1e-3)
    assert lora.capacity.extra_weights_bytes_per_gpu == pytest.approx(4 * 109.05e6 / 8, rel=1e-3)
    assert lora.terms.lora_load_us == round(109.05e6 / 8 / 64e9 * 1e6 + 0.5)
    ep = _fleet(tmp_path, "      enable_expert_parallel: true\n", model="mixtral-8x7b",
                step_model="    step_model: {moe_load_imbalance: 1.16}\n")[0]
    tp = _fleet(tmp_path, "      max_num_seqs: 256\n", model="mixtral-8x7b")[0]
    assert ep.step_params[sm.A2A_US_PER_TOKEN] > 0 == tp.step_params[sm.A2A_US_PER_TOKEN]
    assert ep.step_params[sm.FLOPS_PER_TOKEN] > tp.step_params[sm.FLOPS_PER_TOKEN]


@pytest.mark.parametrize(("engine_yaml", "model", "step_model", "expected"), [
    ("      quantization: int3\n", "llama-3.1-8b", "", "pools[0].engine.quantization: got 'int3'"),
    ("      max_lora_rank: 12\n", "llama-3.1-8b", "", "pools[0].engine.max_lora_rank: got 12"),
    ("      max_loras: 0\n", "llama-3.1-8b", "", "pools[0].engine.max_loras: got 0"),
    ("      speculative_config: {method: eagle, num_speculative_tokens: 3}\n", "llama-3.1-8b", "",
     "pools[0].engine.speculative_config.acceptance_rate: got None"),
    ("      speculative_config: {method: medusa, num_speculative_tokens: 3, acceptance_rate: 0.5}\n", "llama-3.1-8b",
     "", "pools[0].engine.speculative_config.method: got 'medusa'"),
    ("      speculative_config: {method: ngram, num_speculative_tokens: 0, acceptance_rate: 0.5}\n", "llama-3.1-8b",
     "", "pools[0].engine.speculative_config.num_speculative_tokens: got 0"),
    ("      speculative_config: {model: llama-9b, num_speculative_tokens: 2, acceptance_rate: 0.5}\n",
     "llama-3.1-70b", "", "pools[0].engine.speculative_config.model: unknown model 'llama-9b'"),
    ("      enable_expert_parallel: true\n", "llama-3.1-8b", "", "pools[0].engine.enable_expert_parallel: llama-3.1-8b"),
    ("      max_num_seqs: 8\n", "mixtral-8x7b", "    step_model: {moe_load_imbalance: 1.2}\n",
     "pools[0].step_model.moe_load_imbalance: applies under engine.enable_expert_parallel only"),
    ("      max_num_seqs: 8\n", "mixtral-8x7b", "    step_model: {moe_load_imbalance: 0.5}\n",
     "pools[0].step_model.moe_load_imbalance: got 0.5"),
])
def test_bad_step_term_keys_are_one_line_config_errors(tmp_path, engine_yaml, model, step_model, expected):
    with pytest.raises(ConfigError) as err:
        _fleet(tmp_path, engine_yaml, model=model, step_model=step_model)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_quantization_and_a_different_weight_dtype_conflict(tmp_path):
    from replay.fleet.cluster import plan_pools
    from replay.config import load_config

    path = tmp_path / "fleet.yaml"
    path.write_text("model: llama-3.1-8b\npools:\n  - weight_dtype: awq\n    engine: {quantization: fp8}\n")
    with pytest.raises(ConfigError, match=r"pools\[0\]\.engine\.quantization: 'fp8' loads fp8 weights but "
                                          r"weight_dtype is 'awq'"):
        plan_pools(load_config(path), str(path))
    path.write_text("model: llama-3.1-8b\npools:\n  - weight_dtype: fp8\n    engine: {quantization: fp8}\n")
    assert plan_pools(load_config(path), str(path))[0].capacity.weight_dtype == "fp8"


def test_a_bad_step_term_exits_2_from_the_cli(tmp_path, capsys):
    from llm_replay.app import main

    path = tmp_path / "fleet.yaml"
    path.write_text("model: llama-3.1-8b\npools:\n  - engine: {max_lora_rank: 7}\n")
    assert main(["run", "--config", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "max_lora_rank: got 7" in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_readme_step_model_example_loads_and_plans(tmp_path):
    from pathlib import Path

    from replay.fleet.cluster import plan_pools
    from replay.config import load_config

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## The step model", 1)[1]
    example = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "fleet.yaml"
    path.write_text(example)
    (plan,) = plan_pools(load_config(path), str(path))
    assert plan.capacity.weight_dtype == "fp8" and plan.terms.spec_k == 3 and plan.terms.lora_slots == 4


@settings(max_examples=40)
@given(engine_inputs(max_requests=20))
def test_every_step_holds_at_most_max_loras_adapters_all_resident(inputs):
    """Checked after every step's scheduling in the reference engine (the numba engine is held
    to it by the differential test)."""

    class Checked(ReferenceEngine):
        def _start_step(self, rep, t):
            super()._start_step(rep, t)
            batch = {self._lora(r) for r in rep.running if r.scheduled} - {-1}
            assert len(batch) <= self.lora_slots[rep.pool]
            assert batch <= set(rep.lora_id)
            assert len(rep.lora_id) == self.lora_slots[rep.pool]

    engine = Checked(inputs)
    run_to_end(engine)
    cols = engine.request_columns()
    done = cols["state"] == FINISHED
    np.testing.assert_array_equal(cols["generated"][done], inputs.output_tokens[done])


def test_replica_model_counts_speculative_tokens_and_lora_adapters(tmp_path):
    """Planners see what the engines run: one request decoding alone on a speculative 70B replays
    at the inter-token latency the replica model promises at batch 1 (and faster than without
    speculation); LoRA steps cost more, never less."""
    import numpy as np

    from replay.fleet.cluster import replica_model
    from replay.config import load_config
    from replay.run import replay_trace
    from replay.validate import Workload, workload_trace

    spec_yaml = ("      max_num_seqs: 64\n      speculative_config:\n        method: draft_model\n"
                 "        model: llama-3.1-8b\n        num_speculative_tokens: 4\n        acceptance_rate: 0.7\n")
    base = replica_model(_fleet(tmp_path, "      max_num_seqs: 64\n", model="llama-3.1-70b")[0])
    spec = replica_model(_fleet(tmp_path, spec_yaml, model="llama-3.1-70b")[0])
    (seqs, _, itl_ms), (_, _, base_itl_ms) = spec.decode_tokens_per_s_at[0], base.decode_tokens_per_s_at[0]
    assert seqs == 1 and itl_ms < base_itl_ms  # at batch 1 speculation pays: the 70B's weights dominate
    one = Workload("static-batch", np.zeros(1, np.int64), np.array([1024]), np.array([257]), "one request")
    run = replay_trace(workload_trace(one, "one"), load_config(tmp_path / "fleet.yaml")).summary
    assert run["tpot_p50_ms"] == pytest.approx(itl_ms, rel=0.02)  # context 1,024-1,281 against 1,024
    lora = replica_model(_fleet(tmp_path, "      max_num_seqs: 64\n      enable_lora: true\n      max_loras: 4\n"
                                          "      max_lora_rank: 64\n", model="llama-3.1-70b")[0])
    for (_, t_lora, _), (_, t_base, _) in zip(lora.decode_tokens_per_s_at, base.decode_tokens_per_s_at, strict=True):
        assert t_lora < t_base
    assert lora.prefill_tokens_per_s < base.prefill_tokens_per_s
