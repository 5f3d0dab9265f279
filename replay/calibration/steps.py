"""Fit the step model's efficiencies and overheads to measured step times, and cross-validate.

The model (replay/model/stepmodel.py) is linear in 1/mfu, 1/mbu, the three overheads and the knee's
extra cost once each step knows which roofline branch (compute or memory) it is on, so the fit
alternates: assign branches, solve a small bounded least-squares problem, repeat. It minimises
mean absolute percentage error (by reweighting) because that is the error it reports. The knee's
position is not linear: `fit_knee` tries each position of a grid the data can pin down and keeps
the best, and cross-validation repeats that search inside every training fold. Times are
microseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from replay.model import stepmodel as sm
from replay.calibration.data import Measured
from replay.model.memory import idle_weights_bytes_per_gpu, kv_bytes_per_token_per_gpu, weights_bytes_per_gpu
from replay.model.specs import get_gpu, get_model, normalize_weight_dtype, weight_bits
from common.errors import UserError

# Fitted coefficients. The knee's two are optional in a profile (files written before it have none).
COEFFICIENTS = ("mfu", "mbu", "per_step_overhead_us", "per_seq_overhead_us", "prefill_overhead_us", "knee_tokens",
                "past_knee_mfu")
KNEE_COEFFICIENTS = ("knee_tokens", "past_knee_mfu")
MAX_ITERATIONS = 500
# Knee positions `fit_knee` tries (tokens in a step), and how many standard errors its held-out gain
# must clear to be kept (the one-standard-error rule of cross-validated model selection: Breiman et
# al., "Classification and Regression Trees", 1984, 3.4.3): a knee that only fits noise is left out,
# so a profile names one only where the data bend.
KNEE_GRID = (512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768)
KNEE_MIN_T = 1.0


class CalibrationError(UserError):
    """The fit did not converge, or the data cannot support it."""


def step_shape(model_id: str, gpu_id: str, tp: int, weight_dtype: str | None = None,
               kv_cache_dtype: str = "auto") -> sm.StepShape:
    """The StepShape a pool of `model_id` on `gpu_id` at `tp` gets (as replay/fleet/cluster.py builds it)."""
    model, gpu = get_model(model_id), get_gpu(gpu_id)
    dtype = weight_dtype or model.default_weight_dtype
    expert_dtype = (model.expert_weight_dtype or dtype) if weight_dtype is None else dtype
    return sm.StepShape(
        active_params=model.active_params, num_layers=model.num_layers,
        num_attention_heads=model.num_attention_heads, head_dim=model.head_dim, hidden_size=model.hidden_size,
        tp=tp, weights_bytes_per_gpu=float(weights_bytes_per_gpu(model, tp, weight_dtype))
        - idle_weights_bytes_per_gpu(model, tp),
        kv_bytes_per_token_per_gpu=float(kv_bytes_per_token_per_gpu(model, tp, kv_cache_dtype)),
        peak_flops=gpu.matmul_flops(normalize_weight_dtype(dtype)), hbm_bytes_per_s=gpu.hbm_bandwidth_bytes_per_s,
        link_bytes_per_s=gpu.interconnect_bytes_per_s,
        # MoE: a step reads only the experts its tokens touch (`terms`, as the kernel does)
        expert_weights_bytes_per_gpu=model.expert_params * weight_bits(expert_dtype) / 8 / tp if model.is_moe else 0.0,
        expert_active_params=model.expert_active_params, num_experts=model.num_experts,
        experts_per_token=model.experts_per_token, moe_layers=model.moe_layers,
    )


@dataclass(frozen=True)
class Terms:
    """Per measured step: compute and memory time at 100% efficiency, all-reduce time, and the
    counts the overheads multiply."""

    compute_us: np.ndarray
    memory_us: np.ndarray
    comm_us: np.ndarray
    num_seqs: np.ndarray
    has_prefill: np.ndarray
    tokens: np.ndarray  # tokens the step computes (prefill and decode)
    dense_us_per_token: np.ndarray  # one token's dense matmuls at peak FLOP/s

    def take(self, mask: np.ndarray) -> Terms:
        return Terms(*(getattr(self, name)[mask] for name in Terms.__dataclass_fields__))

    def past_knee_us(self, knee_tokens: float) -> np.ndarray:
        """The dense matmuls of each step's tokens past `knee_tokens`, at peak FLOP/s."""
        return self.dense_us_per_token * np.maximum(0.0, self.tokens - knee_tokens)


def terms(params_by_tp: dict[int, np.ndarray], m: Measured) -> Terms:
    """The roofline's pieces for every step of `m`; params_by_tp[tp] is a `step_params` vector."""
    n = len(m)
    out = {k: np.zeros(n) for k in ("compute_us", "memory_us", "comm_us", "dense_us_per_token")}
    for tp, p in params_by_tp.items():
        i = m.tp == tp
        tokens = m.prefill_tokens[i] + m.decode_seqs[i]
        out["dense_us_per_token"][i] = p[sm.FLOPS_PER_TOKEN] / p[sm.FLOPS_RATE] * 1e6
        flops = p[sm.FLOPS_PER_TOKEN] * tokens + p[sm.ATTN_FLOPS_PER_PAIR] * (m.prefill_pairs[i] + m.decode_ctx[i])
        weight_bytes = np.full(int(i.sum()), p[sm.WEIGHT_BYTES])
        if p[sm.NUM_EXPERTS] > 0:  # MoE: only the experts the step's tokens touch are read (as the kernel)
            e = p[sm.NUM_EXPERTS]
            weight_bytes += p[sm.EXPERT_BYTES_EACH] * e * (1.0 - (1.0 - p[sm.EXPERTS_PER_TOKEN] / e) ** tokens)
        nbytes = weight_bytes + p[sm.KV_BYTES_PER_TOKEN] * (m.decode_ctx[i] + m.prefill_ctx[i] + tokens)
        out["compute_us"][i] = flops / p[sm.FLOPS_RATE] * 1e6
        out["memory_us"][i] = nbytes / p[sm.BYTES_RATE] * 1e6
        out["comm_us"][i] = (p[sm.ALLREDUCE_BYTES_PER_TOKEN] * tokens / p[sm.LINK_BYTES_RATE] * 1e6
                             + p[sm.ALLREDUCE_FIXED_US])
    return Terms(**out, num_seqs=m.num_seqs.astype(np.float64), has_prefill=(m.prefill_tokens > 0).astype(np.float64),
                 tokens=(m.prefill_tokens + m.decode_seqs).astype(np.float64))


def unit_params(shape: sm.StepShape, allreduce_latency_us: float | None = None) -> np.ndarray:
    """step_params at 100% efficiency and no overheads: what `terms` needs."""
    return sm.step_params(shape, mfu=1.0, mbu=1.0, per_step_overhead_us=0.0, per_seq_overhead_us=0.0,
                          allreduce_latency_us=allreduce_latency_us, prefill_overhead_us=0.0)


def _compute_us(t: Terms, coef: dict[str, float]) -> np.ndarray:
    compute = t.compute_us / coef["mfu"]
    knee = coef.get("knee_tokens") or 0.0
    if knee > 0:
        compute = compute + t.past_knee_us(knee) * (1.0 / coef["past_knee_mfu"] - 1.0 / coef["mfu"])
    return compute


def predict_us(t: Terms, coef: dict[str, float]) -> np.ndarray:
    """Step times the model gives (before rounding up to whole microseconds)."""
    return (np.maximum(_compute_us(t, coef), t.memory_us / coef["mbu"]) + t.comm_us
            + coef["per_step_overhead_us"] + coef["per_seq_overhead_us"] * t.num_seqs
            + coef["prefill_overhead_us"] * t.has_prefill)


def _bounded_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """min |a x - b|^2 subject to x >= 0: Lawson and Hanson's active-set NNLS ("Solving Least
    Squares Problems", 1974, ch. 23), on columns scaled to unit norm (the unknowns differ by ten
    orders of magnitude). Columns that are all zero stay at 0."""
    k = a.shape[1]
    norms = np.linalg.norm(a, axis=0)
    live = norms > 0
    scaled = np.where(live, a / np.where(live, norms, 1.0), 0.0)
    x = np.zeros(k)
    passive = np.zeros(k, dtype=bool)
    tol = 10 * np.finfo(float).eps * max(a.shape) * max(1.0, float(np.abs(scaled.T @ b).max()))
    for _ in range(30 * k):  # Lawson and Hanson bound it by the active sets; this guards rounding cycles
        gradient = scaled.T @ (b - scaled @ x)
        entering = ~passive & live & (gradient > tol)
        if not entering.any():
            break
        passive[np.argmax(np.where(entering, gradient, -np.inf))] = True
        while True:  # solve on the passive set; step back while that leaves it infeasible
            z = np.zeros(k)
            z[passive], *_ = np.linalg.lstsq(scaled[:, passive], b, rcond=None)
            if (z[passive] > tol).all():
                x = z
                break
            blocking = passive & (z <= tol)
            alpha = float(np.min(x[blocking] / (x[blocking] - z[blocking])))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
    return np.where(live, x / np.where(live, norms, 1.0), 0.0)


def _coef(x: np.ndarray, knee_tokens: float) -> dict[str, float]:
    mfu = float(1.0 / (1.0 + x[0]))
    return {"mfu": mfu, "mbu": float(1.0 / (1.0 + x[1])), "per_step_overhead_us": float(x[2]),
            "per_seq_overhead_us": float(x[3]), "prefill_overhead_us": float(x[4]),
            "knee_tokens": float(knee_tokens) if x[5] > 0 else 0.0,
            "past_knee_mfu": float(1.0 / (1.0 + x[0] + x[5])) if x[5] > 0 else mfu}


def fit(t: Terms, step_us: np.ndarray, max_iterations: int = MAX_ITERATIONS,
        knee_tokens: float = 0.0) -> dict[str, float]:
    """Coefficients minimising the mean absolute percentage error of `predict_us` against `step_us`,
    with the knee (if any) at `knee_tokens`.

    Unknowns x = (1/mfu - 1, 1/mbu - 1, overheads, 1/past_knee_mfu - 1/mfu), all >= 0, so
    efficiencies stay in (0, 1] and matmuls past a knee are no faster than before it. For a fixed
    branch per step the model is linear in x; a weighted least-squares solve with weights
    1 / (y sqrt(|relative residual|)) is one step of iteratively reweighted least squares for the
    L1 relative error. Converged means the branches and x no longer change.
    """
    y = np.asarray(step_us, dtype=np.float64)
    fixed_comm = t.comm_us
    ones = np.ones_like(y)
    past_knee = t.past_knee_us(knee_tokens) if knee_tokens > 0 else np.zeros_like(y)
    results = []
    for start in ("memory", "compute"):
        compute_branch = np.full(len(y), start == "compute")
        rel = np.ones_like(y)
        loss = np.inf
        for _ in range(max_iterations):
            c_col = np.where(compute_branch, t.compute_us, 0.0)
            m_col = np.where(compute_branch, 0.0, t.memory_us)
            k_col = np.where(compute_branch, past_knee, 0.0)
            a = np.stack([c_col, m_col, ones, t.num_seqs, t.has_prefill, k_col], axis=1)
            base = c_col + m_col + fixed_comm
            w = 1.0 / (y * np.sqrt(np.maximum(rel, 1e-4)))
            coef = _coef(_bounded_lstsq(a * w[:, None], (y - base) * w), knee_tokens)
            new_branch = _compute_us(t, coef) >= t.memory_us / coef["mbu"]
            rel = np.abs(predict_us(t, coef) - y) / y
            new_loss = float(np.mean(rel))
            # Converged: no step changes branch and the error stops moving (relative change < 1e-6).
            # Coefficients along a flat direction (mbu against a fixed overhead, when the weights
            # dominate every step's bytes) may still drift; the predictions no longer do.
            done = (new_branch == compute_branch).all() and abs(loss - new_loss) <= 1e-6 * new_loss
            loss, compute_branch = new_loss, new_branch
            if done:
                results.append((loss, coef))
                break
    if not results:
        raise CalibrationError(
            f"the fit did not converge in {max_iterations} iterations (the roofline branch of some steps kept "
            "switching); nothing written. The data may mix engines or settings, or hold too few distinct batches")
    _, coef = min(results, key=lambda r: r[0])
    if not all(np.isfinite(v) for v in coef.values()):
        raise CalibrationError("the fit did not converge (non-finite coefficients); nothing written")
    return coef


def check_fit(t: Terms, coef: dict[str, float], what: str) -> None:
    """Refuse a fit the data do not support: an efficiency no measured step pins (no step on its
    side of the roofline), or one pressed against its bound of 1, which means the steps ran faster
    than the GPU's peak allows for this model (the wrong --model, --gpu or --tp, or scaled-down
    shapes)."""
    compute_side = _compute_us(t, coef) >= t.memory_us / coef["mbu"]
    for name, side, kind in (("mfu", compute_side, "compute-bound (large prefills)"),
                             ("mbu", ~compute_side, "memory-bound (decode steps)")):
        if not side.any():
            raise CalibrationError(f"{what}: no measured step is {kind}, so {name} cannot be fitted; add such steps. "
                                   "Nothing written")
        if coef[name] >= 1.0 - 1e-9:
            raise CalibrationError(
                f"{what}: the fit needs {name} above 1: the {kind.split(' (')[0]} steps ran faster than the GPU's peak "
                f"allows for this model. Are --model, --gpu and --tp those of the measurement? Nothing written")


def knee_candidates(t: Terms) -> list[int]:
    """Grid positions with at least two distinct step sizes (in tokens) on each side: a knee the
    data cannot place between measured points is not tried."""
    sizes = np.unique(t.tokens)
    return [k for k in KNEE_GRID if (sizes < k).sum() >= 2 and (sizes > k).sum() >= 2]


def fit_knee(t: Terms, step_us: np.ndarray, config: np.ndarray, max_iterations: int = MAX_ITERATIONS,
             k: int = 5) -> dict[str, float]:
    """`fit`, with a knee where the data show one.

    The position is the `knee_candidates` one that fits best. The knee is kept only if it predicts
    held-out configurations better: in a k-fold cross-validation over `config` (the batch
    compositions; repetitions stay together), its gain in absolute percentage error per
    configuration must exceed KNEE_MIN_T standard errors of that gain. The position is chosen on
    all the data before that test, so the test is somewhat lenient and noise now and then buys a
    mild knee (a reviewer's 30 noisy no-knee datasets kept 2); `cross_validate` repeats the whole
    search in every fold, so the error it reports pays for that.

    The Splitwise profile needs one: at TP 4 and 8 a step's prefill cost per token, after falling
    as fixed costs spread, rises 13-78% from 2k to 8k tokens (in one prompt or many), which no
    roofline term with one efficiency reproduces; with the knee its cross-validated prompt_time
    error drops from 8-15% to under 8% (README, "Calibration").
    """
    y = np.asarray(step_us, dtype=np.float64)
    plain = fit(t, y, max_iterations)
    best, best_loss = None, mape_pct(predict_us(t, plain), y)
    for knee in knee_candidates(t):
        try:
            coef = fit(t, y, max_iterations, knee_tokens=knee)
        except CalibrationError:
            continue  # this position does not converge; others may
        loss = mape_pct(predict_us(t, coef), y)
        if coef["knee_tokens"] > 0 and loss < best_loss:
            best, best_loss = coef, loss
    if best is None or not _held_out_gain_is_real(t, y, config, best["knee_tokens"], max_iterations, k):
        return plain
    return best


def _held_out_gain_is_real(t: Terms, y: np.ndarray, config: np.ndarray, knee: float, max_iterations: int,
                           k: int) -> bool:
    keys = np.unique(config)
    k = min(k, len(keys))
    if k < 2:
        return False
    f = folds(config, k, seed=1)
    ape = {0.0: np.zeros(len(y)), knee: np.zeros(len(y))}
    for j in range(k):
        train, test = f != j, f == j
        for position, errors in ape.items():
            try:
                c = fit(t.take(train), y[train], max_iterations, knee_tokens=position)
            except CalibrationError:
                return False
            errors[test] = np.abs(predict_us(t.take(test), c) - y[test]) / y[test]
    gain = np.array([np.mean(ape[0.0][config == key] - ape[knee][config == key]) for key in keys])
    se = float(np.std(gain, ddof=1) / np.sqrt(len(gain)))
    return float(np.mean(gain)) > KNEE_MIN_T * se


@dataclass(frozen=True)
class ColumnError:
    """Error of one measured column (and TP): MAPE of the k-fold out-of-fold predictions, of the
    in-sample fit, and of each configuration's median against its own repetitions (noise floor)."""

    column: str
    tp: int
    points: int
    cv_mape_pct: float
    fit_mape_pct: float
    noise_mape_pct: float
    cv_max_ape_pct: float


def folds(config: np.ndarray, k: int, seed: int = 0) -> np.ndarray:
    """Fold index per point; every repetition of a configuration lands in the same fold, so the
    held-out fold never has a twin in the training data."""
    keys = sorted(set(config.tolist()))
    order = np.random.default_rng(seed).permutation(len(keys))
    fold_of = {keys[i]: j % k for j, i in enumerate(order)}
    return np.array([fold_of[c] for c in config.tolist()], dtype=np.int64)


def mape_pct(pred: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - y) / y) * 100) if len(y) else float("nan")


def cross_validate(t: Terms, m: Measured, k: int = 5, max_iterations: int = MAX_ITERATIONS,
                   coef: dict[str, float] | None = None) -> list[ColumnError]:
    """k-fold cross-validated error per (measured column, TP), grouped by configuration. Each
    training fold is fitted as the whole data is (`fit_knee`: the knee's search included), so the
    held-out error counts the search too."""
    k = min(k, len(set(m.config.tolist())))
    f = folds(m.config, k)
    oof = np.zeros(len(m))
    for j in range(k):
        train, test = f != j, f == j
        c = fit_knee(t.take(train), m.step_us[train], m.config[train], max_iterations)
        oof[test] = predict_us(t.take(test), c)
    full = predict_us(t, coef if coef is not None else fit_knee(t, m.step_us, m.config, max_iterations))
    median = np.zeros(len(m))
    for key in set(zip(m.column.tolist(), m.config.tolist())):
        i = (m.column == key[0]) & (m.config == key[1])
        median[i] = np.median(m.step_us[i])
    out = []
    for column in dict.fromkeys(m.column.tolist()):
        for tp in sorted(set(m.tp.tolist())):
            i = (m.column == column) & (m.tp == tp)
            if not i.any():
                continue
            y = m.step_us[i]
            out.append(ColumnError(column, int(tp), int(i.sum()), mape_pct(oof[i], y), mape_pct(full[i], y),
                                   mape_pct(median[i], y), float(np.max(np.abs(oof[i] - y) / y) * 100)))
    return out
