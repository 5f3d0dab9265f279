"""Fit the step model's efficiencies and overheads to measured step times, and cross-validate.

The model (replay/stepmodel.py) is linear in 1/mfu, 1/mbu and the three overheads once each step
knows which roofline branch (compute or memory) it is on, so the fit alternates: assign branches,
solve a small bounded least-squares problem, repeat. It minimises mean absolute percentage error
(by reweighting) because that is the error it reports. Times are microseconds.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from replay import stepmodel as sm
from replay.calibrate_data import Measured
from replay.memory import kv_bytes_per_token_per_gpu, weights_bytes_per_gpu
from replay.specs import get_gpu, get_model
from traces.errors import UserError

# Fitted coefficients, in the order of the solver's unknowns (each >= 0 after the shift below).
COEFFICIENTS = ("mfu", "mbu", "per_step_overhead_us", "per_seq_overhead_us", "prefill_overhead_us")
MAX_ITERATIONS = 500


class CalibrationError(UserError):
    """The fit did not converge, or the data cannot support it."""


def step_shape(model_id: str, gpu_id: str, tp: int, weight_dtype: str | None = None,
               kv_cache_dtype: str = "auto") -> sm.StepShape:
    """The StepShape a pool of `model_id` on `gpu_id` at `tp` gets (as replay/cluster.py builds it)."""
    model, gpu = get_model(model_id), get_gpu(gpu_id)
    dtype = weight_dtype or model.default_weight_dtype
    fp8 = dtype == "fp8" and gpu.fp8_native
    return sm.StepShape(
        active_params=model.active_params, num_layers=model.num_layers,
        num_attention_heads=model.num_attention_heads, head_dim=model.head_dim, hidden_size=model.hidden_size,
        tp=tp, weights_bytes_per_gpu=float(weights_bytes_per_gpu(model, tp, weight_dtype)),
        kv_bytes_per_token_per_gpu=float(kv_bytes_per_token_per_gpu(model, tp, kv_cache_dtype)),
        peak_flops=gpu.fp8_flops if fp8 else gpu.bf16_flops, hbm_bytes_per_s=gpu.hbm_bandwidth_bytes_per_s,
        link_bytes_per_s=gpu.interconnect_bytes_per_s,
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


def terms(params_by_tp: dict[int, np.ndarray], m: Measured) -> Terms:
    """The roofline's pieces for every step of `m`; params_by_tp[tp] is a `step_params` vector."""
    n = len(m)
    out = {k: np.zeros(n) for k in ("compute_us", "memory_us", "comm_us")}
    for tp, p in params_by_tp.items():
        i = m.tp == tp
        tokens = m.prefill_tokens[i] + m.decode_seqs[i]
        flops = p[sm.FLOPS_PER_TOKEN] * tokens + p[sm.ATTN_FLOPS_PER_PAIR] * (m.prefill_pairs[i] + m.decode_ctx[i])
        nbytes = p[sm.WEIGHT_BYTES] + p[sm.KV_BYTES_PER_TOKEN] * (m.decode_ctx[i] + m.prefill_ctx[i] + tokens)
        out["compute_us"][i] = flops / p[sm.FLOPS_RATE] * 1e6
        out["memory_us"][i] = nbytes / p[sm.BYTES_RATE] * 1e6
        out["comm_us"][i] = (p[sm.ALLREDUCE_BYTES_PER_TOKEN] * tokens / p[sm.LINK_BYTES_RATE] * 1e6
                             + p[sm.ALLREDUCE_FIXED_US])
    return Terms(**out, num_seqs=m.num_seqs.astype(np.float64), has_prefill=(m.prefill_tokens > 0).astype(np.float64))


def unit_params(shape: sm.StepShape, allreduce_latency_us: float | None = None) -> np.ndarray:
    """step_params at 100% efficiency and no overheads: what `terms` needs."""
    return sm.step_params(shape, mfu=1.0, mbu=1.0, per_step_overhead_us=0.0, per_seq_overhead_us=0.0,
                          allreduce_latency_us=allreduce_latency_us, prefill_overhead_us=0.0)


def predict_us(t: Terms, coef: dict[str, float]) -> np.ndarray:
    """Step times the model gives (before rounding up to whole microseconds)."""
    return (np.maximum(t.compute_us / coef["mfu"], t.memory_us / coef["mbu"]) + t.comm_us
            + coef["per_step_overhead_us"] + coef["per_seq_overhead_us"] * t.num_seqs
            + coef["prefill_overhead_us"] * t.has_prefill)


def _bounded_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """min |a x - b|^2 subject to x >= 0, exactly, by trying every set of free unknowns (5 unknowns:
    31 small solves). Columns that are all zero stay at 0."""
    k = a.shape[1]
    live = [j for j in range(k) if np.any(a[:, j])]
    best, best_x = np.inf, np.zeros(k)
    sol, *_ = np.linalg.lstsq(a[:, live], b, rcond=None)
    if (sol >= 0).all():  # the unconstrained optimum is feasible: it is the answer
        best_x[live] = sol
        return best_x
    for r in range(1, len(live) + 1):
        for free in itertools.combinations(live, r):
            sol, *_ = np.linalg.lstsq(a[:, free], b, rcond=None)
            if (sol < 0).any():
                continue
            x = np.zeros(k)
            x[list(free)] = sol
            loss = float(np.sum((a @ x - b) ** 2))
            if loss < best:
                best, best_x = loss, x
    return best_x


def _coef(x: np.ndarray) -> dict[str, float]:
    return {"mfu": float(1.0 / (1.0 + x[0])), "mbu": float(1.0 / (1.0 + x[1])), "per_step_overhead_us": float(x[2]),
            "per_seq_overhead_us": float(x[3]), "prefill_overhead_us": float(x[4])}


def fit(t: Terms, step_us: np.ndarray, max_iterations: int = MAX_ITERATIONS) -> dict[str, float]:
    """Coefficients minimising the mean absolute percentage error of `predict_us` against `step_us`.

    Unknowns x = (1/mfu - 1, 1/mbu - 1, overheads), all >= 0, so efficiencies stay in (0, 1]. For a
    fixed branch per step the model is linear in x; a weighted least-squares solve with weights
    1 / (y sqrt(|relative residual|)) is one step of iteratively reweighted least squares for the
    L1 relative error. Converged means the branches and x no longer change.
    """
    y = np.asarray(step_us, dtype=np.float64)
    fixed_comm = t.comm_us
    ones = np.ones_like(y)
    results = []
    for start in ("memory", "compute"):
        compute_branch = np.full(len(y), start == "compute")
        rel = np.ones_like(y)
        loss = np.inf
        for _ in range(max_iterations):
            c_col = np.where(compute_branch, t.compute_us, 0.0)
            m_col = np.where(compute_branch, 0.0, t.memory_us)
            a = np.stack([c_col, m_col, ones, t.num_seqs, t.has_prefill], axis=1)
            base = c_col + m_col + fixed_comm
            w = 1.0 / (y * np.sqrt(np.maximum(rel, 1e-4)))
            coef = _coef(_bounded_lstsq(a * w[:, None], (y - base) * w))
            new_branch = t.compute_us / coef["mfu"] >= t.memory_us / coef["mbu"]
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
    """k-fold cross-validated error per (measured column, TP), grouped by configuration."""
    k = min(k, len(set(m.config.tolist())))
    f = folds(m.config, k)
    oof = np.zeros(len(m))
    for j in range(k):
        train, test = f != j, f == j
        sub = Terms(*(getattr(t, name)[train] for name in Terms.__dataclass_fields__))
        c = fit(sub, m.step_us[train], max_iterations)
        oof[test] = predict_us(Terms(*(getattr(t, name)[test] for name in Terms.__dataclass_fields__)), c)
    full = predict_us(t, coef if coef is not None else fit(t, m.step_us, max_iterations))
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
