"""A pool's `gpu_memory_bytes` and `capacity --gpu-memory-bytes`: the memory KV capacity is sized
from, instead of the total CUDA reports for the GPU; summary.json says which one a pool used."""

from __future__ import annotations

import pytest

from replay.model.specs import get_gpu
from tests.e2e.conftest import read_run
from tests.e2e.test_cli_bad_input import _listing, check_usage_error

FLEET = ("model: llama-3.1-8b\ngpu: h100-sxm-80gb\npools:\n"
         "  - {name: real, replicas: 1}\n"
         "  - {name: lesson, replicas: 1, workloads: [none], gpu_memory_bytes: 80e9}\n"
         "split: {policy: by-workload}\n")


def test_pool_plans_show_each_pools_gpu_memory_and_kv_capacity(cli, write, tmp_path):
    write("fleet.yaml", FLEET)
    res = cli("run", "azure-conv-2023", "-c", "fleet.yaml", "--window", "0:30", "--out", "r", "--quiet")
    assert res.code == 0, res.err
    plans = read_run(tmp_path / "r").summary["pool_plans"]
    real, lesson = plans["real"], plans["lesson"]
    assert (real["gpu_memory_bytes"], real["gpu_memory_source"]) == (get_gpu("h100-sxm-80gb").cuda_total_bytes, "cuda")
    assert (lesson["gpu_memory_bytes"], lesson["gpu_memory_source"]) == (80_000_000_000, "override")
    # 0.9 x 5.06e9 bytes more per GPU: 34,700 more tokens of the 8B's 128 KiB each
    extra = 0.9 * (real["gpu_memory_bytes"] - 80e9) / 131_072
    assert real["kv_tokens_per_replica"] - lesson["kv_tokens_per_replica"] == pytest.approx(extra, abs=16)
    for plan in (real, lesson):
        assert plan["kv_tokens_per_replica"] == 16 * plan["kv_blocks_per_replica"]


def test_capacity_flag_matches_the_pool_key(cli, write, tmp_path):
    write("fleet.yaml", FLEET)
    assert cli("run", "azure-conv-2023", "-c", "fleet.yaml", "--window", "0:30", "--out", "r", "--quiet").code == 0
    lesson = read_run(tmp_path / "r").summary["pool_plans"]["lesson"]
    res = cli("capacity", "--model", "llama-3.1-8b", "--gpu", "h100-sxm-80gb", "--gpu-memory-bytes", "8e10", "--json")
    assert res.code == 0, res.err
    assert f'"kv_blocks": {lesson["kv_blocks_per_replica"]},' in res.out


@pytest.mark.parametrize(("value", "fragments"), [
    ("5", ["fleet.yaml", "pools[0].gpu_memory_bytes", "got 5", ">= 1e+09 and <= 1e+13 (bytes of memory per GPU)"]),
    ("1e14", ["pools[0].gpu_memory_bytes", "got 100000000000000.0"]),
    (".nan", ["pools[0].gpu_memory_bytes", "nan"]),
    ("80GB", ["pools[0].gpu_memory_bytes", "'80GB'", "a finite number"]),
    ("true", ["pools[0].gpu_memory_bytes", "True"]),
])
def test_a_bad_gpu_memory_bytes_is_one_line_and_writes_nothing(cli, write, tmp_path, value, fragments):
    write("fleet.yaml", f"model: llama-3.1-8b\npools:\n  - {{name: a, replicas: 1, gpu_memory_bytes: {value}}}\n")
    before = _listing(tmp_path)
    res = cli("run", "azure-conv-2023", "-c", "fleet.yaml", "--window", "0:30", "--out", "r", "--quiet")
    check_usage_error(res, fragments, before, tmp_path)


def test_a_gpu_memory_too_small_for_the_weights_says_so(cli, write, tmp_path):
    write("fleet.yaml", "model: llama-3.1-8b\npools:\n  - {name: a, replicas: 1, gpu_memory_bytes: 16e9}\n")
    before = _listing(tmp_path)
    res = cli("run", "azure-conv-2023", "-c", "fleet.yaml", "--window", "0:30", "--out", "r", "--quiet")
    check_usage_error(res, ["pools[0] (a)", "does not fit", "(0.9 x 16 GB)"], before, tmp_path)
