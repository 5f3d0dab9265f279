"""The synth spec: what `llm-replay synth SPEC.yaml` and `trace: {synthetic: SPEC}` generate.

One spec is a seed, a duration, a hash block size and a list of workloads; each workload is an
arrival process (or ServeGen clients), two length distributions and optional labels, system
prompts and sessions. Every section is a frozen dataclass built by common.configtools.from_dict,
so an unknown key names the nearest known one, and every number is checked here (a rate <= 0, a
negative CV) before anything is generated. README "Workloads" shows a full spec.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable
from typing import Any

from common.configtools import from_dict
from common.errors import ConfigError
from common.yamlfile import read_yaml
from traces.limits import DEFAULT_MAX_ROWS, DEFAULT_MAX_SPAN_S

PROCESSES = ("poisson", "gamma", "weibull", "constant")
DISTS = ("constant", "uniform", "lognormal", "empirical", "pmf", "servegen")
MAX_TOKENS = 2**31 - 1
MAX_WORKLOADS = 1_000
MAX_TABLE = 100_000  # curve points, bursts, PMF entries
MAX_RATE = 1e6  # requests per second of one workload


def _pos(name: str, value: float | None, allow_zero: bool = False) -> None:
    if value is None:
        return
    ok = math.isfinite(value) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        raise ValueError(f"{name}: got {value!r}, expected a number {'>= 0' if allow_zero else '> 0'}")


def _known(name: str, value: str, known: tuple[str, ...]) -> None:
    if value not in known:
        close = difflib.get_close_matches(value, known, n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"{name}: unknown {value!r}{hint}; known: {', '.join(known)}")


@dataclass(frozen=True)
class Dist:
    """A distribution of token counts (or of seconds, for think times). `min`/`max` clip samples."""

    dist: str
    value: float | None = None  # constant
    low: float | None = None  # uniform [low, high]
    high: float | None = None
    median: float | None = None  # lognormal: median and sigma (of the log), or mean and cv
    sigma: float | None = None
    mean: float | None = None
    cv: float | None = None
    trace: str | None = None  # empirical: a trace file or bundled name, and its column
    column: str = "prompt_tokens"
    values: dict[str, float] | None = None  # pmf: value -> weight
    path: str | None = None  # servegen: a chunk-<id>-dataset.json[.gz] and its field
    field: str | None = None
    min: float | None = None
    max: float | None = None

    def __post_init__(self):
        _known("dist", self.dist, DISTS)
        for name in ("value", "low", "high", "median", "sigma", "mean", "min", "max"):
            _pos(name, getattr(self, name), allow_zero=True)
        _pos("cv", self.cv, allow_zero=True)
        need = {"constant": ("value",), "uniform": ("low", "high"), "empirical": ("trace",), "pmf": ("values",),
                "servegen": ("path", "field")}.get(self.dist, ())
        for name in need:
            if getattr(self, name) is None:
                raise ValueError(f"{name}: missing (dist {self.dist!r} needs {', '.join(need)})")
        if self.dist == "lognormal":
            if (self.median is None or self.sigma is None) == (self.mean is None or self.cv is None):
                raise ValueError("median: a lognormal needs median and sigma, or mean and cv")
            _pos("median" if self.median is not None else "mean", self.median or self.mean)
        if self.dist == "uniform" and self.low > self.high:
            raise ValueError(f"low: got {self.low}, expected <= high={self.high}")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min: got {self.min}, expected <= max={self.max}")
        if self.dist == "empirical" and self.column not in ("prompt_tokens", "output_tokens"):
            raise ValueError(f"column: got {self.column!r}, expected prompt_tokens or output_tokens")
        if self.values is not None:
            if not self.values or len(self.values) > MAX_TABLE:
                raise ValueError(f"values: {len(self.values)} entries, expected 1..{MAX_TABLE:,}")
            for key, weight in self.values.items():
                _pos(f"values.{key}", weight, allow_zero=True)
            if sum(self.values.values()) <= 0:
                raise ValueError("values: every weight is 0 (expected some weight > 0)")


@dataclass(frozen=True)
class Burst:
    """The rate times `factor` in [at_s, at_s + duration_s)."""

    at_s: float
    duration_s: float
    factor: float

    def __post_init__(self):
        _pos("at_s", self.at_s, allow_zero=True)
        _pos("duration_s", self.duration_s)
        _pos("factor", self.factor)


@dataclass(frozen=True)
class Diurnal:
    """A sinusoid over the rate: rate * (1 + amplitude * cos(2 pi (t - peak_s) / period_s))."""

    amplitude: float = 0.5
    peak_s: float = 50_400.0  # 14:00
    period_s: float = 86_400.0

    def __post_init__(self):
        if not (math.isfinite(self.amplitude) and 0 <= self.amplitude <= 1):
            raise ValueError(f"amplitude: got {self.amplitude!r}, expected a number in [0, 1]")
        _pos("peak_s", self.peak_s, allow_zero=True)
        _pos("period_s", self.period_s)


@dataclass(frozen=True)
class Arrival:
    """Gaps from `process` (with coefficient of variation `cv`, or a Gamma/Weibull `shape`) at a
    rate that is `rate`, or the piecewise-linear `curve` of (time_s, rate) points, times the
    `diurnal` sinusoid and each burst's factor, held constant over each `window_s`."""

    process: str = "poisson"
    rate: float | None = None
    curve: tuple[tuple[float, float], ...] | None = None
    cv: float | None = None
    shape: float | None = None
    diurnal: Diurnal | None = None
    bursts: tuple[Burst, ...] = ()
    window_s: float = 60.0

    def __post_init__(self):
        _known("process", self.process, PROCESSES)
        if (self.rate is None) == (self.curve is None):
            raise ValueError("rate: give rate (requests/s) or curve ([[time_s, rate], ...]), one of them")
        if self.rate is not None and not (math.isfinite(self.rate) and 0 < self.rate <= MAX_RATE):
            raise ValueError(f"rate: got {self.rate!r}, expected requests/s > 0 and <= {MAX_RATE:g}")
        if self.curve is not None:
            if not 1 <= len(self.curve) <= MAX_TABLE:
                raise ValueError(f"curve: {len(self.curve)} points, expected 1..{MAX_TABLE:,}")
            times = [p[0] if len(p) == 2 else None for p in self.curve]
            if None in times:
                raise ValueError("curve: expected [time_s, rate] pairs")
            if times != sorted(times) or times[0] < 0:
                raise ValueError("curve: expected times >= 0 in increasing order")
            for t, r in self.curve:
                if not (math.isfinite(r) and 0 <= r <= MAX_RATE):
                    raise ValueError(f"curve: rate {r!r} at {t} s, expected requests/s in [0, {MAX_RATE:g}]")
        _pos("cv", self.cv)
        _pos("shape", self.shape)
        if self.process in ("poisson", "constant") and (self.cv is not None or self.shape is not None):
            raise ValueError(f"cv: a {self.process} process has no cv or shape (its cv is "
                             f"{1 if self.process == 'poisson' else 0})")
        if self.process in ("gamma", "weibull") and (self.cv is None) == (self.shape is None):
            raise ValueError(f"cv: a {self.process} process needs cv or shape, one of them")
        if len(self.bursts) > MAX_TABLE:
            raise ValueError(f"bursts: {len(self.bursts)}, expected at most {MAX_TABLE:,}")
        if not (math.isfinite(self.window_s) and 1e-3 <= self.window_s <= 86_400):
            raise ValueError(f"window_s: got {self.window_s!r}, expected seconds in [0.001, 86400]")


@dataclass(frozen=True)
class ServeGen:
    """ServeGen clients (`chunk-<id>-trace.csv[.gz]` in `path`): their 10-minute rate windows from
    `start_s` of the data on. `clients` None: every client of the folder."""

    path: str
    clients: tuple[str, ...] | None = None
    start_s: float = 0.0
    rate_scale: float = 1.0

    def __post_init__(self):
        _pos("start_s", self.start_s, allow_zero=True)
        _pos("rate_scale", self.rate_scale)
        if self.clients is not None and not self.clients:
            raise ValueError("clients: an empty list (expected client ids, or leave it out for all)")


@dataclass(frozen=True)
class SystemPrompt:
    """`share` of the requests (sessions) start with one of `groups` shared system prompts of
    `tokens` tokens, each group one hash namespace (`namespace` shares it across workloads)."""

    tokens: int
    groups: int = 1
    share: float = 1.0
    namespace: str | None = None

    def __post_init__(self):
        if not 1 <= self.tokens <= 10_000_000:
            raise ValueError(f"tokens: got {self.tokens}, expected 1..10,000,000")
        if not 1 <= self.groups <= 1_000_000:
            raise ValueError(f"groups: got {self.groups}, expected 1..1,000,000")
        if not (math.isfinite(self.share) and 0 <= self.share <= 1):
            raise ValueError(f"share: got {self.share!r}, expected a number in [0, 1]")


@dataclass(frozen=True)
class Sessions:
    """Arrivals start sessions of `turns` turns; each next turn's prompt is the context so far
    (previous prompt + answer) plus a new question drawn from the workload's `prompt`. Its
    recorded arrival is the previous one plus an estimated latency (ttft_s + tpot_s per output
    token) plus `think_s` (for `agentic` chains: the tool time)."""

    turns: Dist
    think_s: Dist
    agentic: bool = False
    ttft_s: float = 0.5
    tpot_s: float = 0.03
    max_context_tokens: int = 131_072

    def __post_init__(self):
        _pos("ttft_s", self.ttft_s, allow_zero=True)
        _pos("tpot_s", self.tpot_s, allow_zero=True)
        if not 1 <= self.max_context_tokens <= MAX_TOKENS:
            raise ValueError(f"max_context_tokens: got {self.max_context_tokens}, expected 1..{MAX_TOKENS:,}")


@dataclass(frozen=True)
class Workload:
    name: str
    arrival: Arrival | None = None
    servegen: ServeGen | None = None
    prompt: Dist | None = None
    output: Dist | None = None
    tenant: str | None = None  # default: the workload's name (ServeGen: client-<id>)
    priority: int = 0
    adapters: tuple[str, ...] = ()  # LoRA ids, one drawn per request (session) with equal weight
    adapter_share: float = 1.0
    system_prompt: SystemPrompt | None = None
    sessions: Sessions | None = None

    def __post_init__(self):
        if not self.name or len(self.name) > 200:
            raise ValueError(f"name: got {self.name!r}, expected a label of 1..200 characters")
        if (self.arrival is None) == (self.servegen is None):
            raise ValueError("arrival: give arrival or servegen, one of them")
        if self.servegen is None and (self.prompt is None or self.output is None):
            raise ValueError(f"{'prompt' if self.prompt is None else 'output'}: missing (a length distribution)")
        if self.sessions is not None and self.servegen is not None:
            raise ValueError("sessions: not with servegen clients (their windows count requests, not sessions)")
        if not (math.isfinite(self.adapter_share) and 0 <= self.adapter_share <= 1):
            raise ValueError(f"adapter_share: got {self.adapter_share!r}, expected a number in [0, 1]")
        if not -(2**31) <= self.priority < 2**31:
            raise ValueError(f"priority: got {self.priority}, expected an int32")


@dataclass(frozen=True)
class Spec:
    duration_s: float
    workloads: tuple[Workload, ...]
    seed: int = 0
    prefix_block_tokens: int = 16  # vLLM's default KV block: a session's hit covers the answer
    max_requests: int = DEFAULT_MAX_ROWS
    namespace: str = "synth"  # prefix-hash namespace: two specs with the same one share prompts

    def __post_init__(self):
        if not (math.isfinite(self.duration_s) and 0 < self.duration_s <= DEFAULT_MAX_SPAN_S):
            raise ValueError(f"duration_s: got {self.duration_s!r}, expected seconds in (0, {DEFAULT_MAX_SPAN_S:,.0f}]")
        if not 1 <= len(self.workloads) <= MAX_WORKLOADS:
            raise ValueError(f"workloads: {len(self.workloads)}, expected 1..{MAX_WORKLOADS}")
        names = [w.name for w in self.workloads]
        for name in names:
            if names.count(name) > 1:
                raise ValueError(f"workloads: name {name!r} appears twice")
        if not 1 <= self.prefix_block_tokens <= 1 << 20:
            raise ValueError(f"prefix_block_tokens: got {self.prefix_block_tokens}, expected 1..1,048,576")
        if not 1 <= self.max_requests <= 2**31:
            raise ValueError(f"max_requests: got {self.max_requests}, expected 1..{2**31:,}")


def parse_spec(data: Any, source: str) -> Spec:
    return from_dict(Spec, data, "", source)


def load_spec(spec: str | dict, base_dir: str | Path | None = None) -> tuple[Spec, Path | None, str]:
    """(the spec, the folder its relative paths start from, its name in messages) from a file
    path or an inline mapping (whose paths are relative to `base_dir`)."""
    if isinstance(spec, dict):
        return parse_spec(spec, "trace.synthetic"), Path(base_dir) if base_dir else None, "trace.synthetic"
    if not isinstance(spec, str) or not spec:
        raise ConfigError(f"synth spec: got {spec!r}, expected a YAML file or a mapping")
    path = Path(spec).expanduser()
    if base_dir is not None and not path.is_absolute():
        path = Path(base_dir) / path
    if not path.is_file():
        raise ConfigError(f"{spec}: no such spec file")
    return parse_spec(read_yaml(path, "synth spec"), str(spec)), path.parent, str(spec)


def with_absolute_paths(data: Any, absolute: Callable[[str], str], key: str = "") -> Any:
    """An inline spec mapping with every file it names passed through `absolute`, so that a run's
    recorded config.yaml replays from any working directory: a length distribution's `trace`
    (empirical) and `path` (servegen's dataset), and a ServeGen workload's folder (`servegen.path`)."""
    if isinstance(data, list):
        return [with_absolute_paths(item, absolute, key) for item in data]
    if not isinstance(data, dict):
        return data
    names = ("trace", "path") if "dist" in data else ("path",) if key == "servegen" else ()
    return {k: absolute(v) if k in names and isinstance(v, str) else with_absolute_paths(v, absolute, k)
            for k, v in data.items()}


def with_defaults(spec: Spec, **changes: Any) -> Spec:
    return dataclasses.replace(spec, **changes)
