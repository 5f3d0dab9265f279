"""The Vidur kernel-profile fit (replay/calibration/vidur.py) and the `profile: vidur` defaults it writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from common.errors import ConfigError, UserError
from replay.calibration import vidur as cv
from replay.calibration.profiles import DEFAULTS_FILE, default_coefficients, step_coefficients
from replay.config import StepModelArgs
from replay.model.specs import get_gpu

OPS = cv.LAYER_OPS


def _write_mlp(path: Path, rows: list[dict[str, object]]) -> Path:
    cols = [*cv.SHAPE_COLUMNS, *(f"time_stats.{op}.median" for op in OPS)]
    lines = [",".join(cols)] + [",".join(str(r.get(c, "")) for c in cols) for r in rows]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def _synthetic_rows(gpu: str, mfu: float, mbu: float) -> list[dict[str, object]]:
    """A 4096-wide layer whose measured time is exactly the roofline at (mfu, mbu), split evenly over the ops."""
    spec = get_gpu(gpu)
    h, heads, kv, inter = 4096, 32, 8, 14336
    params = h * (heads + 2 * kv) * (h // heads) + h * h + 3 * h * inter
    rows = []
    for tp in (1, 2):
        for tokens in (1, 8, 64, 256, 512, 1024, 2048, 4096):
            t_s = max(2 * tokens * params / tp / (spec.bf16_flops * mfu), 2 * params / tp / (spec.hbm_bandwidth_bytes_per_s * mbu))
            row = {"n_head": heads, "n_kv_head": kv, "n_embd": h, "n_expanded_embd": inter, "use_gated_mlp": "True",
                   "num_tokens": tokens, "num_tensor_parallel_workers": tp}
            row.update({f"time_stats.{op}.median": t_s * 1e3 / len(OPS) for op in OPS})
            rows.append(row)
    return rows


def _write_all_reduce(path: Path, gpu: str, efficiency: float, intercepts: dict[int, float]) -> Path:
    """A Vidur all_reduce.csv whose times are exactly intercept(n) + ring traffic at `efficiency`,
    from 2 KiB to 64 MiB, plus a two-node row the fit must leave out."""
    link = get_gpu(gpu).interconnect_bytes_per_s
    lines = [",time_stats.all_reduce.median,rank,num_workers,size,collective,devices_per_node,max_devices_per_node"]
    for n, intercept_us in intercepts.items():
        for size in (2**11, 2**16, 2**20, 2**23, 2**24, 2**25, 2**26):
            ms = (intercept_us + size * 2 * (n - 1) / n / (link * efficiency) * 1e6) / 1000
            lines.append(f"{len(lines)},{ms},0,{n},{size},all_reduce,{n},8")
    lines.append(f"{len(lines)},99.0,0,16,{2**26},all_reduce,8,8")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def test_all_reduce_fit_recovers_the_link_efficiency(tmp_path):
    path = _write_all_reduce(tmp_path / "all_reduce.csv", "h100-sxm-80gb", 0.7, {2: 15.0, 4: 25.0, 8: 40.0})
    fit = cv.fit_all_reduce(path, "h100-sxm-80gb")
    assert fit.link_efficiency == pytest.approx(0.7, rel=1e-6)
    assert fit.intercept_us == pytest.approx({2: 15.0, 4: 25.0, 8: 40.0}, rel=1e-6)
    assert fit.points == {2: 4, 4: 4, 8: 4}  # 8 to 64 MiB; the two-node row is left out
    assert max(fit.mape_pct.values()) < 1e-6


def test_fit_recovers_known_efficiencies(tmp_path):
    path = _write_mlp(tmp_path / "m.csv", _synthetic_rows("h100-sxm-80gb", 0.62, 0.78))
    prof = cv.read_layer_profile(path, "h100-sxm-80gb", "x/y")
    fit = cv.fit_gpu([prof])
    assert fit.mfu == pytest.approx(0.62, abs=0.001)
    assert fit.mbu == pytest.approx(0.78, abs=0.001)
    assert all(e.fit_mape_pct < 0.2 for e in fit.errors)


def test_fit_weighs_each_group_and_is_not_trapped():
    # Two groups, one all memory-bound at mbu 0.5, one all compute-bound at mfu 0.8: the exact answer.
    c = np.array([1.0, 1.0, 100.0, 200.0])
    m = np.array([50.0, 60.0, 1.0, 1.0])
    y = np.array([100.0, 120.0, 125.0, 250.0])
    mfu, mbu = cv.fit_efficiencies(c, m, y)
    assert (mfu, mbu) == (pytest.approx(0.8, abs=0.001), pytest.approx(0.5, abs=0.001))


def test_bad_cell_names_file_row_and_column(tmp_path):
    rows = _synthetic_rows("a100-sxm-80gb", 0.6, 0.6)
    rows[2]["time_stats.mlp_act.median"] = "n/a"
    path = _write_mlp(tmp_path / "m.csv", rows)
    with pytest.raises(UserError, match=r"m\.csv: row 3 \(line 4\), column 'time_stats\.mlp_act\.median': got 'n/a'"):
        cv.read_layer_profile(path, "a100-sxm-80gb", "x/y")


def test_missing_column_and_missing_tree(tmp_path, capsys):
    path = tmp_path / "m.csv"
    path.write_text("num_tokens,num_tensor_parallel_workers\n1,1\n")
    with pytest.raises(UserError, match="missing column"):
        cv.read_layer_profile(path, "a100-sxm-80gb", "x/y")
    assert cv.main([str(tmp_path), "--out", str(tmp_path / "d.yaml")]) == 2
    assert "no data/profiling/compute/" in capsys.readouterr().err
    assert not (tmp_path / "d.yaml").exists()


def test_main_writes_a_defaults_file_the_lookup_reads(tmp_path):
    root = tmp_path / "vidur"
    _write_all_reduce(root / "data/profiling/network/a100_dgx/all_reduce.csv", "a100-sxm-80gb", 0.6, {2: 40.0, 8: 80.0})
    _write_mlp(root / "data/profiling/compute/a100/org/model-a/mlp.csv", _synthetic_rows("a100-sxm-80gb", 0.6, 0.7))
    _write_mlp(root / "data/profiling/compute/a100/org/model-b/mlp.csv", _synthetic_rows("a100-sxm-80gb", 0.6, 0.7))
    out = tmp_path / "defaults.yaml"
    assert cv.main([str(root), "--out", str(out)]) == 0
    doc = yaml.safe_load(out.read_text())
    sm = doc["gpus"]["a100-sxm-80gb"]["step_model"]
    assert (sm["mfu"], sm["mbu"]) == (pytest.approx(0.6, abs=0.001), pytest.approx(0.7, abs=0.001))
    assert sm["link_efficiency"] == 0.6
    assert len(doc["provenance"]["files_sha256"]) == 3
    assert {e["held_out_model_mape_pct"] for e in doc["gpus"]["a100-sxm-80gb"]["error"]} == {0.0}


def test_shipped_defaults_match_the_shared_data():
    """The shipped file is what the fit gives on ../shared/profiles/vidur (skipped where it is absent)."""
    vidur = Path(__file__).resolve().parents[3] / "shared" / "profiles" / "vidur"
    if not (vidur / "data").is_dir():
        pytest.skip("no ../shared/profiles/vidur here")
    shipped = yaml.safe_load(DEFAULTS_FILE.read_text())
    files = {str(p.relative_to(vidur)) for p, _, _ in cv.find_layer_profiles(vidur)}
    files |= {str(p.relative_to(vidur)) for p, _ in cv.find_all_reduce_profiles(vidur)}
    assert set(shipped["provenance"]["files_sha256"]) == files
    prof = [cv.read_layer_profile(p, g, m) for p, g, m in cv.find_layer_profiles(vidur) if g == "h100-sxm-80gb"]
    fit = cv.fit_gpu(prof)
    sm = shipped["gpus"]["h100-sxm-80gb"]["step_model"]
    assert (round(fit.mfu, 4), round(fit.mbu, 4)) == (sm["mfu"], sm["mbu"])
    for path, gpu in cv.find_all_reduce_profiles(vidur):
        assert round(cv.fit_all_reduce(path, gpu).link_efficiency, 3) == shipped["gpus"][gpu]["step_model"]["link_efficiency"]


def test_profile_vidur_takes_the_gpu_entry_and_keys_still_win():
    shipped = yaml.safe_load(DEFAULTS_FILE.read_text())["gpus"]
    got = step_coefficients(StepModelArgs(profile="vidur"), "llama-3.1-70b", "h100-sxm-80gb", 4, "cfg: pools[0].step_model")
    assert got["mfu"] == shipped["h100-sxm-80gb"]["step_model"]["mfu"]
    assert got["mbu"] == shipped["h100-sxm-80gb"]["step_model"]["mbu"]
    # Borrowed: an H200 takes the H100 fit; an A100 40GB the A100 80GB fit.
    assert default_coefficients("h200-sxm-141gb") == default_coefficients("h100-sxm-80gb")
    assert default_coefficients("a100-sxm-40gb")["mbu"] == shipped["a100-sxm-80gb"]["step_model"]["mbu"]
    over = step_coefficients(StepModelArgs(profile="vidur", mbu=0.5), "llama-3.1-70b", "h100-sxm-80gb", 4, "w")
    assert over["mbu"] == 0.5
    assert default_coefficients("no-such-gpu") is None
    with pytest.raises(ConfigError, match="no Vidur-fitted defaults for no-such-gpu"):
        step_coefficients(StepModelArgs(profile="vidur"), "llama-3.1-70b", "no-such-gpu", 4, "w")


def test_default_pools_get_the_fitted_link_efficiency_and_a_slower_link_slows_tp_steps():
    from replay.calibration.steps import step_shape
    from replay.model.stepmodel import LINK_BYTES_RATE, step_params, step_time_us_nb

    got = step_coefficients(StepModelArgs(), "llama-3.1-70b", "h100-sxm-80gb", 4, "w")
    shipped = yaml.safe_load(DEFAULTS_FILE.read_text())["gpus"]["h100-sxm-80gb"]["step_model"]
    assert got["link_efficiency"] == shipped["link_efficiency"] < 1.0
    shape = step_shape("llama-3.1-70b", "h100-sxm-80gb", 4)
    p = step_params(shape, **got)
    assert p[LINK_BYTES_RATE] == pytest.approx(450e9 * shipped["link_efficiency"])
    # A prefill of 4,096 tokens moves 80 layers x 2 all-reduces x 4096 x 8192 x 2 bytes x 1.5 per
    # GPU; halving the efficiency adds that traffic's time once more.
    half = step_params(shape, **{**got, "link_efficiency": got["link_efficiency"] / 2})
    traffic_us = 160 * 4096 * 8192 * 2 * 1.5 / p[LINK_BYTES_RATE] * 1e6
    slower = step_time_us_nb(half, 4096, 0.0, 0, 0, 0, 1) - step_time_us_nb(p, 4096, 0.0, 0, 0, 0, 1)
    assert slower == pytest.approx(traffic_us, abs=2)
    with pytest.raises(ValueError, match=r"link_efficiency: got 0, expected a value in \(0, 1\]"):
        StepModelArgs(link_efficiency=0)
    # borrowed only over the same kind of fabric: H200 (NVLink) takes H100's, L40S (PCIe) keeps 1.0
    assert default_coefficients("h200-sxm-141gb")["link_efficiency"] == shipped["link_efficiency"]
    assert "link_efficiency" not in default_coefficients("l40s-48gb")
    assert "link_efficiency" not in default_coefficients("mi300x-192gb")
    assert default_coefficients("l40s-48gb")["mfu"] == shipped["mfu"]


@pytest.mark.parametrize("gpu", ["a100-sxm-80gb", "a100-sxm-40gb", "l40s-48gb"])
def test_the_h100_request_fit_is_carried_to_the_campaigns_other_gpus(gpu):
    """A default A100 or L40S pool runs vLLM v0.15.1's host costs and bandwidth shares as the H100
    servers measured them (not the assumed 1 ms per step), and its own GPU's Vidur mfu."""
    from replay.calibration.profiles import default_source, request_fit

    fit = request_fit("h100-sxm-80gb")["step_model"]
    got = step_coefficients(StepModelArgs(), "llama-3.1-70b", gpu, 4, "w")
    for key in ("per_step_overhead_us", "per_seq_overhead_us", "allreduce_latency_us", "mbu", "attention_mbu",
                "expert_mbu"):
        assert got[key] == fit[key]
    assert got["per_step_overhead_us"] != default_coefficients(gpu)["per_step_overhead_us"]
    assert got["mfu"] == default_coefficients(gpu)["mfu"]  # the request fit pins no mfu: the GPU's own stays
    assert "h100-sxm-80gb request-level fit" in default_source(gpu)
    # a pool's own keys still win over the carried fit
    assert step_coefficients(StepModelArgs(per_step_overhead_us=500), "llama-3.1-70b", gpu, 4, "w")[
        "per_step_overhead_us"] == 500


def test_gpus_outside_the_campaign_keep_their_vidur_defaults():
    got = step_coefficients(StepModelArgs(), "llama-3.1-8b", "h200-sxm-141gb", 1, "w")
    assert {k: got[k] for k in default_coefficients("h200-sxm-141gb")} == default_coefficients("h200-sxm-141gb")
    assert got["attention_mbu"] is None
