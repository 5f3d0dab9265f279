"""What `llm-replay plan` searches: the SLO to meet, and the GPUs, tensor-parallel sizes and weight
precisions a fleet may be built from. Each (gpu, tp, precision) is a candidate; within one, the
replicas of each pool are searched (replay/plan/search.py).

Every value a user gives is checked here, before anything is replayed: a mistake is one UserError
naming the flag, the value and what was expected.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from common.configtools import suggest
from common.errors import UserError

# A plan replays the trace once per fleet it tries; more replicas than this per pool is a fleet
# no search on one machine should price (and a config typo's way to run for hours).
MAX_REPLICAS_LIMIT = 1024
MAX_CANDIDATES = 256
SLO_KEYS = ("ttft_ms", "tpot_ms")
SLO_RANGE_MS = (0.01, 3_600_000.0)  # 10 us .. 1 h
QUANTIZATIONS = {"none": None, "bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "int8": "int8", "int4": "int4"}


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One way to build every pool's replicas: a GPU, a tensor-parallel size, a weight precision
    (None: the checkpoint's own)."""

    gpu: str
    tp: int
    weight_dtype: str | None

    @property
    def label(self) -> str:
        return f"{self.gpu} tp{self.tp} {self.weight_dtype or 'native'}"


@dataclasses.dataclass(frozen=True)
class PlanSpace:
    slo: dict[str, float]  # ttft_ms / tpot_ms given on the command line (the rest: the config's)
    attainment: float
    candidates: tuple[Candidate, ...]
    max_replicas: int


def parse_slo(text: str) -> dict[str, float]:
    """`ttft_ms=2000,tpot_ms=100` -> {"ttft_ms": 2000.0, "tpot_ms": 100.0}."""
    out: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in SLO_KEYS:
            raise UserError(f"plan: --slo: got {part!r}, expected KEY=MS with KEY one of {', '.join(SLO_KEYS)}"
                            f"{suggest(key, SLO_KEYS) if key else ''} (e.g. ttft_ms=2000,tpot_ms=100)")
        if key in out:
            raise UserError(f"plan: --slo: {key} given twice")
        try:
            ms = float(value)
        except ValueError:
            raise UserError(f"plan: --slo: {key}: got {value.strip()!r}, expected a number of milliseconds") from None
        lo, hi = SLO_RANGE_MS
        if not (math.isfinite(ms) and lo <= ms <= hi):
            raise UserError(f"plan: --slo: {key}: got {value.strip()}, expected milliseconds in [{lo:g}, {hi:g}]")
        out[key] = ms
    return out


def parse_attainment(value: float) -> float:
    if not (math.isfinite(value) and 0 < value <= 1):
        raise UserError(f"plan: --attainment: got {value:g}, expected a share of requests in (0, 1], e.g. 0.99")
    return value


def _split(flag: str, text: str) -> list[str]:
    items = [p.strip() for p in text.split(",")]
    if not all(items):
        raise UserError(f"plan: {flag}: got {text!r}, expected a comma-separated list with no empty item")
    if len(set(items)) != len(items):
        raise UserError(f"plan: {flag}: got {text!r}, an item is listed twice")
    return items


def parse_gpus(text: str) -> list[str]:
    from replay.model.gpus import GPUS

    gpus = _split("--gpu", text)
    for gpu in gpus:
        if gpu not in GPUS:
            raise UserError(f"plan: --gpu: unknown GPU {gpu!r}{suggest(gpu, GPUS)}; known: {', '.join(GPUS)}")
    return gpus


def parse_tps(text: str) -> list[int]:
    tps = []
    for item in _split("--tp", text):
        if not item.isdigit() or int(item) not in (1, 2, 4, 8, 16):
            raise UserError(f"plan: --tp: got {item!r}, expected tensor-parallel sizes from 1, 2, 4, 8, 16")
        tps.append(int(item))
    return tps


def parse_quantizations(text: str) -> list[str | None]:
    out = []
    for item in _split("--quantization", text):
        if item.lower() not in QUANTIZATIONS:
            raise UserError(f"plan: --quantization: got {item!r}{suggest(item.lower(), QUANTIZATIONS)}, expected "
                            f"one of {', '.join(QUANTIZATIONS)} (none: the checkpoint's own weights)")
        out.append(QUANTIZATIONS[item.lower()])
    return out


def build_space(slo: str | None, attainment: float, gpus: Sequence[str], tps: Sequence[int],
                quantizations: Sequence[str | None], max_replicas: int) -> PlanSpace:
    if not 1 <= max_replicas <= MAX_REPLICAS_LIMIT:
        raise UserError(f"plan: --max-replicas: got {max_replicas}, expected 1 .. {MAX_REPLICAS_LIMIT}")
    candidates = tuple(Candidate(g, t, q) for g in gpus for t in tps for q in quantizations)
    if len(candidates) > MAX_CANDIDATES:
        raise UserError(f"plan: {len(candidates)} GPU x TP x precision candidates, expected at most "
                        f"{MAX_CANDIDATES}: list fewer with --gpu, --tp, --quantization")
    return PlanSpace(parse_slo(slo) if slo else {}, parse_attainment(attainment), candidates, max_replicas)
