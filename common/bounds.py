"""Every numeric config key's sane range, in one table, checked before a config is built.

The config dataclasses check what their values mean (a share in (0, 1], max >= min); this
table is the envelope around all of them, so that no number reaches numpy or the clock that
cannot be meant: `replicas: 1000000` (189 GiB of replica state), `tick_s: 1e300` (an int64
overflow), `load_bytes_per_s: 1e-300` (a replica that loads for 1e290 years). A key is found by
`Class.key`, then by `key`, then by the unit its name ends in (`_s`, `_ms`, `_bytes_per_s`,
...); tests/unit/test_config_bounds.py walks every numeric field of every config section and
fails on one this table does not cover.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Bound:
    lo: float
    hi: float
    what: str  # the unit: "seconds", "replicas per pool", ...

    def expected(self) -> str:
        return f">= {_num(self.lo)} and <= {_num(self.hi)} ({self.what})"

    def holds(self, value: float) -> bool:
        # ints compare exactly however long they are (float() of 10**400 would overflow)
        return (isinstance(value, int) or math.isfinite(value)) and self.lo <= value <= self.hi


def _num(x: float) -> str:
    """Bounds as a person reads them: ints exactly (9,223,372,036,854,775,807, never 9.22337e+18),
    round powers of ten as 1e+15, other floats to three significant digits."""
    if isinstance(x, int):
        return f"{x:,}"
    if float(x).is_integer() and abs(x) < 1e7:
        return f"{int(x):,}"
    return f"{x:g}"


SHARE = Bound(0, 1, "a share")
# mfu / mbu / link efficiency: below 1% a step outlasts any trace, and far below it the kernel's
# integer step time overflows into 0 us (1e-15 read as instant steps and a healthy run).
MIN_EFFICIENCY = 0.01
EFFICIENCY = Bound(MIN_EFFICIENCY, 1, "an efficiency: a share of the GPU's peak")
SECONDS = Bound(0, 1e8, "seconds")  # about 3 years: far past any trace, far below int64 microseconds
TOKENS = Bound(0, 100_000_000, "tokens")
COUNT = Bound(0, 1e9, "a count")
FACTOR = Bound(0, 1e6, "a factor")
REPLICAS = Bound(0, 1024, "replicas per pool")
GPUS = Bound(1, 512, "GPUs")

BY_NAME: dict[str, Bound] = {
    # fleet
    "seed": Bound(0, 2**63 - 1, "a seed"),
    "tick_s": Bound(1e-6, 3600, "seconds"),
    "metrics_window_s": Bound(1e-6, 7 * 86400, "seconds"),
    "price_usd_per_gpu_hour": Bound(0, 10_000, "USD per GPU-hour"),
    "ttft_ms": Bound(0, 3.6e6, "milliseconds"),
    "tpot_ms": Bound(0, 3.6e6, "milliseconds"),
    # pools and engines (vLLM's own limits are lower for most of these)
    "replicas": REPLICAS,
    "min_replicas": REPLICAS,
    "max_replicas": REPLICAS,
    "tensor_parallel_size": GPUS,
    "draft_tensor_parallel_size": GPUS,
    "max_num_seqs": Bound(1, 65_536, "sequences per step"),
    "max_num_batched_tokens": Bound(1, 16_777_216, "tokens per step"),
    "block_size": Bound(1, 128, "tokens per block"),
    "num_gpu_blocks_override": Bound(1, 4_194_304, "KV blocks per replica"),
    "gpu_memory_bytes": Bound(1e9, 1e13, "bytes of memory per GPU"),
    "num_speculative_tokens": Bound(1, 64, "draft tokens"),
    "max_loras": Bound(1, 1024, "LoRA slots"),
    "max_lora_rank": Bound(1, 512, "a LoRA rank"),
    "max_cudagraph_capture_size": Bound(1, 16_777_216, "tokens per step"),
    "tokenize_us_per_token": Bound(0, 1e5, "microseconds per prompt token"),
    "decode_window_steps": Bound(1, 1024, "decode steps per window"),
    "swap_space_gib": Bound(0, 1e5, "GiB"),
    "moe_load_imbalance": Bound(1, 1000, "the busiest GPU's load over the mean"),
    "gpu_memory_utilization": SHARE,
    "watermark": SHARE,
    "acceptance_rate": SHARE,
    "mfu": EFFICIENCY,
    "mbu": EFFICIENCY,
    "attention_mbu": EFFICIENCY,
    "expert_mbu": EFFICIENCY,
    "link_efficiency": EFFICIENCY,
    # trace
    "rate_scale": Bound(1e-6, 1e6, "a rate factor"),
    "fraction": SHARE,
    "n": COUNT,
    "start_s": SECONDS,
    "end_s": SECONDS,
    "offset_s": SECONDS,
    # trace what-ifs (traces/whatif.py): rate and prompt factors
    "scale_workload": Bound(1e-6, 1e3, "a rate factor"),
    "grow_rate": Bound(1e-6, 1e3, "a rate factor"),
    "grow_prompts": Bound(1e-6, 1e3, "a prompt-length factor"),
    "factor": Bound(1e-6, 1e3, "a rate factor"),
    # observed metrics: the wall time of trace time 0, Unix seconds to 2099
    "ObservedConfig.offset_s": Bound(0, 4.1e9, "Unix seconds"),
    "prefix_block_tokens": Bound(1, 1_048_576, "tokens per hashed block"),
    # admission and autoscaler parameters
    "max_waiting": COUNT,
    "waiting_per_replica": COUNT,
    "shed_priority_from": Bound(-(2**31), 2**31 - 1, "a priority"),
    "ttft_multiple": FACTOR,
    "tolerance": SHARE,
    "target": COUNT,
    "target_gpu_busy": SHARE,
    "target_kv_usage": SHARE,
    "target_utilization": SHARE,
    "kv_cache_threshold": SHARE,
    "scale_up_threshold": SHARE,
    "scale_down_boundary": SHARE,
    "target_waiting_per_replica": COUNT,
    "target_ongoing_requests": COUNT,
    "scale_up_limit_minimum": COUNT,
    "container_concurrency": COUNT,
    "container_concurrency_target_default": COUNT,
    "load_prediction_window_size": COUNT,
    "min_endpoint": COUNT,
    # `capacity --flops`: a GFLOP/s to a thousand times a GB200 NVL72 rack
    "flops": Bound(1e9, 1e21, "FLOP/s"),
}

# By the unit the name ends in; the first match wins, so the longer suffixes come first.
BY_SUFFIX: tuple[tuple[str, Bound], ...] = (
    ("_bytes_per_s", Bound(1e6, 1e15, "bytes/s")),
    ("_tokens_per_s", Bound(0, 1e12, "tokens/s")),
    ("_tokens", TOKENS),
    ("_token_threshold", TOKENS),
    ("_prefill_threshold", TOKENS),
    ("_thresholds", TOKENS),
    ("_len", TOKENS),
    ("_mfu", EFFICIENCY),
    ("_us", Bound(0, 1e7, "microseconds")),
    ("_ms", Bound(0, 3.6e6, "milliseconds")),
    ("_s", SECONDS),
    ("_percentage", Bound(0, 1e5, "percent")),
    ("_factor", FACTOR),
    ("_rate", FACTOR),
)


def bound_for(owner: type | None, name: str) -> Bound | None:
    """The range of key `name` of config section `owner` (a dataclass), or None if none is known."""
    if owner is not None and f"{owner.__name__}.{name}" in BY_NAME:
        return BY_NAME[f"{owner.__name__}.{name}"]
    if name in BY_NAME:
        return BY_NAME[name]
    for suffix, bound in BY_SUFFIX:
        if name.endswith(suffix):
            return bound
    return None


def out_of_bounds(owner: type | None, name: str, value: Any) -> str | None:
    """None when `value` (a number, or a list of numbers) is within key `name`'s range; else
    what was expected, for the message. Non-numbers are the type check's business."""
    bound = bound_for(owner, name)
    if bound is None:
        return None
    values = value if isinstance(value, (list, tuple)) else tuple(value.values()) if isinstance(value, dict) else (value,)
    for v in values:
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not bound.holds(v):
            return bound.expected()
    return None


def first_out_of_bounds(obj: Any) -> tuple[str, Any, str] | None:
    """(key, value, expected) of the first field of dataclass instance `obj` outside its range."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        problem = out_of_bounds(type(obj), f.name, value)
        if problem is not None:
            return f.name, value, problem
    return None
