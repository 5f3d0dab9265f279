"""`llm-replay calibrate --experiments DIR`: a request-level fit on a few real experiments (stages
cut short), its written fit and cross-validation, and its refusals (one line, exit 2, nothing
written)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
DATA = SHARED / "measurements" / "vllm-s2r"
# Llama-2-7B TP1 and Mistral-NeMo at TP2 and TP1: two models, both TP degrees, all terms pinned.
FEW = ("--only", "20260217", "--only", "62", "--only", "63")


@pytest.fixture
def data():
    if not DATA.is_dir():
        pytest.skip("no ../shared/measurements/vllm-s2r here")
    return DATA


def test_a_fit_on_a_few_experiments_writes_its_keys_and_held_out_errors(cli, data, tmp_path):
    out = tmp_path / "fit.yaml"
    got = cli("calibrate", "--experiments", data, *FEW, "--max-stage-s", "20", "--out", out)
    assert got.code == 0, got.err
    doc = yaml.safe_load(out.read_text())
    assert doc["format"] == "llm-replay-request-fit/1" and doc["gpu"] == "h100-sxm-80gb"
    assert set(doc["step_model"]) == {"mbu", "attention_mbu", "per_step_overhead_us", "per_seq_overhead_us",
                                      "allreduce_latency_us"}
    assert set(doc["serving"]) == {"api_server_us", "tokenize_us_per_token", "token_return_us"}
    assert [e["exp_id"] for e in doc["experiments"]] == ["62", "63", "20260217"]
    assert doc["cross_validation"]["folds"] == 2
    assert set(doc["cross_validation"]["error_pct"]) == {"62", "63", "20260217"}
    assert "MAPE leave-one-model-out (2 models)" in got.out and "step_model:" in got.out
    assert "iteration 1" in got.err


def test_experiments_that_cannot_pin_a_term_say_which_and_write_nothing(cli, data, tmp_path):
    out = tmp_path / "fit.yaml"
    got = cli("calibrate", "--experiments", data, "--only", "20260217", "--only", "63", "--only", "64",
              "--max-stage-s", "20", "--no-cv", "--out", out)
    assert got.code == 2
    assert got.err.count("\n") == 1 and "cannot pin step_model.allreduce_latency_us" in got.err
    assert "tensor_parallel_size > 1" in got.err and "nothing written" in got.err
    assert not out.exists()


@pytest.mark.parametrize(("args", "message"), [
    (("profile.csv",), "takes no PROFILE.csv"),
    (("--model", "llama-2-7b"), "takes no PROFILE.csv, --model"),
    (("--only", "nope"), "--only nope: no experiment"),
    (("--max-stage-s", "0"), "--max-stage-s: got 0"),
    (("--only", "60", "--only", "61"), "needs experiments of at least two models (or --no-cv)"),
    (("--only", "60", "--no-cv"), "1 experiment cannot pin"),
])
def test_bad_request_level_arguments_are_one_line(cli, data, tmp_path, args, message):
    got = cli("calibrate", "--experiments", data, *args, "--out", tmp_path / "fit.yaml")
    assert got.code == 2 and message in got.err and got.err.count("\n") == 1
    assert not (tmp_path / "fit.yaml").exists()


def test_an_existing_out_is_not_replaced_without_force(cli, data, tmp_path):
    out = tmp_path / "fit.yaml"
    out.write_text("mine\n")
    got = cli("calibrate", "--experiments", data, *FEW, "--out", out)
    assert got.code == 2 and out.read_text() == "mine\n"


def test_step_times_still_need_model_and_gpu(cli, tmp_path):
    got = cli("calibrate", tmp_path / "p.csv", "--out", tmp_path / "x.yaml")
    assert got.code == 2 and "--model is required" in got.err
    got = cli("calibrate", "--out", tmp_path / "x.yaml")
    assert got.code == 2 and "give PROFILE.csv" in got.err


def test_one_model_at_one_tp_cannot_pin_the_all_reduce_apart_from_the_step_overhead(cli, data, tmp_path):
    out = tmp_path / "fit.yaml"
    got = cli("calibrate", "--experiments", data, "--only", "60", "--only", "61", "--max-stage-s", "20", "--no-cv",
              "--out", out)
    assert got.code == 2 and not out.exists()
    assert "cannot pin step_model.allreduce_latency_us apart from step_model." in got.err
