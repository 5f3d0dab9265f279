"""The real vLLM experiments of ../shared/measurements/vllm-s2r: loading and checking the files, the
models they name, the fleet (with overrides) and the rebuilt inference-perf workload."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from common.errors import ConfigError, UserError
from replay.fleet.cluster import plan_pools
from replay.model.hf.config import load_model
from replay.measured import STAGE_GAP_S, WHOLE_RUN, experiment_fleet, experiment_trace, load_experiments
from replay.measured.run import measure
from replay.measured.workload import prompt_lengths, stage_of
from replay.model.specs import get_model

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
DATA = SHARED / "measurements" / "vllm-s2r"
UNSAFE = {"x5-llama-2-70b-general", "x1-codellama-34b-general"}


@pytest.fixture(scope="module")
def experiments():
    if not DATA.is_dir():
        pytest.skip("no ../shared/measurements/vllm-s2r here")
    return {e.id: e for e in load_experiments(DATA)}


def test_all_17_load_with_their_models_and_figures(experiments):
    assert len(experiments) == 17
    sets = [e.set for e in experiments.values()]
    assert sets.count("trainval") == 13 and sets.count("validation") == 4
    assert {e.id for e in experiments.values() if e.unsafe} == UNSAFE
    for e in experiments.values():
        get_model(e.model)  # every model is known
        assert e.gpu == "h100-sxm-80gb"
        assert {"ttft_mean", "itl_mean", "e2e_mean"} <= set(e.measured[WHOLE_RUN])
        assert set(e.measured) == {WHOLE_RUN, *range(len(e.stages))}
        assert sum(s.requests for s in e.stages) == int(sum(s.rate_rps * s.duration_s for s in e.stages))
    assert experiments["60"].model == "llama-3.1-70b"  # the -Instruct tune, by its base's entry
    assert experiments["17"].model == "llama-4-scout-fp8" and experiments["17"].precision == "FP8"
    assert experiments["20260217"].num_gpu_blocks == 7463
    assert experiments["20260217"].output_tokens_counted(0) == pytest.approx(193.71533333)
    assert experiments["17"].output_tokens_counted(0) == 248  # no re-tokenised count: output_len
    assert experiments["66"].gpu_memory_utilization == 0.75 and experiments["66"].cpu_offload
    assert "CPU KV offload" in experiments["66"].not_modelled()[0]


def test_an_instruct_tune_reads_as_its_base_model():
    if not SHARED.is_dir():
        pytest.skip("no ../shared here")
    for folder, entry in (("llama-3.1-70b-instruct", "llama-3.1-70b"), ("llama-3.1-8b-instruct", "llama-3.1-8b")):
        read, catalog = load_model(SHARED / "models" / folder), get_model(entry)
        for name in ("total_params", "active_params", "num_layers", "hidden_size", "num_kv_heads", "head_dim",
                     "intermediate_size", "vocab_size", "default_weight_dtype"):
            assert getattr(read, name) == getattr(catalog, name), (folder, name)


def _copy(tmp_path: Path) -> Path:
    folder = tmp_path / "data"
    folder.mkdir()
    for name in ("experiments.csv", "ground_truth.csv"):
        shutil.copyfile(DATA / name, folder / name)
    return folder


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_a_model_outside_the_catalog_is_named_or_found_under_models(experiments, tmp_path):
    folder = _copy(tmp_path)
    _edit(folder / "experiments.csv", "01-ai/Yi-34B", "acme/Yi-34B-Chat")
    with pytest.raises(UserError) as err:
        load_experiments(folder)
    text = str(err.value)
    assert "experiments.csv: line 11 (exp_id 65): column model_hf: got 'acme/Yi-34B-Chat'" in text
    assert "--models" in text
    models = tmp_path / "models"
    (models / "yi-34b-chat").mkdir(parents=True)
    shutil.copyfile(SHARED / "models" / "yi-34b" / "config.json", models / "yi-34b-chat" / "config.json")
    found = {e.id: e for e in load_experiments(folder, models)}["65"]
    assert found.model == str((models / "yi-34b-chat" / "config.json").resolve())
    assert plan_pools(experiment_fleet(found))[0].model.total_params == get_model("yi-34b").total_params


@pytest.mark.parametrize("file, old, new, expected", [
    ("experiments.csv", "20260217,trainval,20260217-155451-llama-2-7b-tp1-codegen,meta-llama/Llama-2-7b-hf,H100,1",
     "20260217,trainval,20260217-155451-llama-2-7b-tp1-codegen,meta-llama/Llama-2-7b-hf,H100,one",
     "experiments.csv: line 14 (exp_id 20260217): column tp: got 'one', expected a whole number >= 1"),
    ("experiments.csv", "5;10,600;600,3000;6000", "5;10,600;600,3000;5000",
     "column stage_requests: got '3000;5000', expected int(rate x duration) = 6000 for stage 1"),
    ("ground_truth.csv", "17,trainval,-1,all,ttft_mean,62.7", "17,trainval,-1,all,ttft_mean,abc",
     "ground_truth.csv: line 2 (exp_id 17): column actual: got 'abc399"),
    ("ground_truth.csv", "17,trainval,-1,all,ttft_mean,", "17,trainval,2,all,ttft_mean,",
     "column stage: got '2', expected -1 (whole run) or a stage of the experiment (0..1)"),
])
def test_a_corrupted_row_names_file_line_column_value_and_expectation(experiments, tmp_path, file, old, new,
                                                                      expected):
    folder = _copy(tmp_path)
    _edit(folder / file, old, new)
    with pytest.raises(UserError, match="^" + str(folder).replace("\\", "\\\\") + "/") as err:
        load_experiments(folder)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_the_fleet_is_the_server_as_started_and_overrides_reach_any_pool_key(experiments):
    exp = experiments["62"]
    cfg = experiment_fleet(exp)
    pool = cfg.pools[0]
    assert (cfg.model, cfg.gpu, pool.replicas, pool.tensor_parallel_size) == ("mistral-nemo-12b", "h100-sxm-80gb", 1, 2)
    assert (pool.engine.max_num_batched_tokens, pool.engine.max_num_seqs, pool.engine.max_model_len) == (1024, 128, 4096)
    assert pool.engine.enable_prefix_caching and pool.engine.block_size == 16
    assert cfg.max_drain_s >= 30 * 24 * 3600  # every request runs to completion
    nested = experiment_fleet(exp, {"pools": {"vllm": {"step_model": {"mfu": 0.4}}}, "tick_s": 0.5})
    dotted = experiment_fleet(exp, {"pools.vllm.step_model.mfu": 0.4, "tick_s": 0.5})
    assert nested == dotted and nested.pools[0].step_model.mfu == 0.4 and nested.tick_s == 0.5
    assert nested.pools[0].engine == pool.engine  # the merge keeps the keys it does not name
    with pytest.raises(ConfigError, match=r"pools\[0\]\.step_model\.nosuch"):
        experiment_fleet(exp, {"pools.vllm.step_model.nosuch": 1})
    with pytest.raises(ConfigError, match="pools.other: no such pool"):
        experiment_fleet(exp, {"pools": {"other": {"replicas": 2}}})
    fp8 = plan_pools(experiment_fleet(experiments["17"]))[0]
    assert fp8.capacity.weight_dtype == "fp8"


def test_the_workload_is_rebuilt_stage_by_stage(experiments):
    exp = experiments["20260217"]  # 5 then 10 req/s for 600 s each; measured mean prompt 591.63
    frame = experiment_trace(exp).frame
    stage = stage_of(frame).to_numpy()
    assert np.bincount(stage).tolist() == [3000, 6000]
    assert frame["prompt_tokens"].mean() == pytest.approx(591.63, abs=0.005)
    assert (frame["output_tokens"] == 247).all()
    arrival = frame["arrival_us"].to_numpy() / 1e6
    first, second = arrival[stage == 0], arrival[stage == 1]
    assert first[-1] == pytest.approx(600.0, abs=1e-5)  # the gaps sum to the stage's duration
    assert first[0] > 0  # ConstantLoadTimer's first request comes one gap after the start
    assert second[-1] - (first[-1] + STAGE_GAP_S) == pytest.approx(600.0, abs=1e-5)
    assert second[0] > first[-1] + STAGE_GAP_S
    assert not np.array_equal(experiment_trace(exp, seed=1).frame["arrival_us"], frame["arrival_us"])
    nominal = experiment_trace(experiments["17"]).frame  # no measured mean: nominal 547 x 1.047
    assert nominal["prompt_tokens"].mean() == pytest.approx(547 * 1.047, abs=0.005)


def test_prefix_blocks_are_shared_as_vllm_would_see_them(experiments):
    exp = experiments["20260217"]
    trace = experiment_trace(exp)
    assert trace.prefix_block_tokens == 16
    frame = trace.frame.with_columns(stage_of(trace.frame))
    system, lengths = prompt_lengths(exp)
    assert system == 105  # 100 nominal tokens scaled by 591.63 / 566
    hashes = frame["prefix_hashes"].to_list()
    start = int(np.argmax(frame["stage"].to_numpy() == 1))
    for base in (0, start):  # request n of a stage sends prompt n mod 100
        assert hashes[base] == hashes[base + 100] == hashes[base + 200]
        assert len(hashes[base]) == int(frame["prompt_tokens"][base]) // 16
    assert hashes[0] == hashes[start]  # the same 100 prompts in every stage
    shared_blocks = system // 16
    for a, b in ((0, 1), (0, 9), (10, 19)):  # prompts of one group: only the system prompt's full blocks
        common = sum(x == y for x, y in zip(hashes[a], hashes[b]))
        assert common == shared_blocks and hashes[a][:shared_blocks] == hashes[b][:shared_blocks]
    flat = [set(hashes[p]) for p in range(100)]
    assert not flat[0] & flat[10] and not flat[9] & flat[99]  # other groups share nothing
    assert len(set().union(*flat)) == 10 * shared_blocks + sum(len(h) - shared_blocks for h in hashes[:100])


def test_itl_is_read_as_the_harness_read_it(experiments):
    exp = experiments["20260217"]  # the harness counted 193.7 of the 247 tokens in stage 0
    requests = pl.DataFrame({
        "status": ["finished"] * 2, "ttft_us": [10_000, 30_000], "e2e_us": [2_010_000, 2_030_000],
        "arrival_us": [1_000_000, 2_000_000], "finished_us": [3_010_000, 4_030_000],
        "prompt_tokens": [592, 591], "output_tokens": [247, 247], "stage": [0, 0],
    })
    got = measure(exp, requests, 0, {0: 0})
    assert got["ttft_mean"] == 20.0 and got["e2e_mean"] == 2020.0
    assert got["itl_mean"] == pytest.approx(2000.0 / (193.71533333 - 1))
    assert got["ttft_p90"] == pytest.approx(28.0)  # linear, as numpy
    assert got["throughput_req_s"] == pytest.approx(2 / 4.03)
    no_count = dataclasses.replace(exp, measured={})
    assert measure(no_count, requests, 0, {0: 0})["itl_mean"] == pytest.approx(2000.0 / 246)


def test_a_replay_gives_every_stage_its_figures_frames_and_span(experiments):
    from replay.measured import replay_experiment

    exp = experiments["62"]  # Mistral-NeMo-12B TP2 at 2.5 then 6 req/s: 5,100 requests
    result = replay_experiment(exp, {"pools.vllm.engine.max_num_seqs": 16})
    assert set(result.figures) == {WHOLE_RUN, 0, 1} and result.unfinished == 0
    assert [result.figures[s]["requests"] for s in (0, 1, WHOLE_RUN)] == [1500, 3600, 5100]
    assert result.requests["stage"].value_counts().sort("stage")["count"].to_list() == [1500, 3600]
    assert result.summary["pool_plans"]["vllm"]["tensor_parallel_size"] == 2
    assert result.ticks["pool"].unique().to_list() == ["vllm"]
    assert result.ticks["running"].max() == 16  # the override reached the engine (25 without it)
    (start0, last0), (start1, last1) = result.stage_spans_us[0], result.stage_spans_us[1]
    assert start0 == 0 and last0 == pytest.approx(600e6, abs=2) and start1 == last0 + STAGE_GAP_S * 1e6
    assert result.figures[1]["ttft_mean"] > 0 and result.figures[1]["itl_mean"] > 0
