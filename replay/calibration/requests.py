"""Request-level calibration: fit the step model's overheads and memory efficiency, and the
serving terms, by replaying real experiments whole and matching what their clients measured.

Each experiment (replay/measured.py) is one vLLM server under a known load with its measured mean
TTFT, ITL and E2E. The fit minimises the squared log errors of those three means over every
experiment (Levenberg-Marquardt, with the Jacobian taken by replaying at nudged parameters). The
step-model terms change the replay's dynamics and need replays; the serving terms only add to
TTFT and E2E, so for each replay the best `token_return_us` is found without replaying again.
Cross-validation holds out one model at a time: its experiments are predicted by a fit on the
other models only, as the held-out set will be judged.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from common.errors import UserError
from replay.model import serving

METRICS = ("ttft_mean", "itl_mean", "e2e_mean")


@dataclass(frozen=True)
class Param:
    name: str  # a step_model key
    lo: float
    hi: float
    nudge: float  # finite-difference step
    pinned_by: str  # what the experiments need for the data to pin it
    # A parameter the data cannot pin follows this one instead of being an error (its config
    # key's own default: unset, it is the same as that key).
    follows: str | None = None


# expert_mbu (routed experts' own share of bandwidth) is fitted where an MoE model's experiments
# pin it, else it follows mbu. With one share for both, the MoE model (its steps mostly expert
# reads) and the dense ones pulled the fit to a regime neither wants: all 17 real servers fitted
# mbu 0.70 with no per-step overhead, the 13 dense ones alone mbu 0.92 with 1.4 ms a step.
PARAMS = (
    Param("mbu", 0.2, 1.0, 0.03, "memory-bound decode steps"),
    Param("attention_mbu", 0.2, 1.0, 0.03, "decode steps whose KV reads differ (batch sizes, contexts, KV heads)",
          follows="mbu"),
    Param("per_step_overhead_us", 0.0, 5000.0, 100.0, "steps of any kind"),
    Param("per_seq_overhead_us", 0.0, 200.0, 2.0, "experiments at different batch sizes"),
    Param("allreduce_latency_us", 0.0, 60.0, 2.0,
          "experiments at tensor_parallel_size > 1 of models of different depths or at different TPs"),
    Param("expert_mbu", 0.2, 1.0, 0.03, "experiments of an MoE model", follows="mbu"),
)
# A parameter whose largest effect on any residual is below this (a log ratio per nudge) is one
# the data cannot pin; so is one whose effect the others' reproduce to within COLLINEAR of its size
# (two fixed costs per step on experiments of one model at one TP, say).
MIN_SENSITIVITY = 1e-3
COLLINEAR = 0.02


@dataclass(frozen=True)
class EngineMeans:
    """A replay's whole-run means with the serving terms at zero (ms) and the output tokens the
    client counted per request (for ITL = (E2E - TTFT) / (counted - 1), as the harness computes)."""

    ttft_ms: float
    e2e_ms: float
    counted_tokens: float
    unfinished: int = 0

    def metrics(self, lag_ms: float) -> dict[str, float]:
        ttft, e2e = self.ttft_ms + lag_ms, self.e2e_ms + lag_ms
        return {"ttft_mean": ttft, "itl_mean": (e2e - ttft) / max(self.counted_tokens - 1.0, 1.0), "e2e_mean": e2e}


@dataclass(frozen=True)
class Target:
    """One experiment to fit: `replay(step_model keys) -> EngineMeans`, grouped by `model` for the
    cross-validation, with the mean prompt tokens (for the tokeniser's share of the serving time)."""

    name: str
    model: str
    measured: dict[str, float]
    replay: Callable[[dict[str, float]], EngineMeans]
    prompt_tokens: float = 0.0


@dataclass
class Fit:
    step_model: dict[str, float]
    serving: dict[str, float]
    cost: float
    iterations: int
    predicted: dict[str, dict[str, float]] = field(default_factory=dict)  # target -> metric -> ms
    unpinned: list[str] = field(default_factory=list)  # held: followed another, or (in a fold) its start


def _lag_ms(means: Sequence[EngineMeans], targets: Sequence[Target]) -> float:
    """The client-side time (API server + token return, ms) that best fits TTFT and E2E given the
    engine-only replays: a golden-section search of the log errors, which are convex in it."""

    def loss(lag: float) -> float:
        return sum(math.log(m.metrics(lag)[k] / t.measured[k]) ** 2
                   for m, t in zip(means, targets) for k in ("ttft_mean", "e2e_mean"))

    lo, hi = 0.0, 50.0
    for _ in range(48):
        a, b = lo + (hi - lo) * 0.382, lo + (hi - lo) * 0.618
        lo, hi = (lo, b) if loss(a) < loss(b) else (a, hi)
    return (lo + hi) / 2


def _residuals(means: Sequence[EngineMeans], targets: Sequence[Target], lag: float) -> np.ndarray:
    return np.array([math.log(max(m.metrics(lag)[k], 1e-9) / t.measured[k])
                     for m, t in zip(means, targets) for k in METRICS])


def _serving(lag_ms: float, prompt_tokens: float) -> dict[str, float]:
    """The fitted client-side time split as vLLM's source has it: the tokeniser's micro-batch wait
    and its per-token cost go in (replay/model/serving.py defaults), the rest is the tokens' way back."""
    total = lag_ms * 1000.0
    tokenize = serving.DEFAULT_TOKENIZE_US_PER_TOKEN * prompt_tokens
    api = min(serving.DEFAULT_API_SERVER_US, max(total - tokenize, 0.0))
    after = max(total - api - tokenize, 0.0)
    return {"api_server_us": round(api, 1), "tokenize_us_per_token": serving.DEFAULT_TOKENIZE_US_PER_TOKEN,
            "token_return_us": round(after, 1)}


def _unpinned(jac: np.ndarray, held: set[int], hold_unpinned: bool) -> set[int]:
    """Parameters (indices into PARAMS) the Jacobian shows the data cannot pin: no residual moves
    with one, or the others' columns reproduce its column. One without `follows` is an error
    naming it, unless `hold_unpinned` (a cross-validation fold): then it is held too."""
    out: set[int] = set()

    def unpin(j: int, why: str) -> None:
        p = PARAMS[j]
        if not hold_unpinned and p.follows is None:
            raise UserError(f"calibrate --experiments: the experiments cannot pin step_model.{p.name} {why}; it needs "
                            f"{p.pinned_by}); nothing written")
        out.add(j)

    for j, p in enumerate(PARAMS):
        if j not in held and np.max(np.abs(jac[:, j])) * p.nudge < MIN_SENSITIVITY:
            unpin(j, "(no replay changes with it")
    for j in reversed(range(len(PARAMS))):  # the most specific terms (listed last) are blamed first
        if j in held or j in out:
            continue
        others = [k for k in range(len(PARAMS)) if k != j and k not in held and k not in out]
        coef, *_ = np.linalg.lstsq(jac[:, others], jac[:, j], rcond=None)
        rest = np.linalg.norm(jac[:, j] - jac[:, others] @ coef) / max(np.linalg.norm(jac[:, j]), 1e-30)
        if rest < COLLINEAR:
            twin = PARAMS[others[int(np.argmax(np.abs(coef) * np.linalg.norm(jac[:, others], axis=0)))]]
            unpin(j, f"apart from step_model.{twin.name} (their replays change alike")
    return out


def fit(targets: Sequence[Target], start: dict[str, float], max_iterations: int = 8,
        log: Callable[[str], None] | None = None, hold_unpinned: bool = False) -> Fit:
    """Fit PARAMS to the targets from `start`; a parameter the targets cannot pin is an error
    naming it (and what would pin it) before anything is written, or with `hold_unpinned` (a
    cross-validation fold) is held at its `start` value."""
    # terms that follow another when unpinned (attention_mbu, expert_mbu) need no data of their own
    needed = sum(p.follows is None for p in PARAMS)
    if not hold_unpinned and len(targets) * len(METRICS) < needed + 1:
        raise UserError(f"calibrate --experiments: {len(targets)} experiment(s) cannot pin {needed} step-model "
                        f"terms and the serving time; give at least {math.ceil((needed + 1) / len(METRICS))}")
    theta = np.array([start[p.name] if p.name in start else start[p.follows] for p in PARAMS], np.float64)
    lo = np.array([p.lo for p in PARAMS])
    hi = np.array([p.hi for p in PARAMS])

    index = {p.name: j for j, p in enumerate(PARAMS)}
    held: set[int] = set()

    def tie(x: np.ndarray) -> np.ndarray:
        """Held parameters that follow another take its value."""
        x = x.copy()
        for j in held:
            if PARAMS[j].follows is not None:
                x[j] = x[index[PARAMS[j].follows]]
        return x

    def run(x: np.ndarray) -> list[EngineMeans]:
        keys = {p.name: float(v) for p, v in zip(PARAMS, x)}
        return [t.replay(keys) for t in targets]

    means = run(theta)
    lag = _lag_ms(means, targets)
    r = _residuals(means, targets, lag)
    cost, damping, it = float(r @ r), 1e-2, 0
    for it in range(1, max_iterations + 1):
        cols = []
        for j, p in enumerate(PARAMS):
            if j in held:  # no replays for a parameter the fit no longer moves
                cols.append(np.zeros_like(r))
                continue
            x = theta.copy()
            x[j] = x[j] + p.nudge if x[j] + p.nudge <= p.hi else x[j] - p.nudge
            cols.append((_residuals(run(x), targets, lag) - r) / (x[j] - theta[j]))
        jac = np.array(cols).T
        held |= _unpinned(jac, held, hold_unpinned)
        jac[:, sorted(held)] = 0.0  # a held parameter's step is zero (the damping keeps the system solvable)
        improved = False
        while damping < 1e4:
            a = jac.T @ jac
            step = -np.linalg.solve(a + damping * np.diag(np.diag(a) + 1e-12), jac.T @ r)
            x = tie(np.clip(theta + step, lo, hi))
            trial = run(x)
            trial_lag = _lag_ms(trial, targets)
            r2 = _residuals(trial, targets, trial_lag)
            if float(r2 @ r2) < cost:
                improved = float(r2 @ r2) < cost * (1 - 1e-3)
                theta, means, lag, r, cost = x, trial, trial_lag, r2, float(r2 @ r2)
                damping = max(damping / 3, 1e-4)
                break
            damping *= 4
        if log is not None:
            log(f"iteration {it}: cost {cost:.4f}, " + ", ".join(f"{p.name} {v:.4g}" for p, v in zip(PARAMS, theta))
                + f", client-side {lag:.2f} ms")
        if not improved:
            break
    prompt = float(np.mean([t.prompt_tokens for t in targets]))
    # a parameter that follows another and could not be pinned is left out: unset, it follows
    out = Fit({p.name: round(float(v), 4) for j, (p, v) in enumerate(zip(PARAMS, theta))
               if not (j in held and p.follows is not None)}, _serving(lag, prompt), cost, it)
    out.unpinned = [PARAMS[j].name for j in sorted(held)]
    out.predicted = {t.name: m.metrics(lag) for t, m in zip(targets, means)}
    return out


def error_pct(predicted: dict[str, float], measured: dict[str, float]) -> dict[str, float]:
    return {k: (predicted[k] - measured[k]) / measured[k] * 100.0 for k in METRICS}


def mape(errors: Sequence[dict[str, float]]) -> dict[str, float | None]:
    return {k: (float(np.mean([abs(e[k]) for e in errors])) if errors else None) for k in METRICS}


def followed(step_model: dict[str, float]) -> dict[str, float]:
    """`step_model` with every term the fit left out to follow another set to that one's value. A
    held-out replay is given it whole: a key left unset would be read from the GPU's shipped
    defaults, themselves a fit that saw the held-out model (the shipped expert_mbu, fitted on the
    one MoE model, would stand in for what its fold could not pin)."""
    out = dict(step_model)
    for p in PARAMS:
        if p.name not in out and p.follows in out:
            out[p.name] = out[p.follows]
    return out


def cross_validate(targets: Sequence[Target], start: dict[str, float], max_iterations: int = 8,
                   log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Leave one model out: each model's experiments predicted by a fit on the other models."""
    models = sorted({t.model for t in targets})
    if len(models) < 2:
        raise UserError("calibrate --experiments: cross-validation by model needs experiments of at least two models")
    rows = []
    for m in models:
        train = [t for t in targets if t.model != m]
        held = [t for t in targets if t.model == m]
        f = fit(train, start, max_iterations, hold_unpinned=True)
        lag = (f.serving["api_server_us"] + f.serving["token_return_us"]) / 1000.0
        for t in held:
            # the held-out prompt's own tokenising time, at the fitted per-token cost
            own = lag + f.serving["tokenize_us_per_token"] * t.prompt_tokens / 1000.0
            pred = t.replay(followed(f.step_model)).metrics(own)
            rows.append({"experiment": t.name, "model": m, "predicted": pred, "measured": dict(t.measured),
                         "error_pct": error_pct(pred, t.measured)})
        if log is not None:
            log(f"held out {m}: " + "; ".join(
                f"{r['experiment']} " + " ".join(f"{k.split('_')[0]} {r['error_pct'][k]:+.1f}%" for k in METRICS)
                for r in rows if r["model"] == m))
    return {"by": "model", "folds": len(models), "mape_pct": mape([r["error_pct"] for r in rows]), "rows": rows}
