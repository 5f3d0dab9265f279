"""The table backend: step times interpolated over measured steps instead of the roofline."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from common.errors import ConfigError
from replay.calibration.data import read_splitwise
from llm_replay.app import main
from replay.fleet.cluster import plan_pools
from replay.config import load_config
from replay.model.stepmodel import (
    BYTES_RATE,
    KV_BYTES_PER_TOKEN,
    KV_BYTES_RATE,
    NUM_PARAMS,
    TABLE_POINTS,
    step_time_us_nb,
    table_points,
    with_table,
)

SPLITWISE = Path(__file__).resolve().parents[1] / "fixtures" / "profiles" / "splitwise" / "perf_model.csv"


def _params(prefill, decode, ctx_ref=0.0):
    base = np.zeros(NUM_PARAMS)
    base[KV_BYTES_PER_TOKEN] = 1000.0
    base[BYTES_RATE] = base[KV_BYTES_RATE] = 1e9  # 1 us per 1,000 bytes: one token of context costs 1 us
    return with_table(base, prefill, decode, ctx_ref)


def test_interpolates_between_points_and_continues_the_end_segments():
    p = _params([(100, 1000.0), (1000, 4000.0), (4000, 10000.0)], [(1, 500.0), (8, 900.0)])
    step = lambda prefill, decode=0, ctx=0: int(step_time_us_nb(p, prefill, 0.0, 0, decode, ctx, 1))  # noqa: E731
    assert step(100) == 1000 and step(1000) == 4000 and step(4000) == 10000
    assert step(550) == 2500  # halfway between the first two points
    assert step(5000) == 12000  # the last segment continued: 2 us per token
    assert step(50) == 834  # the first segment continued below it, rounded up
    assert step(0, 1) == 500 and step(0, 8) == 900 and step(0, 4) == math.ceil(500 + 400 * 3 / 7)
    # decodes riding along a prefill count as one token each on the prefill table
    assert int(step_time_us_nb(p, 990, 0.0, 0, 10, 0, 11)) == 4000


def test_decode_context_beyond_the_measured_one_costs_the_kv_read():
    p = _params([(1, 1.0), (2, 2.0)], [(1, 500.0), (8, 900.0)], ctx_ref=1000.0)
    assert int(step_time_us_nb(p, 0, 0.0, 0, 1, 1000, 1)) == 500  # at the measured context
    assert int(step_time_us_nb(p, 0, 0.0, 0, 1, 3000, 1)) == 2500  # 2,000 tokens more: 2,000 us
    assert int(step_time_us_nb(p, 0, 0.0, 0, 8, 7800, 8)) == 900 - 200  # 200 tokens short of 8 x 1,000
    assert int(step_time_us_nb(p, 0, 0.0, 0, 8, 10, 8)) == 1  # never below 1 us


def test_table_points_take_medians_and_thin_to_the_limit():
    x = np.array([1, 1, 1, 2, 2, 3], float)
    y = np.array([10, 30, 20, 5, 7, 9], float)
    assert table_points(x, y) == [(1.0, 20.0), (2.0, 6.0), (3.0, 9.0)]
    many = np.arange(100, dtype=float)
    pts = table_points(many, many * 2)
    assert len(pts) == TABLE_POINTS and pts[0] == (0.0, 0.0) and pts[-1] == (99.0, 198.0)


def _fleet(tmp_path, step_model: str, extra: str = "") -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(
        "model: llama-2-70b\ngpu: h100-sxm-80gb\ntrace: {window: {end_s: 120}}\n"
        f"pools:\n  - {{replicas: 1, tensor_parallel_size: 4, step_model: {step_model}{extra}}}\n")
    return path


def test_measured_prefill_steps_come_back_exactly(tmp_path):
    """Built from the Splitwise profile, the table gives each measured prefill its median time."""
    cfg = load_config(_fleet(tmp_path, f"{{backend: table, table: {SPLITWISE}, table_format: splitwise}}"))
    params = plan_pools(cfg)[0].step_params
    m = read_splitwise(SPLITWISE, "llama-2-70b", "h100-sxm-80gb", 4)
    prefill = m.decode_seqs == 0
    for tokens in np.unique(m.prefill_tokens[prefill]):
        measured = np.median(m.step_us[prefill & (m.prefill_tokens == tokens)])
        assert int(step_time_us_nb(params, int(tokens), 0.0, 0, 0, 0, 1)) == math.ceil(measured)


def test_both_engines_replay_the_table_alike(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = _fleet(tmp_path, f"{{backend: table, table: {SPLITWISE}, table_format: splitwise}}")
    for engine in ("numba", "reference"):
        assert main(["run", "--config", str(config), "--out", engine, "-q", "--engine", engine]) == 0
    assert pl.read_parquet(tmp_path / "numba" / "requests.parquet").equals(
        pl.read_parquet(tmp_path / "reference" / "requests.parquet"))


@pytest.mark.parametrize(("step_model", "fragments"), [
    ("{backend: table}", ["step_model", "table", "needs a table"]),
    ("{table: x.csv}", ["step_model", "table", "'roofline'"]),
    ("{backend: lookup}", ["step_model.backend", "'lookup'", "'roofline' or 'table'"]),
    ("{backend: table, table: x.csv, table_format: vidur}", ["step_model.table_format", "'vidur'"]),
])
def test_bad_table_settings_are_config_errors(tmp_path, step_model, fragments):
    with pytest.raises(ConfigError) as err:
        load_config(_fleet(tmp_path, step_model))
    assert all(f in str(err.value) for f in fragments), str(err.value)


def test_a_table_without_decode_steps_names_the_file_and_what_is_missing(tmp_path):
    csv = tmp_path / "steps.csv"
    csv.write_text("prefill_tokens,decode_seqs,decode_context_tokens,step_time_ms\n"
                   + "".join(f"{n},0,0,{n / 1000:.3f}\n" for n in (128, 256, 512, 1024, 2048, 4096)))
    cfg = load_config(_fleet(tmp_path, "{backend: table, table: steps.csv}"))
    with pytest.raises(ConfigError) as err:
        plan_pools(cfg, "fleet.yaml")
    message = str(err.value)
    assert "pools[0].step_model.table" in message and "steps.csv" in message and "decode-only" in message


def test_a_missing_or_bad_table_file_names_the_config_key(tmp_path):
    cfg = load_config(_fleet(tmp_path, "{backend: table, table: nowhere.csv}"))
    with pytest.raises(ConfigError, match=r"fleet.yaml: pools\[0\].step_model.table: .*nowhere.csv: table file not found"):
        plan_pools(cfg, "fleet.yaml")
    (tmp_path / "bad.csv").write_text("prefill_tokens,decode_seqs,decode_context_tokens,step_time_ms\n128,0,0,fast\n")
    cfg = load_config(_fleet(tmp_path, "{backend: table, table: bad.csv}"))
    with pytest.raises(ConfigError, match=r"pools\[0\].step_model.table: .*bad.csv: row 1 \(line 2\), column "
                                          r"'step_time_ms': got 'fast'"):
        plan_pools(cfg, "fleet.yaml")


@pytest.mark.parametrize("key", ["per_step_overhead_us: 5000", "mfu: 0.4", "profile: splitwise", "knee_tokens: 2048",
                                 "moe_load_imbalance: 1.2"])
def test_roofline_keys_beside_a_table_are_refused(tmp_path, key):
    """The table's times replace the roofline's: a key it would silently ignore is an error."""
    with pytest.raises(ConfigError, match=rf"pools\[0\].step_model.{key.split(':')[0]}: not used by the table backend"):
        load_config(_fleet(tmp_path, f"{{backend: table, table: {SPLITWISE}, table_format: splitwise, {key}}}"))
    load_config(_fleet(tmp_path, f"{{backend: table, table: {SPLITWISE}, table_format: splitwise, mbu: 0.5}}"))


def test_the_table_backend_refuses_terms_it_does_not_have(tmp_path):
    cfg = load_config(_fleet(tmp_path, f"{{backend: table, table: {SPLITWISE}, table_format: splitwise}}",
                             ", engine: {enable_lora: true}"))
    with pytest.raises(ConfigError) as err:
        plan_pools(cfg, "fleet.yaml")
    assert "step_model.backend" in str(err.value) and "LoRA" in str(err.value)


def test_a_small_table_needs_only_two_sizes_of_each_kind(tmp_path):
    """Calibration needs six batch compositions to fit five coefficients; a table needs two points
    of each kind, and the error for fewer names what is missing, not the fit."""
    csv = tmp_path / "steps.csv"
    csv.write_text("prefill_tokens,decode_seqs,decode_context_tokens,step_time_ms\n"
                   "512,0,0,40\n2048,0,0,150\n0,1,600,20\n0,8,4800,24\n")
    cfg = load_config(_fleet(tmp_path, "{backend: table, table: steps.csv}"))
    params = plan_pools(cfg, "fleet.yaml")[0].step_params
    assert int(step_time_us_nb(params, 512, 0.0, 0, 0, 0, 1)) == 40_000
    assert int(step_time_us_nb(params, 0, 0.0, 0, 1, 600, 1)) == 20_000
    csv.write_text("prefill_tokens,decode_seqs,decode_context_tokens,step_time_ms\n512,0,0,40\n0,1,600,20\n")
    with pytest.raises(ConfigError) as err:
        plan_pools(load_config(_fleet(tmp_path, "{backend: table, table: steps.csv}")), "fleet.yaml")
    assert "1 distinct sizes of prefill-only steps" in str(err.value) and "coefficients" not in str(err.value)
