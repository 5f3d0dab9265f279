"""Validation scenarios: a fleet, a synthetic workload and measured figures to compare with.

A scenario file (YAML) lists scenarios; each replays one synthetic trace on one fleet and checks
one or more metrics against published measurements with a relative tolerance. Parsing checks the
whole file (fleets included) before anything runs. Times are ms, throughputs tokens/s.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from common.configtools import from_dict
from common.errors import ConfigError, UserError
from replay.config import FleetConfig, load_config, read_yaml

# metric -> (group in the error summary, what it is)
METRICS: dict[str, tuple[str, str]] = {
    "output_throughput_tok_s": ("throughput", "output tokens / (last finish - first arrival)"),
    "total_throughput_tok_s": ("throughput", "(prompt + output tokens) / (last finish - first arrival)"),
    "request_throughput_rps": ("throughput", "requests / (last finish - first arrival)"),
    "ttft_mean_ms": ("ttft", "mean time to first token"),
    "ttft_p50_ms": ("ttft", "median time to first token"),
    "ttft_p99_ms": ("ttft", "99th percentile time to first token"),
    "tpot_mean_ms": ("tpot", "mean time per output token after the first (requests of > 1 output token)"),
    "tpot_p50_ms": ("tpot", "median time per output token"),
    "tpot_p99_ms": ("tpot", "99th percentile time per output token"),
    "e2e_mean_ms": ("e2e", "mean request latency (arrival to last token)"),
    "e2e_p50_ms": ("e2e", "median request latency"),
    "e2e_p99_ms": ("e2e", "99th percentile request latency"),
}
GROUPS = ("throughput", "ttft", "tpot", "e2e")
WORKLOADS = ("static-batch", "offline", "poisson")
WORKLOAD_KEYS = {
    "static-batch": {"kind", "batch", "prompt_tokens", "output_tokens"},
    "offline": {"kind", "requests", "prompt_tokens", "output_tokens"},
    "poisson": {"kind", "rate_rps", "duration_s", "requests", "prompt_tokens", "output_tokens", "lengths_from",
                "seed"},
}
SCENARIO_KEYS = {"name", "source", "fleet", "workload", "checks", "tolerance", "notes"}
CHECK_KEYS = {"metric", "expected", "tolerance", "source"}
# Validation replays run until every request finishes (a fleet's drain limit would cut a long
# offline run short and leave its slowest requests out of every figure).
DRAIN_S = 30 * 24 * 3600.0


@dataclass(frozen=True)
class Check:
    metric: str
    expected: float
    tolerance: float  # relative: |predicted - expected| / expected
    where: str  # key path, for messages


@dataclass(frozen=True)
class Workload:
    """Synthetic requests: explicit (prompt, output) pairs arriving at `arrival_us` (sorted)."""

    kind: str
    arrival_us: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    label: str  # short description for the table

    def digest(self) -> str:
        h = hashlib.sha256()
        for a in (self.arrival_us, self.prompt_tokens, self.output_tokens):
            h.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
        return h.hexdigest()


@dataclass(frozen=True)
class Scenario:
    name: str
    source: str
    fleet: FleetConfig
    fleet_where: str
    workload: Workload
    checks: tuple[Check, ...]


def _fail(path: Path, where: str, value: Any, expected: str) -> ConfigError:
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return ConfigError(f"{path}: {where}: got {shown}, expected {expected}")


def _mapping(path: Path, where: str, value: Any, allowed: set[str], required: tuple[str, ...] = ()) -> dict:
    if not isinstance(value, dict):
        raise _fail(path, where, value, "a mapping")
    for key in value:
        if key not in allowed:
            raise ConfigError(f"{path}: unknown key '{where}.{key}'; known keys: {', '.join(sorted(allowed))}")
    for key in required:
        if key not in value:
            raise ConfigError(f"{path}: missing key '{where}.{key}' (required)")
    return value


def _number(path: Path, where: str, value: Any, *, integer: bool = False, positive: bool = True) -> float:
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if ok and integer:
        ok = isinstance(value, int) or float(value).is_integer()
    if ok and (value <= 0 if positive else value < 0):
        ok = False
    if not ok:
        what = "a whole number" if integer else "a number"
        raise _fail(path, where, value, f"{what} {'> 0' if positive else '>= 0'}")
    return int(value) if integer else float(value)


def _lengths(path: Path, where: str, value: Any, count: int | None) -> np.ndarray:
    """A token count for every request, or a list of them (one per request)."""
    if isinstance(value, list):
        if not value or (count is not None and len(value) != count):
            raise _fail(path, where, value, f"a list of {count} token counts" if count else "a non-empty list")
        return np.array([_number(path, f"{where}[{i}]", v, integer=True) for i, v in enumerate(value)],
                        dtype=np.int64)
    n = _number(path, where, value, integer=True)
    if count is None:
        raise _fail(path, where, value, "a list of token counts (one per request) when 'requests' is not set")
    return np.full(count, n, dtype=np.int64)


def _workload(path: Path, where: str, raw: Any) -> Workload:
    kind = raw.get("kind") if isinstance(raw, dict) else None
    if not isinstance(raw, dict):
        raise _fail(path, where, raw, "a mapping with 'kind'")
    if kind not in WORKLOADS:
        raise _fail(path, f"{where}.kind", kind, "one of " + ", ".join(WORKLOADS))
    w = _mapping(path, where, raw, WORKLOAD_KEYS[kind])
    if kind == "static-batch":
        for key in ("batch", "prompt_tokens", "output_tokens"):
            if key not in w:
                raise ConfigError(f"{path}: missing key '{where}.{key}' (required)")
        b = _number(path, f"{where}.batch", w["batch"], integer=True)
        p = _number(path, f"{where}.prompt_tokens", w["prompt_tokens"], integer=True)
        o = _number(path, f"{where}.output_tokens", w["output_tokens"], integer=True)
        return Workload(kind, np.zeros(b, np.int64), np.full(b, p, np.int64), np.full(b, o, np.int64),
                        f"batch {b} x {p}/{o}")
    if kind == "offline":
        for key in ("prompt_tokens", "output_tokens"):
            if key not in w:
                raise ConfigError(f"{path}: missing key '{where}.{key}' (required)")
        n = _number(path, f"{where}.requests", w["requests"], integer=True) if "requests" in w else None
        if n is None:
            n = len(w["prompt_tokens"]) if isinstance(w["prompt_tokens"], list) else None
        prompt = _lengths(path, f"{where}.prompt_tokens", w["prompt_tokens"], n)
        output = _lengths(path, f"{where}.output_tokens", w["output_tokens"], len(prompt))
        label = (f"{len(prompt)} x {prompt[0]}/{output[0]} at t=0" if np.ptp(prompt) == 0 and np.ptp(output) == 0
                 else f"{len(prompt)} requests at t=0 (listed lengths)")
        return Workload(kind, np.zeros(len(prompt), np.int64), prompt, output, label)
    return _poisson(path, where, w)


def _poisson(path: Path, where: str, w: dict) -> Workload:
    if "rate_rps" not in w:
        raise ConfigError(f"{path}: missing key '{where}.rate_rps' (required)")
    rate = _number(path, f"{where}.rate_rps", w["rate_rps"])
    if ("duration_s" in w) == ("requests" in w):
        raise ConfigError(f"{path}: {where}: give exactly one of 'duration_s' and 'requests'")
    seed = _number(path, f"{where}.seed", w.get("seed", 0), integer=True, positive=False)
    rng = np.random.default_rng(int(seed))
    if "requests" in w:
        n = _number(path, f"{where}.requests", w["requests"], integer=True)
        gaps = np.rint(rng.exponential(1e6 / rate, n)).astype(np.int64)
        gaps[0] = 0
        arrival = np.cumsum(gaps)
    else:
        duration_us = _number(path, f"{where}.duration_s", w["duration_s"]) * 1e6
        # Enough draws to cover the duration with room to spare, then cut at the duration.
        draws = int(rate * duration_us / 1e6 * 1.5 + 50)
        gaps = np.rint(rng.exponential(1e6 / rate, draws)).astype(np.int64)
        gaps[0] = 0
        arrival = np.cumsum(gaps)
        arrival = arrival[arrival < duration_us]
    n = len(arrival)
    if "lengths_from" in w:
        if "prompt_tokens" in w or "output_tokens" in w:
            raise ConfigError(f"{path}: {where}: give either 'lengths_from' or 'prompt_tokens' and 'output_tokens'")
        src = w["lengths_from"]
        if not isinstance(src, str) or not src:
            raise _fail(path, f"{where}.lengths_from", src, "a bundled trace name or a trace path")
        from traces import BUNDLED, load_trace
        from traces.bundled import bundled_trace_path
        trace_path = bundled_trace_path(src) if src in BUNDLED else \
            (Path(src) if Path(src).is_absolute() else path.parent / src)
        try:
            frame = load_trace(trace_path).frame
        except UserError as exc:
            raise ConfigError(f"{path}: {where}.lengths_from: {exc}") from None
        rows = rng.integers(0, frame.height, n)
        prompt = frame["prompt_tokens"].to_numpy().astype(np.int64)[rows]
        output = frame["output_tokens"].to_numpy().astype(np.int64)[rows]
        label = f"poisson {rate:g} req/s, lengths of {src}"
    else:
        for key in ("prompt_tokens", "output_tokens"):
            if key not in w:
                raise ConfigError(f"{path}: missing key '{where}.{key}' (or give 'lengths_from')")
        prompt = np.full(n, _number(path, f"{where}.prompt_tokens", w["prompt_tokens"], integer=True), np.int64)
        output = np.full(n, _number(path, f"{where}.output_tokens", w["output_tokens"], integer=True), np.int64)
        label = f"poisson {rate:g} req/s, {prompt[0] if n else '?'}/{output[0] if n else '?'}"
    if n == 0:
        raise ConfigError(f"{path}: {where}: no request arrives within duration_s at rate_rps {rate:g}")
    return Workload("poisson", arrival, prompt, output, label)


def _fleet(path: Path, where: str, raw: Any) -> FleetConfig:
    if isinstance(raw, str):
        fleet_path = Path(raw) if Path(raw).is_absolute() else path.parent / raw
        try:
            cfg = load_config(fleet_path)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {where}: {exc}") from None
    elif isinstance(raw, dict):
        cfg = from_dict(FleetConfig, raw, where, source=str(path))
    else:
        raise _fail(path, where, raw, "a fleet config mapping or a path to one (relative to the scenario file)")
    if cfg.trace is not None:
        raise ConfigError(f"{path}: {where}.trace: the scenario's workload is the trace; remove the fleet's trace")
    from replay.fleet.cluster import plan_pools
    try:
        plan_pools(cfg, f"{path}: {where}")
    except ConfigError as exc:
        text = str(exc)
        head = f"{path}: {where}: "
        if text.startswith(head) and re.match(r"[a-z_]+(\[\d+\])?[ .:]", text[len(head):]):
            text = f"{path}: {where}.{text[len(head):]}"  # one key path, as an inline fleet's other errors
        raise ConfigError(text if text.startswith(str(path)) else f"{head}{text}") from None
    return dataclasses.replace(cfg, max_drain_s=DRAIN_S)


def _tolerance(path: Path, where: str, value: Any) -> float:
    tol = _number(path, where, value)
    if tol >= 10:
        raise _fail(path, where, value, "a relative tolerance (0.2 means 20%)")
    return tol


def load_scenarios(path: str | Path) -> list[Scenario]:
    """Every scenario of a file, fully checked; any problem is a ConfigError naming the key path."""
    path = Path(path)
    data = read_yaml(path, "scenario")
    top = _mapping(path, "top level", data, {"tolerance", "scenarios", "notes"}, ("scenarios",)) \
        if isinstance(data, dict) else None
    if top is None:
        raise _fail(path, "top level", data, "a mapping with 'scenarios' (a list)")
    default_tol = _tolerance(path, "tolerance", top["tolerance"]) if "tolerance" in top else 0.2
    items = top["scenarios"]
    if not isinstance(items, list) or not items:
        raise _fail(path, "scenarios", items, "a non-empty list of scenarios")
    out, names = [], set()
    for i, raw in enumerate(items):
        where = f"scenarios[{i}]"
        s = _mapping(path, where, raw, SCENARIO_KEYS, ("name", "source", "fleet", "workload", "checks"))
        name = s["name"]
        if not isinstance(name, str) or not name.strip():
            raise _fail(path, f"{where}.name", name, "a non-empty string")
        if name in names:
            raise _fail(path, f"{where}.name", name, "a name no other scenario uses")
        names.add(name)
        if not isinstance(s["source"], str) or not s["source"].strip():
            raise _fail(path, f"{where}.source", s["source"], "a citation: URL, table, setup")
        tol = _tolerance(path, f"{where}.tolerance", s["tolerance"]) if "tolerance" in s else default_tol
        checks_raw = s["checks"]
        if not isinstance(checks_raw, list) or not checks_raw:
            raise _fail(path, f"{where}.checks", checks_raw, "a non-empty list of {metric, expected}")
        checks = []
        for j, c in enumerate(checks_raw):
            cw = f"{where}.checks[{j}]"
            c = _mapping(path, cw, c, CHECK_KEYS, ("metric", "expected"))
            if c["metric"] not in METRICS:
                raise _fail(path, f"{cw}.metric", c["metric"], "one of " + ", ".join(METRICS))
            expected = _number(path, f"{cw}.expected", c["expected"])
            ctol = _tolerance(path, f"{cw}.tolerance", c["tolerance"]) if "tolerance" in c else tol
            checks.append(Check(c["metric"], expected, ctol, cw))
        workload = _workload(path, f"{where}.workload", s["workload"])
        fleet = _fleet(path, f"{where}.fleet", s["fleet"])
        out.append(Scenario(name, s["source"].strip(), fleet, f"{where}.fleet", workload, tuple(checks)))
    return out


def workload_trace(w: Workload, name: str):
    """The workload as a LoadedTrace the replay takes."""
    from traces import LoadedTrace, cast_to_schema

    frame = cast_to_schema(pl.DataFrame({"arrival_us": w.arrival_us, "prompt_tokens": w.prompt_tokens,
                                         "output_tokens": w.output_tokens}), source=name)
    return LoadedTrace(frame, f"scenario {name}", "synthetic", None, w.digest(), {}, 0)


def measure(requests: pl.DataFrame) -> dict[str, float | None]:
    """Every metric of METRICS from a replay's requests frame (times in ms, percentiles linear as
    numpy's and vLLM's benchmark scripts compute them)."""
    done = requests.filter(pl.col("status") == "finished")
    out: dict[str, float | None] = dict.fromkeys(METRICS)
    if done.height == 0:
        return out
    span_s = (int(done["finished_us"].max()) - int(requests["arrival_us"].min())) / 1e6
    out_tokens = float(done["output_tokens"].cast(pl.Int64).sum())
    all_tokens = out_tokens + float(done["prompt_tokens"].cast(pl.Int64).sum())
    if span_s > 0:
        out["output_throughput_tok_s"] = out_tokens / span_s
        out["total_throughput_tok_s"] = all_tokens / span_s
        out["request_throughput_rps"] = done.height / span_s
    series = {"ttft": done["ttft_us"], "e2e": done["e2e_us"],
              "tpot": done.filter(pl.col("output_tokens") > 1)["tpot_us"]}
    for key, s in series.items():
        values = s.drop_nulls().to_numpy().astype(np.float64) / 1000.0
        if len(values):
            out[f"{key}_mean_ms"] = float(values.mean())
            out[f"{key}_p50_ms"] = float(np.percentile(values, 50))
            out[f"{key}_p99_ms"] = float(np.percentile(values, 99))
    return out


@dataclass(frozen=True)
class Row:
    scenario: str
    workload: str
    metric: str
    group: str
    expected: float
    predicted: float | None
    error_pct: float | None  # (predicted - expected) / expected * 100
    tolerance_pct: float
    passed: bool
    note: str
    source: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def run_scenario(s: Scenario, engine: str = "numba") -> list[Row]:
    from replay.run import replay_trace

    result = replay_trace(workload_trace(s.workload, s.name), s.fleet, engine=engine,
                          config_source=f"scenario {s.name}")
    req = result.requests
    unfinished = req.height - int((req["status"] == "finished").sum())
    note = ""
    if unfinished:
        reasons = req.filter(pl.col("status") != "finished")["reject_reason"].drop_nulls().unique().to_list()
        note = f"{unfinished} of {req.height} requests did not finish" + (f" ({', '.join(reasons)})" if reasons else "")
    values = measure(req)
    rows = []
    for c in s.checks:
        pred = values[c.metric]
        err = None if pred is None else (pred - c.expected) / c.expected * 100
        passed = err is not None and not unfinished and abs(err) <= c.tolerance * 100 + 1e-9
        rows.append(Row(s.name, s.workload.label, c.metric, METRICS[c.metric][0], c.expected, pred, err,
                        c.tolerance * 100, passed, note, s.source))
    return rows


def mape_by_group(rows: list[Row]) -> dict[str, dict[str, float | int | None]]:
    """Mean absolute percentage error per metric group, over the rows that have a prediction."""
    out = {}
    for g in GROUPS:
        errs = [abs(r.error_pct) for r in rows if r.group == g and r.error_pct is not None]
        out[g] = {"rows": len(errs), "mape_pct": float(np.mean(errs)) if errs else None}
    return out
