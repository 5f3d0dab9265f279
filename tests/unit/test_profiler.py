"""`llm-replay profile`: the no-PyTorch error (always tested), the per-GPU shapes, and a tiny CPU
profile that `calibrate --format generic` reads (skipped when PyTorch is not installed: CI does not
install the `profile` extra)."""

from __future__ import annotations

import csv
import sys

import pytest

from llm_replay.app import main
from replay.calibration.profiler import TINY_GRID, shapes_for
from replay.model.specs import get_model


def test_without_torch_the_error_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    out = tmp_path / "p.csv"
    assert main(["profile", "--model", "llama-3.1-8b", "--gpu-name", "h100-sxm-80gb", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "llm-replay: error: llm-replay profile needs PyTorch: pip install 'llm-replay[profile]'"
    assert not out.exists()


def test_shapes_are_the_per_gpu_shards_of_tensor_parallelism():
    m = get_model("llama-3.1-8b")
    s = shapes_for(m, 2)
    assert (s.layers, s.hidden, s.heads, s.kv_heads, s.head_dim, s.ffn, s.vocab) == (32, 4096, 16, 4, 128, 7168, 64128)
    big = shapes_for(get_model("llama-3.1-70b"), 8)
    assert (big.heads, big.kv_heads, big.ffn) == (8, 1, 3584)
    tiny = shapes_for(m, 1, tiny=True)
    assert tiny.layers == 2 and tiny.hidden == tiny.heads * tiny.head_dim and tiny.hidden < 1024


@pytest.mark.parametrize("argv, says", [
    (["--model", "mixtral-8x7b"], "profile times dense attention models only"),
    (["--model", "llama-3.1-8b", "--tp", "3"], "--tp 3: llama-3.1-8b has 32 attention heads"),
    (["--model", "llama-3.1-8b", "--repeats", "0"], "--repeats: got 0"),
    (["--model", "llama-3.1-8b", "--device", "tpu"], "--device: got 'tpu'"),
    (["--model", "llama-9b"], "unknown model 'llama-9b'"),
])
def test_bad_options_exit_2(tmp_path, capsys, argv, says):
    assert main(["profile", *argv, "--gpu-name", "h100-sxm-80gb", "--out", str(tmp_path / "p.csv")]) == 2
    assert says in capsys.readouterr().err


def test_tiny_cpu_profile_is_read_by_calibrate(tmp_path, capsys):
    pytest.importorskip("torch")
    out = tmp_path / "p.csv"
    assert main(["profile", "--model", "llama-3.1-8b", "--gpu-name", "h100-sxm-80gb", "--device", "cpu", "--tiny",
                 "--repeats", "2", "--out", str(out)]) == 0
    assert "a check of the profiler's pipeline only (calibrate refuses them)" in capsys.readouterr().out
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 2 * len(TINY_GRID)
    for r in rows:
        assert float(r["step_time_ms"]) > 0 and r["device"] == "cpu" and r["allreduce_measured"] == "False"
        assert int(r["decode_context_tokens"]) % max(1, int(r["decode_seqs"])) == 0
    assert {(int(r["prefill_tokens"]), int(r["decode_seqs"])) for r in rows} == {(p, d) for p, _, d, _ in TINY_GRID}
    # calibrate reads the CSV and refuses it at its first row: CPU timings are not a GPU's
    prof = tmp_path / "cal.yaml"
    assert main(["calibrate", str(out), "--format", "generic", "--model", "llama-3.1-8b", "--gpu", "h100-sxm-80gb",
                 "--tp", "1", "--folds", "3", "--out", str(prof)]) == 2
    assert "p.csv: row 1 (line 2), column 'device': got 'cpu'" in capsys.readouterr().err
    assert not prof.exists()


def test_tp_beyond_the_gpus_present_skips_the_all_reduce_and_says_so(tmp_path, capsys):
    pytest.importorskip("torch")
    out = tmp_path / "p.csv"
    assert main(["profile", "--model", "llama-3.1-8b", "--gpu-name", "cpu-test", "--device", "cpu", "--tiny",
                 "--tp", "2", "--repeats", "1", "--out", str(out)]) == 0
    assert "all-reduce not measured (--tp 2 needs 2 GPUs, found 0)" in capsys.readouterr().err
    assert {r["tensor_parallel_size"] for r in csv.DictReader(out.open())} == {"2"}


def test_cuda_without_a_gpu_is_exit_2(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    assert main(["profile", "--model", "llama-3.1-8b", "--gpu-name", "x", "--out", str(tmp_path / "p.csv")]) == 2
    assert "PyTorch sees no CUDA GPU" in capsys.readouterr().err
