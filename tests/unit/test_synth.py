"""The synth generator (traces/synth): arrival rates and CVs as specified, lengths, ServeGen
files, system-prompt groups, and the errors a bad spec gets (issue 14 item 1)."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from common.errors import ConfigError
from traces.schema import TRACE_SCHEMA
from traces.synth import parse_spec, synthesize
from traces.synth.arrivals import weibull_shape

SERVEGEN = Path("/work/shared/traces/servegen")


def _spec(arrival: dict, duration_s: float = 3600, **workload) -> dict:
    return {"seed": 5, "duration_s": duration_s, "workloads": [{
        "name": "w", "arrival": arrival, "prompt": {"dist": "constant", "value": 100},
        "output": {"dist": "constant", "value": 10}, **workload}]}


def _trace(data: dict, base_dir=None):
    return synthesize(parse_spec(data, "spec.yaml"), base_dir, "spec.yaml")


def _gaps_s(frame: pl.DataFrame) -> np.ndarray:
    return np.diff(frame["arrival_us"].to_numpy()) / 1e6


@pytest.mark.parametrize(("arrival", "cv"), [
    ({"process": "poisson", "rate": 20}, 1.0),
    ({"process": "gamma", "rate": 20, "cv": 3.0}, 3.0),
    ({"process": "weibull", "rate": 20, "cv": 2.0}, 2.0),
    ({"process": "constant", "rate": 20}, 0.0),
])
def test_each_process_keeps_its_rate_and_cv(arrival, cv):
    # one long window, so the per-window rescaling does not cut the gaps' tails
    frame = _trace(_spec({**arrival, "window_s": 3600})).frame
    assert frame.height == pytest.approx(20 * 3600, rel=0.03)
    gaps = _gaps_s(frame)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, abs=0.15 * max(cv, 1))


def test_weibull_shape_inverts_its_cv():
    assert weibull_shape(1.0) == pytest.approx(1.0, rel=1e-6)  # the exponential
    assert weibull_shape(0.5) > 1 > weibull_shape(2.0)


def test_a_curve_a_diurnal_sinusoid_and_a_burst_shape_the_rate():
    frame = _trace(_spec({"rate": 10, "diurnal": {"amplitude": 0.5, "peak_s": 1800, "period_s": 3600},
                          "bursts": [{"at_s": 600, "duration_s": 60, "factor": 4}]})).frame
    per_min = np.bincount(frame["arrival_us"].to_numpy() // 60_000_000, minlength=60)
    assert per_min[30] == pytest.approx(600 * 1.5, rel=0.15)  # the peak
    assert per_min[59] == pytest.approx(600 * 0.5, rel=0.2)
    burst_base = 600 * (1 + 0.5 * np.cos(2 * np.pi * (630 - 1800) / 3600))
    assert per_min[10] == pytest.approx(4 * burst_base, rel=0.15)
    ramp = _trace(_spec({"curve": [[0, 0], [3600, 20]]})).frame
    first, second = np.bincount(ramp["arrival_us"].to_numpy() // 1_800_000_000, minlength=2)
    assert first == pytest.approx(9000, rel=0.1) and second == pytest.approx(27000, rel=0.1)


def test_lengths_follow_their_distributions(tmp_path):
    pl.DataFrame({"arrival_us": [0, 1, 2], "prompt_tokens": [7, 7, 9], "output_tokens": [3, 4, 5]}) \
        .write_parquet(tmp_path / "lens.parquet")
    data = _spec({"rate": 50}, duration_s=600)
    data["workloads"][0]["prompt"] = {"dist": "lognormal", "median": 1000, "sigma": 0.5, "max": 3000}
    data["workloads"][0]["output"] = {"dist": "empirical", "trace": "lens.parquet", "column": "prompt_tokens"}
    frame = _trace(data, tmp_path).frame
    assert np.median(frame["prompt_tokens"].to_numpy()) == pytest.approx(1000, rel=0.05)
    assert frame["prompt_tokens"].max() <= 3000
    assert set(frame["output_tokens"].unique()) == {7, 9}
    data["workloads"][0]["output"] = {"dist": "pmf", "values": {"5": 1, "50": 3}}
    out = _trace(data, tmp_path).frame["output_tokens"]
    assert (out == 50).mean() == pytest.approx(0.75, abs=0.03)


def test_labels_adapters_and_system_prompt_groups():
    frame = _trace(_spec({"rate": 20}, duration_s=600, tenant="acme", priority=2, adapters=["a", "b"],
                         adapter_share=0.5, system_prompt={"tokens": 64, "groups": 2, "share": 0.5})).frame
    assert list(frame.columns) == list(TRACE_SCHEMA)
    assert set(frame["tenant"]) == {"acme"} and set(frame["priority"]) == {2}
    assert frame["adapter"].null_count() / frame.height == pytest.approx(0.5, abs=0.05)
    grouped = frame.filter(pl.col("prefix_hashes").is_not_null())
    assert grouped.height / frame.height == pytest.approx(0.5, abs=0.05)
    assert (grouped["prompt_tokens"] == 164).all()
    heads = grouped["prefix_hashes"].list.head(4)  # 64 tokens = 4 blocks of 16 from the group
    assert heads.n_unique() == 2
    tails = grouped["prefix_hashes"].list.get(4)
    assert tails.n_unique() == grouped.height  # the question's blocks are each request's own


@pytest.mark.skipif(not SERVEGEN.is_dir(), reason="shared ServeGen data absent")
def test_servegen_clients_follow_their_windows():
    folder = SERVEGEN / "reason" / "deepseek-r1"
    frame = _trace({"seed": 1, "duration_s": 86400, "workloads": [
        {"name": "r1", "servegen": {"path": str(folder), "clients": ["0"]}}]}).frame
    with gzip.open(folder / "chunk-0-trace.csv.gz", "rt") as fh:
        expected = sum(float(line.split(",")[1]) * 600 for line in fh)
    assert frame.height == pytest.approx(expected, rel=0.02)
    assert set(frame["tenant"]) == {"client-0"}
    assert frame["prompt_tokens"].mean() > 100  # from its dataset.json PMFs


def test_a_servegen_file_of_the_wrong_shape_names_file_and_line(tmp_path):
    (tmp_path / "chunk-3-trace.csv").write_text("0,1.0,1.0,Gamma,1.0,1.0\n600,1.0,Gamma,1.0\n")
    data = {"duration_s": 600, "workloads": [{"name": "x", "servegen": {"path": str(tmp_path)},
                                              "prompt": {"dist": "constant", "value": 1},
                                              "output": {"dist": "constant", "value": 1}}]}
    with pytest.raises(ConfigError, match=r"chunk-3-trace.csv line 2: 4 fields, expected 6"):
        _trace(data)
    (tmp_path / "chunk-3-trace.csv").write_text("0,1.0,1.0,Poisson,1.0,1.0\n")
    with pytest.raises(ConfigError, match=r"line 1: pattern 'Poisson', expected Gamma, Weibull or empty"):
        _trace(data)


@pytest.mark.parametrize(("change", "message"), [
    ({"arrival": {"process": "gama", "rate": 1}}, "workloads[0].arrival.process: unknown 'gama' (did you mean 'gamma'?)"),
    ({"arrival": {"process": "gamma", "rate": 1, "cv": -1}}, "workloads[0].arrival.cv: got -1.0, expected a number > 0"),
    ({"arrival": {"process": "poisson", "rate": 0}}, "workloads[0].arrival.rate: got 0.0, expected requests/s > 0"),
    ({"prompt": {"dist": "lognorm", "median": 1, "sigma": 1}}, "did you mean 'lognormal'?"),
    ({"prompt": {"dist": "uniform", "low": 5, "high": 1}}, "workloads[0].prompt.low: got 5.0, expected <= high"),
    ({"arrival": {"process": "poisson", "rate": 1, "windw_s": 5}}, "unknown key 'workloads[0].arrival.windw_s' (did you mean 'window_s'?)"),
])
def test_bad_specs_name_the_key(change, message):
    data = _spec({"rate": 1})
    data["workloads"][0].update(change)
    with pytest.raises(ConfigError) as err:
        _trace(data)
    assert str(err.value).startswith("spec.yaml: ") and message in str(err.value)


def test_every_input_is_bounded():
    with pytest.raises(ConfigError, match=r"^spec.yaml: workloads\[0\].arrival: about .* more than max_requests=1,000"):
        _trace({**_spec({"rate": 10}), "max_requests": 1000})
    with pytest.raises(ConfigError, match="duration_s"):
        _trace(_spec({"rate": 1}, duration_s=1e9))
    with pytest.raises(ConfigError, match="window_s"):
        _trace(_spec({"rate": 1, "window_s": 1e-9}))


def test_think_time_survives_a_merge_and_is_checked():
    from traces.schema import cast_to_schema
    from traces.transforms import merge

    sessions = _trace({**_spec({"rate": 1}, duration_s=60, sessions={
        "turns": {"dist": "constant", "value": 3}, "think_s": {"dist": "constant", "value": 1}})}).frame
    plain = _trace(_spec({"rate": 1}, duration_s=60)).frame
    assert "think_time_us" not in plain.columns
    merged = merge([plain, sessions])
    assert merged["think_time_us"].drop_nulls().len() == sessions["think_time_us"].drop_nulls().len() > 0
    assert "think_time_us" not in merge([plain, plain]).columns  # other traces keep their shape
    with pytest.raises(Exception, match="think_time_us is negative"):
        cast_to_schema(sessions.drop("request_id").with_columns(pl.lit(-1).alias("think_time_us")))


def test_the_hash_count_is_bounded(monkeypatch):
    from traces.synth import hashes

    monkeypatch.setattr(hashes, "MAX_HASHES", 1000)
    with pytest.raises(ConfigError, match="^spec.yaml: prefix_block_tokens: 16 makes .* prompt blocks to hash"):
        _trace(_spec({"rate": 10}, duration_s=60, system_prompt={"tokens": 4000}))
