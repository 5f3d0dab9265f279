"""Calibration: the fit recovers coefficients from data the model itself generated, the CV error
is computed on held-out configurations, and bad profiles fail with the file, row and column."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import ConfigError, UserError
from replay.calibration import steps as cal
from replay.calibration.data import Measured, read_generic, read_splitwise
from replay.calibration.profiles import (
    PROFILES_DIR, gpu_defaults, profile_document, read_profile, step_coefficients, write_profile,
)
from replay.fleet.cluster import plan_pools
from replay.config import StepModelArgs, load_config
from replay.model.stepmodel import step_params, step_time_us_nb

TRUE = {"mfu": 0.55, "mbu": 0.7, "per_step_overhead_us": 3000.0, "per_seq_overhead_us": 150.0,
        "prefill_overhead_us": 5000.0}
KNEE = {**TRUE, "knee_tokens": 2048.0, "past_knee_mfu": 0.3}
HEADER = "prefill_tokens,prefill_seqs,decode_seqs,decode_context_tokens,step_time_ms\n"


def _shape(tp: int = 2):
    return cal.step_shape("llama-3.1-8b", "h100-sxm-80gb", tp)


def _grid() -> list[tuple[int, int, int, int]]:
    """Batch compositions a benchmark would sweep: prefills of 64..16k tokens, decodes of 1..256
    sequences at short and long contexts, and a few mixed steps."""
    rows = [(t, 1, 0, 0) for t in (64, 256, 1024, 4096, 16384)] + [(2048, 4, 0, 0)]
    rows += [(0, 0, b, b * ctx) for b in (1, 8, 32, 128, 256) for ctx in (500, 8000)]
    rows += [(512, 1, 32, 32 * 2000), (2048, 2, 64, 64 * 1000)]
    return rows


def _synthetic_csv(path: Path, coef: dict[str, float], noise: float = 0.0, tp: int = 2) -> Path:
    """A generic CSV whose step times come from the step model with `coef` (times ±noise)."""
    rng = np.random.default_rng(7)
    p = step_params(_shape(tp), **coef)
    lines = [HEADER]
    for pt, ps, ds, dctx in _grid():
        pairs = ps * (pt / ps) * (pt / ps + 1) / 2 if ps else 0.0
        us = step_time_us_nb(p, pt, pairs, 0, ds, dctx, ps + ds)
        for _ in range(2):  # two repetitions per configuration
            lines.append(f"{pt},{ps},{ds},{dctx},{us / 1000 * (1 + rng.uniform(-noise, noise)):.4f}\n")
    path.write_text("".join(lines))
    return path


def _fit(path: Path, tp: int = 2):
    m = read_generic(path, tp)
    t = cal.terms({tp: cal.unit_params(_shape(tp))}, m)
    return m, t, cal.fit(t, m.step_us)


@pytest.mark.parametrize("model", ["llama-3.1-70b", "mixtral-8x7b"])
@pytest.mark.parametrize("coef", [TRUE, KNEE], ids=["no knee", "knee"])
def test_terms_reproduce_the_kernel(coef, model):
    """`predict_us` (the fit's model) and `step_time_us_nb` (the engine's) are the same formula."""
    rng = np.random.default_rng(1)
    n = 200
    m = Measured(
        prefill_tokens=rng.integers(0, 5000, n).astype(float), prefill_pairs=np.zeros(n),
        prefill_ctx=rng.integers(0, 3000, n).astype(float), decode_seqs=rng.integers(0, 200, n).astype(float),
        decode_ctx=np.zeros(n), num_seqs=np.zeros(n), tp=np.full(n, 4), step_us=np.ones(n),
        column=np.full(n, "x", dtype=object), config=np.arange(n).astype(str).astype(object))
    m.prefill_pairs[:] = m.prefill_tokens * (m.prefill_ctx + (m.prefill_tokens + 1) / 2)
    m.decode_ctx[:] = m.decode_seqs * rng.integers(1, 9000, n)
    m.num_seqs[:] = (m.prefill_tokens > 0) + m.decode_seqs
    shape = cal.step_shape(model, "a100-sxm-80gb", 4)
    pred = cal.predict_us(cal.terms({4: cal.unit_params(shape, 6.0)}, m), coef)
    p = step_params(shape, allreduce_latency_us=6.0, **coef)
    for i in range(n):
        kernel = step_time_us_nb(p, m.prefill_tokens[i], m.prefill_pairs[i], m.prefill_ctx[i], m.decode_seqs[i],
                                 m.decode_ctx[i], m.num_seqs[i])
        assert kernel == max(1, math.ceil(pred[i]))


def test_fit_recovers_the_coefficients_that_generated_the_data(tmp_path):
    _, _, coef = _fit(_synthetic_csv(tmp_path / "exact.csv", TRUE))
    for key, value in TRUE.items():
        assert coef[key] == pytest.approx(value, rel=0.01, abs=1.0), key


def test_a_knee_in_the_data_is_found_where_it_is(tmp_path):
    """Steps past 2,048 tokens computing at mfu 0.3 instead of 0.55: the search puts the knee at
    2,048 and recovers both efficiencies. Exact data without a knee get none; noisy ones may get
    a mild one (18 configurations at 2% noise are not much to tell noise from a bend), which
    leaves both efficiencies within the noise of the truth."""
    m = read_generic(_synthetic_csv(tmp_path / "knee.csv", KNEE), 2)
    coef = cal.fit_knee(cal.terms({2: cal.unit_params(_shape())}, m), m.step_us, m.config)
    assert coef["knee_tokens"] == 2048
    for key, value in KNEE.items():
        assert coef[key] == pytest.approx(value, rel=0.01, abs=1.0), key
    m = read_generic(_synthetic_csv(tmp_path / "exact.csv", TRUE), 2)
    assert cal.fit_knee(cal.terms({2: cal.unit_params(_shape())}, m), m.step_us, m.config)["knee_tokens"] == 0
    m = read_generic(_synthetic_csv(tmp_path / "noisy.csv", TRUE, noise=0.02), 2)
    coef = cal.fit_knee(cal.terms({2: cal.unit_params(_shape())}, m), m.step_us, m.config)
    assert coef["mfu"] == pytest.approx(TRUE["mfu"], rel=0.06)
    assert coef["past_knee_mfu"] == pytest.approx(TRUE["mfu"], rel=0.06)


def test_the_knee_is_only_tried_where_measured_sizes_pin_it(tmp_path):
    """A knee needs two measured step sizes on each side. The grid's steps hold 1 to 2,112 tokens,
    then 4,096 and 16,384: 4,096 has one size above it, so 3,072 is the last position tried."""
    m = read_generic(_synthetic_csv(tmp_path / "plain.csv", TRUE), 2)
    got = cal.knee_candidates(cal.terms({2: cal.unit_params(_shape())}, m))
    assert got == [512, 768, 1024, 1536, 2048, 3072]


def test_fit_with_noise_stays_close_and_cv_error_is_near_the_noise(tmp_path):
    m, t, coef = _fit(_synthetic_csv(tmp_path / "noisy.csv", TRUE, noise=0.02))
    assert coef["mfu"] == pytest.approx(TRUE["mfu"], rel=0.05)
    assert coef["mbu"] == pytest.approx(TRUE["mbu"], rel=0.05)
    (err,) = cal.cross_validate(t, m, k=5, coef=coef)
    assert err.column == "step_time" and err.points == len(m)
    # uniform ±2% noise has a mean absolute error of 1%; held-out predictions stay close to it
    assert 0.5 < err.fit_mape_pct < 2.0 and err.fit_mape_pct <= err.cv_mape_pct < 3.0


def test_folds_keep_the_repetitions_of_a_configuration_together():
    config = np.array(["a", "b", "a", "c", "b", "d", "e", "a"], dtype=object)
    f = cal.folds(config, 3)
    for key in set(config):
        assert len(set(f[config == key])) == 1
    assert set(f) == {0, 1, 2}


def test_cv_error_of_a_perfect_model_is_zero(tmp_path):
    m, t, coef = _fit(_synthetic_csv(tmp_path / "exact.csv", TRUE))
    (err,) = cal.cross_validate(t, m, k=4, coef=coef)
    assert err.cv_mape_pct < 0.05 and err.noise_mape_pct < 0.05


def test_a_fit_that_does_not_converge_says_so(tmp_path):
    m = read_generic(_synthetic_csv(tmp_path / "exact.csv", TRUE), 2)
    t = cal.terms({2: cal.unit_params(_shape())}, m)
    with pytest.raises(cal.CalibrationError, match="did not converge in 1 iterations.*nothing written"):
        cal.fit(t, m.step_us, max_iterations=1)


BAD = {
    "missing column": (HEADER.replace(",step_time_ms", "") + "10,1,0,0\n",
                       ["bad.csv", "missing column(s) step_time_ms"]),
    "non-numeric": (HEADER + "10,1,0,0,1.5\n100,1,0,0,fast\n", ["bad.csv", "row 2 (line 3)", "'step_time_ms'",
                                                                  "'fast'", "expected a number"]),
    "negative": (HEADER + "-5,1,0,0,1.0\n", ["bad.csv", "row 1", "'prefill_tokens'", "non-negative"]),
    "zero time": (HEADER + "10,1,0,0,0\n", ["bad.csv", "row 1", "'step_time_ms'", "positive"]),
    "empty step": (HEADER + "0,0,0,0,1.0\n", ["bad.csv", "row 1", "both 0"]),
    "too few points": (HEADER + "".join(f"{t},1,0,0,{t / 100}\n" for t in (10, 20, 30)),
                       ["bad.csv", "3 distinct batch composition(s)", "at least 6"]),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_generic_csv_names_file_row_and_column(tmp_path, case):
    text, fragments = BAD[case]
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(UserError) as info:
        read_generic(path, 1)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_splitwise_reader_maps_names_and_leaves_out_what_the_readme_warns_about():
    path = Path(__file__).resolve().parents[1] / "fixtures" / "profiles" / "splitwise" / "perf_model.csv"
    m = read_splitwise(path, "llama-2-70b", "h100-sxm-80gb", 2)
    assert set(m.tp.tolist()) == {2} and set(m.column.tolist()) == {"prompt_time", "token_time"}
    assert m.excluded["tensor_parallel 2, batch_size 64: anomalous (memory exhaustion; the data's README, caveat 3)"] == 5
    assert m.excluded["hardware h100-80gb-pcap: derived from h100-80gb, not measured"] == 420
    # a decode step of batch 16 at prompt 512 reads 16 contexts of 512 + 64 tokens
    i = (m.column == "token_time") & (m.num_seqs == 16)
    assert np.all(m.decode_ctx[i] == pytest.approx(16 * (512 + 64), rel=0.01))
    with pytest.raises(UserError, match=r"no measured steps for llama-3.1-70b on h100-sxm-80gb at tensor_parallel 2; it "
                                        r"has llama-2-70b on a100-sxm-80gb \(TP 2, 4, 8\)"):
        read_splitwise(path, "llama-3.1-70b", "h100-sxm-80gb", 2)


def _profile(tmp_path: Path, model="llama-3.1-8b", gpu="h100-sxm-80gb", tp=1) -> Path:
    fits = [{"tensor_parallel_size": tp, "step_model": {**TRUE, "allreduce_latency_us": 6.0}, "points": 1,
             "error": []}]
    path = tmp_path / "prof.yaml"
    write_profile(path, profile_document(model, gpu, fits, {"source_file": "x.csv"}))
    return path


def test_profile_round_trips_and_keys_in_config_win(tmp_path):
    path = _profile(tmp_path)
    assert read_profile(path).fits[1]["mbu"] == TRUE["mbu"]
    got = step_coefficients(StepModelArgs(profile=str(path), mfu=0.3), "llama-3.1-8b", "h100-sxm-80gb", 1, "w")
    assert got["mfu"] == 0.3 and got["mbu"] == TRUE["mbu"] and got["prefill_overhead_us"] == 5000.0


def test_config_profile_path_is_relative_to_the_config_and_reaches_the_step_params(tmp_path):
    _profile(tmp_path)
    cfg_path = tmp_path / "fleet.yaml"
    cfg_path.write_text("model: llama-3.1-8b\ngpu: h100-sxm-80gb\npools:\n"
                        "  - {name: a, replicas: 1, step_model: {profile: prof.yaml}}\n")
    (plan,) = plan_pools(load_config(cfg_path), str(cfg_path))
    # CUDA graphs up to 512 tokens: vLLM's default for max_num_seqs 256
    assert np.array_equal(plan.step_params, step_params(_shape(1), allreduce_latency_us=6.0, **TRUE,
                                                        cuda_graph_max_tokens=512))


@pytest.mark.parametrize("pool", ["model: llama-2-7b",
                                  "gpu: a100-sxm-80gb", "tensor_parallel_size: 2"])
def test_a_profile_for_another_model_gpu_or_tp_is_a_config_error(tmp_path, pool):
    _profile(tmp_path)
    cfg_path = tmp_path / "fleet.yaml"
    cfg_path.write_text("model: llama-3.1-8b\ngpu: h100-sxm-80gb\npools:\n"
                        f"  - {{name: a, replicas: 1, {pool}, step_model: {{profile: prof.yaml}}}}\n")
    with pytest.raises(ConfigError, match=r"fleet.yaml: pools\[0\].step_model.profile: .*calibrated for "
                                          r"llama-3.1-8b on h100-sxm-80gb at tensor_parallel_size 1"):
        plan_pools(load_config(cfg_path), str(cfg_path))


def test_a_file_that_is_not_a_profile_is_a_config_error(tmp_path):
    (tmp_path / "x.yaml").write_text("mfu: 0.5\n")
    with pytest.raises(ConfigError, match="x.yaml: not a step-model profile"):
        read_profile(tmp_path / "x.yaml", "pools[0].step_model.profile")


def test_profile_splitwise_takes_the_shipped_calibration_of_the_pool_gpu(tmp_path):
    cfg_path = tmp_path / "fleet.yaml"
    cfg_path.write_text("model: llama-3.1-70b\ngpu: h200-sxm-141gb\npools:\n"
                        "  - {name: a, replicas: 1, tensor_parallel_size: 4, step_model: {profile: splitwise}}\n")
    (plan,) = plan_pools(load_config(cfg_path), str(cfg_path))
    shape = cal.step_shape("llama-3.1-70b", "h200-sxm-141gb", 4)
    assert np.array_equal(plan.step_params, step_params(shape, **gpu_defaults("h100-sxm-80gb", 4),
                                                        cuda_graph_max_tokens=512))


def test_shipped_calibrations_cover_every_catalog_gpu_and_pick_the_nearest_tp():
    from replay.model.specs import GPUS

    for gpu in GPUS:
        assert gpu_defaults(gpu, 4) is not None, gpu
    h100 = read_profile(PROFILES_DIR / "splitwise-llama-2-70b-h100-sxm-80gb.yaml")
    assert gpu_defaults("h100-sxm-80gb", 1) == h100.fits[2]
    assert gpu_defaults("h200-sxm-141gb", 16) == h100.fits[8]
    assert gpu_defaults("h100-sxm-80gb", 4) == h100.fits[4]


def _exhaustive_nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """min |a x - b|^2 over x >= 0 by trying every set of free unknowns (the oracle)."""
    k = a.shape[1]
    best, best_x = np.inf, np.zeros(k)
    for r in range(k + 1):
        for free in itertools.combinations(range(k), r):
            x = np.zeros(k)
            if free:
                sol, *_ = np.linalg.lstsq(a[:, free], b, rcond=None)
                if (sol < 0).any():
                    continue
                x[list(free)] = sol
            loss = float(np.sum((a @ x - b) ** 2))
            if loss < best:
                best, best_x = loss, x
    return best_x


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(6, 40), zero_column=st.integers(-1, 5))
def test_the_bounded_solver_finds_the_least_squares_optimum_over_nonnegative_x(seed, rows, zero_column):
    """Lawson-Hanson NNLS against trying every active set, on columns scaled over 12 orders of
    magnitude (as the fit's are: microseconds against per-token counts)."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(rows, 6)) * 10.0 ** rng.integers(-6, 6, size=6)
    if zero_column >= 0:
        a[:, zero_column] = 0.0
    b = rng.normal(size=rows) * 10.0 ** rng.integers(-3, 3)
    x = cal._bounded_lstsq(a, b)
    assert (x >= 0).all()
    if zero_column >= 0:
        assert x[zero_column] == 0.0
    oracle = _exhaustive_nnls(a, b)
    loss, best = np.sum((a @ x - b) ** 2), np.sum((a @ oracle - b) ** 2)
    assert loss <= best * (1 + 1e-9) + 1e-20 * float(b @ b)  # exact fits differ only by rounding


def test_knee_keys_in_config_and_profile(tmp_path):
    """A profile written before the knee has none; config's knee_tokens 0 turns a profile's knee
    off; a knee without its efficiency, or an efficiency outside (0, 1], is a config error."""
    old = _profile(tmp_path)
    assert "knee_tokens" not in read_profile(old).fits[1]
    fits = [{"tensor_parallel_size": 1, "step_model": {**KNEE, "allreduce_latency_us": 6.0}, "points": 1, "error": []}]
    path = tmp_path / "knee.yaml"
    write_profile(path, profile_document("llama-3.1-8b", "h100-sxm-80gb", fits, {"source_file": "x.csv"}))
    got = step_coefficients(StepModelArgs(profile=str(path)), "llama-3.1-8b", "h100-sxm-80gb", 1, "w")
    assert (got["knee_tokens"], got["past_knee_mfu"]) == (2048.0, 0.3)
    off = step_coefficients(StepModelArgs(profile=str(path), knee_tokens=0), "llama-3.1-8b", "h100-sxm-80gb", 1, "w")
    assert np.array_equal(step_params(_shape(1), **off), step_params(_shape(1), **{**off, "past_knee_mfu": None}))
    with pytest.raises(ConfigError, match=r"cfg: pools\[0\].step_model.past_knee_mfu: knee_tokens 4096 needs"):
        step_coefficients(StepModelArgs(knee_tokens=4096), "llama-3.1-8b", "h100-sxm-80gb", 1, "cfg: pools[0].step_model")
    with pytest.raises(ValueError, match=r"past_knee_mfu: got 1.5, expected a value in \(0, 1\]"):
        StepModelArgs(knee_tokens=4096, past_knee_mfu=1.5)
    with pytest.raises(ConfigError, match=r"w.past_knee_mfu: set without a knee"):
        step_coefficients(StepModelArgs(profile=str(old), past_knee_mfu=0.3), "llama-3.1-8b", "h100-sxm-80gb", 1, "w")
    over = step_coefficients(StepModelArgs(profile=str(path), past_knee_mfu=0.2), "llama-3.1-8b", "h100-sxm-80gb", 1, "w")
    assert over["past_knee_mfu"] == 0.2  # a profile's knee, a different efficiency past it
    with pytest.raises(ConfigError, match=r"w.past_knee_mfu: 0.3 is above mfu 0.25"):
        step_coefficients(StepModelArgs(profile=str(path), mfu=0.25), "llama-3.1-8b", "h100-sxm-80gb", 1, "w")


@pytest.mark.parametrize(("step_model", "says"), [
    ({**TRUE, "allreduce_latency_us": 6.0, "mfu_typo": 1}, "fits[0].step_model: unknown key 'mfu_typo'"),
    ({**TRUE, "allreduce_latency_us": 6.0, "knee_tokens": 2048}, "fits[0].step_model: knee_tokens 2048 without "
                                                                   "past_knee_mfu"),
    ({"mfu": 0.5}, "fits[0].step_model: missing mbu, per_step_overhead_us"),
    ({**TRUE, "allreduce_latency_us": "six"}, "fits[0].step_model: expected numbers"),
    ({**KNEE, "allreduce_latency_us": 6.0, "past_knee_mfu": 0}, "step_model.past_knee_mfu: got 0, expected a value"),
    ({**TRUE, "allreduce_latency_us": 6.0, "link_efficiency": 0}, "step_model.link_efficiency: got 0, expected"),
    ({**TRUE, "allreduce_latency_us": 6.0, "mfu": -1}, "step_model.mfu: got -1, expected a value in [0.01, 1] (an efficiency)"),
    ({**TRUE, "allreduce_latency_us": -6.0}, "step_model.allreduce_latency_us: got -6, expected a number >= 0"),
    ({**KNEE, "allreduce_latency_us": 6.0, "past_knee_mfu": 0.9}, "past_knee_mfu: got 0.9, expected at most mfu"),
])
def test_a_damaged_profile_says_what_is_wrong(tmp_path, step_model, says):
    path = tmp_path / "p.yaml"
    fits = [{"tensor_parallel_size": 1, "step_model": step_model, "points": 1, "error": []}]
    write_profile(path, profile_document("llama-3.1-8b", "h100-sxm-80gb", fits, {"source_file": "x.csv"}))
    with pytest.raises(ConfigError) as err:
        read_profile(path, "cfg: pools[0].step_model.profile")
    assert says in str(err.value) and "p.yaml" in str(err.value)


def test_tokens_past_the_knee_cost_what_the_past_knee_efficiency_says():
    """A prefill of n > knee tokens costs the dense matmuls of `knee` tokens at mfu plus n - knee
    at past_knee_mfu; below the knee nothing changes."""
    shape = _shape(1)
    plain = step_params(shape, **TRUE)
    knee = step_params(shape, **KNEE)
    dense_us = 2 * shape.active_params / shape.peak_flops * 1e6  # one token's matmuls at peak
    for n in (512, 2048):
        assert step_time_us_nb(knee, n, 0.0, 0, 0, 0, 1) == step_time_us_nb(plain, n, 0.0, 0, 0, 0, 1)
    extra = step_time_us_nb(knee, 8192, 0.0, 0, 0, 0, 1) - step_time_us_nb(plain, 8192, 0.0, 0, 0, 0, 1)
    assert extra == pytest.approx((8192 - 2048) * dense_us * (1 / 0.3 - 1 / 0.55), abs=1.0)


def test_a_fit_the_data_cannot_support_is_refused(tmp_path):
    """Steps faster than the GPU's peak allows (the wrong --model), or data with no memory-bound
    step, leave an efficiency at its bound or unpinned: the fit says which and writes nothing."""
    fast = _synthetic_csv(tmp_path / "fast.csv", TRUE)  # llama-3.1-8b's steps...
    m = read_generic(fast, 2)
    t = cal.terms({2: cal.unit_params(cal.step_shape("llama-3.1-70b", "h100-sxm-80gb", 2))}, m)  # ...as a 70B's
    with pytest.raises(cal.CalibrationError, match=r"fast.csv: the fit needs mfu above 1: the compute-bound steps "
                                                   r"ran faster .* Are --model, --gpu and --tp .* Nothing written"):
        cal.check_fit(t, cal.fit_knee(t, m.step_us, m.config), f"{fast}")
    prefills = tmp_path / "prefills.csv"  # large prefills only: every step compute-bound
    rows = [r for r in fast.read_text().splitlines()[1:] if int(r.split(",")[0]) >= 1024 and r.split(",")[2] == "0"]
    prefills.write_text(HEADER + "\n".join(rows) + "\n")
    m = read_generic(prefills, 2, fitting=False)
    t = cal.terms({2: cal.unit_params(_shape())}, m)
    with pytest.raises(cal.CalibrationError, match="no measured step is memory-bound .decode steps., so mbu cannot"):
        cal.check_fit(t, cal.fit_knee(t, m.step_us, m.config), "prefills.csv")
    good = read_generic(_synthetic_csv(tmp_path / "good.csv", TRUE), 2)
    t = cal.terms({2: cal.unit_params(_shape())}, good)
    cal.check_fit(t, cal.fit_knee(t, good.step_us, good.config), "good.csv")  # no error


def test_rows_timed_on_the_cpu_are_refused(tmp_path):
    path = tmp_path / "cpu.csv"
    path.write_text("prefill_tokens,decode_seqs,decode_context_tokens,step_time_ms,device\n"
                    "128,0,0,1.5,cuda\n0,4,400,2.0,cpu\n")
    with pytest.raises(UserError, match=r"cpu.csv: row 2 \(line 3\), column 'device': got 'cpu'"):
        read_generic(path, 1, fitting=False)
