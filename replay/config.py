"""Fleet config: YAML through the bounded loader (common/yamlfile.py) into frozen dataclasses; unknown keys are errors.

Engine arguments use vLLM's names and defaults (`vllm/engine/arg_utils.py`, `vllm/config`).
Times in config are in the unit their key names (`_ms`, `_s`, `_us`).
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

import yaml

from common.configtools import from_dict, suggest
from common.errors import ConfigError
from common.yamlfile import read_yaml  # noqa: F401 - replay.validate reads scenarios through it
from policies.plugins import load_plugins
from policies.registry import QUEUE_ORDERS, SPLITS, router_params
from policies.user_config import not_found
from replay.policy_config import (  # noqa: F401 - re-exported: the fleet config's policy sections
    LINK_PRESETS, AdmissionConfig, AutoscalerConfig, PreemptionConfig, SplitConfig, user_choice,
)
from traces import TraceConfig
from traces.observed.config import ObservedConfig



def _positive(name: str, value: int) -> None:
    if value <= 0:
        raise ValueError(f"{name}: got {value}, expected a whole number > 0")


SPEC_METHODS = ("ngram", "eagle", "eagle3", "mtp", "draft_model")
# vLLM's LoRAConfig accepts these ranks (`possible_max_ranks`).
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
QUANTIZATIONS = ("fp8", "int8", "awq", "gptq", "mxfp4", "nvfp4", "modelopt_fp4")


@dataclass(frozen=True)
class SpeculativeConfig:
    """vLLM's `speculative_config`: a proposer (`method`; `model` for a separate draft model),
    `num_speculative_tokens` drafts per step, verified in one target step. `acceptance_rate` (not
    a vLLM key) is the probability each draft token is accepted, as vLLM's spec-decode metrics
    report it; a verify step then yields (1 - a^(k+1)) / (1 - a) tokens on average."""

    method: str | None = None
    model: str | None = None
    num_speculative_tokens: int | None = None
    acceptance_rate: float | None = None
    draft_tensor_parallel_size: int | None = None

    def __post_init__(self) -> None:
        method = self.method
        if method is None and self.model is None:
            raise ValueError("method: missing; expected one of " + ", ".join(SPEC_METHODS) + " (or a draft model)")
        if method is not None and method not in SPEC_METHODS:
            raise ValueError(f"method: got {method!r}, expected one of {', '.join(SPEC_METHODS)}")
        if (method or "draft_model") == "draft_model" and self.model is None:
            raise ValueError("model: the draft_model method needs the draft model's catalog id")
        if self.num_speculative_tokens is None or not 1 <= self.num_speculative_tokens <= 64:
            raise ValueError(f"num_speculative_tokens: got {self.num_speculative_tokens}, expected 1 to 64")
        if self.acceptance_rate is None or not 0.0 <= self.acceptance_rate < 1.0:
            raise ValueError(f"acceptance_rate: got {self.acceptance_rate}, expected the per-token acceptance "
                             "probability in [0, 1) (vLLM's spec-decode metrics report it)")
        if self.draft_tensor_parallel_size is not None:
            _positive("draft_tensor_parallel_size", self.draft_tensor_parallel_size)

    @property
    def proposer(self) -> str:
        return self.method or "draft_model"


@dataclass(frozen=True)
class EngineArgs:
    """vLLM engine arguments (names and defaults as vLLM's V1 engine on a datacenter GPU)."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    kv_cache_dtype: str = "auto"
    num_gpu_blocks_override: int | None = None
    # 0 means "no per-request cap on a prefill chunk" as in vLLM.
    long_prefill_token_threshold: int = 0
    # None: the model's own context length.
    max_model_len: int | None = None
    # Which waiting request is admitted next (vLLM: fcfs | priority; llm-replay adds more).
    scheduling_policy: str = "fcfs"
    # Weight quantization method (vLLM --quantization); None: the checkpoint's own format (or the
    # pool's weight_dtype).
    quantization: str | None = None
    speculative_config: SpeculativeConfig | None = None
    # Multi-LoRA (vLLM --enable-lora, --max-loras, --max-lora-rank): GPU slots for adapters and
    # the rank every slot is sized for.
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    # MoE experts split whole over the replica's GPUs, with all-to-all (vLLM --enable-expert-parallel).
    enable_expert_parallel: bool = False
    # vLLM --async-scheduling, on by default since v0.14 (vllm-project/vllm#27614): the engine
    # schedules step k+1 while step k runs, so a request that arrives during step k waits for k+2.
    async_scheduling: bool = True
    # CUDA graphs: --enforce-eager turns them off; the largest capture size (vLLM's
    # compilation_config.max_cudagraph_capture_size; None: min(2 x max_num_seqs, 512)).
    enforce_eager: bool = False
    max_cudagraph_capture_size: int | None = None

    def __post_init__(self) -> None:
        _positive("max_num_seqs", self.max_num_seqs)
        _positive("max_num_batched_tokens", self.max_num_batched_tokens)
        if self.block_size not in (1, 2, 4, 8, 16, 32, 64, 128):
            raise ValueError(f"block_size: got {self.block_size}, expected a power of 2 from 1 to 128")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization: got {self.gpu_memory_utilization}, expected a value in (0, 1]"
            )
        if self.num_gpu_blocks_override is not None:
            _positive("num_gpu_blocks_override", self.num_gpu_blocks_override)
        if self.long_prefill_token_threshold < 0:
            raise ValueError(
                f"long_prefill_token_threshold: got {self.long_prefill_token_threshold}, expected >= 0"
            )
        if self.max_model_len is not None:
            _positive("max_model_len", self.max_model_len)
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization: got {self.quantization!r}, expected one of {', '.join(QUANTIZATIONS)}")
        _positive("max_loras", self.max_loras)
        if self.max_cudagraph_capture_size is not None:
            _positive("max_cudagraph_capture_size", self.max_cudagraph_capture_size)
        if self.max_lora_rank not in LORA_RANKS:
            raise ValueError(f"max_lora_rank: got {self.max_lora_rank}, expected one of "
                             f"{', '.join(map(str, LORA_RANKS))}")
        policy = self.scheduling_policy
        if policy not in QUEUE_ORDERS and user_choice("scheduling_policy", policy, "queue order") is None:
            raise ValueError(f"scheduling_policy: unknown queue order {self.scheduling_policy!r}"
                             f"{suggest(self.scheduling_policy, QUEUE_ORDERS)}; "
                             f"{not_found(sorted(QUEUE_ORDERS))}")


# step_model keys the table backend has no use for (StepModelArgs refuses them beside it).
TABLE_UNUSED = ("mfu", "per_step_overhead_us", "per_seq_overhead_us", "prefill_overhead_us", "allreduce_latency_us",
                "knee_tokens", "past_knee_mfu", "link_efficiency", "profile", "all_to_all_bytes_per_s")


@dataclass(frozen=True)
class StepModelArgs:
    """Roofline efficiencies and overheads (see replay/model/stepmodel.py). Keys set here win over
    `profile`: a file `llm-replay calibrate` wrote (relative to the config file), `splitwise`
    (the shipped Splitwise calibration of the pool's GPU) or `vidur` (the pool's GPU's kernel
    efficiencies fitted to Vidur's profiles; replay/profiles/). Unset: stepmodel's defaults."""

    mfu: float | None = None
    mbu: float | None = None
    # KV reads and writes' share of HBM bandwidth (None: mbu's); replay/model/stepmodel.py KV_BYTES_RATE.
    attention_mbu: float | None = None
    # Routed MoE experts' share of HBM bandwidth (None: mbu's); replay/model/stepmodel.py EXPERT_BYTES_RATE.
    expert_mbu: float | None = None
    per_step_overhead_us: float | None = None
    per_seq_overhead_us: float | None = None
    prefill_overhead_us: float | None = None
    allreduce_latency_us: float | None = None
    # The matmul knee (replay/model/stepmodel.py): a step's tokens past knee_tokens compute at
    # past_knee_mfu. Calibration sets both where the data bend; 0 turns a profile's knee off.
    knee_tokens: int | None = None
    past_knee_mfu: float | None = None
    # Share of the GPU's interconnect bandwidth the TP all-reduce attains (defaults: fitted per GPU).
    link_efficiency: float | None = None
    profile: str | None = None
    # MoE under expert parallelism: the busiest GPU's expert load over the mean (1.0 = perfectly
    # balanced, as with EPLB; ref 000 section 07 measures 1.16x for a uniform router at 8K
    # tokens and 8.75x for a popularity-skewed one), and the all-to-all's bytes/s per GPU
    # (None: the GPU's interconnect, one direction).
    moe_load_imbalance: float = 1.0
    all_to_all_bytes_per_s: float | None = None
    # `table`: step times interpolated over the measured steps of `table` (a CSV in calibrate's
    # `table_format`, relative to the config file) instead of the roofline's formula.
    backend: str = "roofline"
    table: str | None = None
    table_format: str = "generic"

    def __post_init__(self) -> None:
        if self.backend not in ("roofline", "table"):
            raise ValueError(f"backend: got {self.backend!r}, expected 'roofline' or 'table'")
        if (self.backend == "table") != (self.table is not None):
            raise ValueError("table: the table backend needs a table of measured steps (and only it reads one); "
                             f"got backend {self.backend!r} with table {self.table!r}")
        if self.backend == "table":
            # the table's measured times replace the roofline's; only mbu still prices something
            # (decode context beyond the table's, at the KV-read rate)
            unused = [name for name in TABLE_UNUSED if getattr(self, name) is not None]
            unused += ["moe_load_imbalance"] if self.moe_load_imbalance != 1.0 else []
            if unused:
                raise ValueError(f"{unused[0]}: not used by the table backend (its step times come from the table; "
                                 "only mbu applies, to decode context beyond the table's); remove it or use the "
                                 "roofline")
        if self.table_format not in ("generic", "splitwise"):
            raise ValueError(f"table_format: got {self.table_format!r}, expected 'generic' or 'splitwise'")
        for name in ("mfu", "mbu", "past_knee_mfu", "link_efficiency"):
            value = getattr(self, name)
            if value is not None and not 0.0 < value <= 1.0:
                raise ValueError(f"{name}: got {value}, expected a value in (0, 1]")
        for name in ("per_step_overhead_us", "per_seq_overhead_us", "prefill_overhead_us", "allreduce_latency_us",
                     "knee_tokens"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name}: got {value}, expected >= 0")
        if not self.moe_load_imbalance >= 1.0:
            raise ValueError(f"moe_load_imbalance: got {self.moe_load_imbalance}, expected the busiest GPU's load "
                             "over the mean, >= 1")
        if self.all_to_all_bytes_per_s is not None and not self.all_to_all_bytes_per_s > 0:
            raise ValueError(f"all_to_all_bytes_per_s: got {self.all_to_all_bytes_per_s}, expected > 0")


@dataclass(frozen=True)
class ServingArgs:
    """What a client's latency holds outside the engine's steps (replay/model/serving.py): the API
    server's time before a request reaches the engine and the way back of each token. Unset: the
    defaults fitted to real vLLM servers (replay/model/serving.py says where they come from)."""

    api_server_us: float | None = None
    tokenize_us_per_token: float | None = None
    token_return_us: float | None = None
    # vLLM V0's multi-step scheduling (--num-scheduler-steps): decode tokens reach the client once
    # per window of this many steps, a request's last at its window's end. Unset: 1, every step (V1).
    decode_window_steps: int | None = None
    # vLLM V0's engine (v0.6.x): its host work per step (scheduler, input preparation, output
    # processing and detokenising) on top of V1's. Unset: v1; the terms' defaults when v0.
    engine_version: str | None = None
    v0_step_us: float | None = None
    v0_seq_us: float | None = None

    def __post_init__(self) -> None:
        if self.engine_version is not None and self.engine_version not in ("v0", "v1"):
            raise ValueError(f"engine_version: got {self.engine_version!r}, expected v0 or v1")
        for name in ("v0_step_us", "v0_seq_us"):
            value = getattr(self, name)
            if value is not None and self.engine_version != "v0":
                raise ValueError(f"{name}: got {value}, expected it only with engine_version: v0 (a V1 engine "
                                 "has no such term)")
        for name in ("api_server_us", "tokenize_us_per_token", "token_return_us", "v0_step_us", "v0_seq_us"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ValueError(f"{name}: got {value}, expected a number of microseconds >= 0")
        window = self.decode_window_steps
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise ValueError(f"decode_window_steps: got {window!r}, expected a whole number of steps >= 1")


@dataclass(frozen=True)
class LifecycleConfig:
    """How long a new replica takes: pod start, then loading its weights (all shards) at load_bw."""

    pod_start_s: float = 60.0
    load_bytes_per_s: float = 2e9

    def __post_init__(self) -> None:
        if self.pod_start_s < 0:
            raise ValueError(f"pod_start_s: got {self.pod_start_s}, expected >= 0")
        if self.load_bytes_per_s <= 0:
            raise ValueError(f"load_bytes_per_s: got {self.load_bytes_per_s}, expected > 0")


@dataclass(frozen=True)
class PoolConfig:
    name: str = "default"
    replicas: int = 1
    tensor_parallel_size: int = 1
    # Overrides of the fleet-level model / GPU / price for this pool.
    model: str | None = None
    gpu: str | None = None
    weight_dtype: str | None = None
    price_usd_per_gpu_hour: float | None = None
    # Bytes of memory per GPU to size the KV cache from, instead of the GPU's CUDA-reported total
    # (replay/model/gpus.py); 80e9 is an "80 GB" card taken at its marketed size.
    gpu_memory_bytes: float | None = None
    # Trace workload labels this pool serves; an empty list takes every label no other pool lists.
    workloads: tuple[str, ...] = ()
    # A router's name, or `{policy: weighted, scorers: {prefix: 2, queue: 1}}` (policies/routers/).
    router: str | dict[str, Any] = "least-outstanding"
    # How stale the replica metrics are that scraping routers see (vllm-dp, least-kv, ...).
    router_refresh_ms: float = 50.0
    engine: EngineArgs = field(default_factory=EngineArgs)
    preemption: PreemptionConfig = field(default_factory=PreemptionConfig)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    step_model: StepModelArgs = field(default_factory=StepModelArgs)
    serving: ServingArgs = field(default_factory=ServingArgs)
    # None: a fixed pool of `replicas`; else `replicas` is the initial count.
    autoscaler: AutoscalerConfig | None = None
    lifecycle: LifecycleConfig = field(default_factory=LifecycleConfig)

    @property
    def max_replicas(self) -> int:
        """Replica slots the engine keeps for the pool."""
        return self.replicas if self.autoscaler is None else max(self.replicas, self.autoscaler.max_replicas)

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"name: got {self.name!r}, expected letters, digits, '-' or '_'")
        if self.replicas < 0:
            raise ValueError(f"replicas: got {self.replicas}, expected a whole number >= 0")
        _positive("tensor_parallel_size", self.tensor_parallel_size)
        router_params(self.router)  # ValueError naming the key: unknown router, parameter or scorer
        if self.price_usd_per_gpu_hour is not None and self.price_usd_per_gpu_hour < 0:
            raise ValueError(f"price_usd_per_gpu_hour: got {self.price_usd_per_gpu_hour}, expected >= 0")
        if not self.router_refresh_ms > 0:
            raise ValueError(f"router_refresh_ms: got {self.router_refresh_ms}, expected > 0")
        scaler = self.autoscaler
        if scaler is not None and not scaler.min_replicas <= self.replicas <= scaler.max_replicas:
            raise ValueError(
                f"replicas: got {self.replicas}, expected the initial count within autoscaler "
                f"[min_replicas {scaler.min_replicas}, max_replicas {scaler.max_replicas}]"
            )
        if self.serving.engine_version == "v0" and self.step_model.backend == "table":
            raise ValueError("serving.engine_version: got 'v0' with step_model.backend table; V0's host terms add to "
                             "the roofline's overheads (use the roofline, or engine_version v1)")


@dataclass(frozen=True)
class ClassSlo:
    ttft_ms: float = 2000.0
    tpot_ms: float = 100.0

    def __post_init__(self) -> None:
        if self.ttft_ms <= 0 or self.tpot_ms <= 0:
            name = "ttft_ms" if self.ttft_ms <= 0 else "tpot_ms"
            raise ValueError(f"{name}: got {getattr(self, name)}, expected > 0")


@dataclass(frozen=True)
class SloConfig(ClassSlo):
    """The fleet's TTFT and TPOT targets; `by_workload` gives a class its own (batch jobs, say)."""

    by_workload: dict[str, ClassSlo] = field(default_factory=dict)


@dataclass(frozen=True)
class FleetConfig:
    model: str = "llama-3.1-70b"
    gpu: str = "h100-sxm-80gb"
    weight_dtype: str | None = None
    price_usd_per_gpu_hour: float | None = None
    seed: int = 0
    slo: SloConfig = field(default_factory=SloConfig)
    # Simulated time between snapshots (one row per pool in ticks.parquet).
    tick_s: float = 1.0
    # Trailing window for the windowed TTFT percentiles, SLO attainment and cost per token.
    metrics_window_s: float = 60.0
    # After the last arrival, keep replaying at most this long; what is still in flight is "unfinished".
    max_drain_s: float = 3600.0
    trace: TraceConfig | None = None
    split: SplitConfig = field(default_factory=SplitConfig)
    # The lesson's fleet: llama-3.1-70b BF16, TP4 on H100; 2 replicas is the fewest that serve the
    # bundled Azure conversation trace within the 2 s TTFT / 100 ms TPOT SLO (99.99% attained; one
    # replica attains 88.5%).
    pools: tuple[PoolConfig, ...] = (PoolConfig(replicas=2, tensor_parallel_size=4),)
    # How to read an observed-metrics export beside the replay (`run --observed`); None: absent.
    observed: ObservedConfig | None = None

    def __post_init__(self) -> None:
        if self.tick_s <= 0:
            raise ValueError(f"tick_s: got {self.tick_s}, expected > 0")
        # The clock counts whole microseconds; a shorter tick, or one between two of them, would be
        # rounded silently.
        if self.tick_s < 1e-6 or abs(self.tick_s * 1e6 - round(self.tick_s * 1e6)) > 1e-6 * self.tick_s * 1e6:
            raise ValueError(f"tick_s: got {self.tick_s:g}, expected a whole number of microseconds, at least 1e-06 "
                             "(the simulated clock's unit)")
        if self.metrics_window_s <= 0:
            raise ValueError(f"metrics_window_s: got {self.metrics_window_s}, expected > 0")
        if self.price_usd_per_gpu_hour is not None and self.price_usd_per_gpu_hour < 0:
            raise ValueError(f"price_usd_per_gpu_hour: got {self.price_usd_per_gpu_hour}, expected >= 0")
        if self.max_drain_s < 0:
            raise ValueError(f"max_drain_s: got {self.max_drain_s}, expected >= 0")
        if not self.pools:
            raise ValueError("pools: expected at least one pool")
        names = [p.name for p in self.pools]
        for name in names:
            if names.count(name) > 1:
                raise ValueError(f"pools: pool name {name!r} appears twice")
        if sum(p.max_replicas for p in self.pools) == 0:
            raise ValueError("pools: every pool has 0 replicas; nothing would serve the trace")
        if self.split.policy == "by-prompt-length" and len(self.split.prompt_thresholds) != len(self.pools) - 1:
            raise ValueError(f"split: by-prompt-length needs one threshold fewer than pools: got "
                             f"{len(self.split.prompt_thresholds)} prompt_thresholds for {len(self.pools)} pools")
        if self.split.policy == "prefill-decode":
            self._check_prefill_decode()
        if self.split.policy == "by-workload" and len(self.pools) > 1 \
                and sum(1 for p in self.pools if not p.workloads) > 1:
            raise ValueError("pools: more than one pool lists no workloads, so the by-workload split cannot tell "
                             "which of them takes the unlisted labels; list workloads or use split.policy")
        if self.trace is not None and self.trace.closed_loop:
            for i, pool in enumerate(self.pools):
                if (pool.serving.decode_window_steps or 1) > 1:
                    raise ValueError(f"pools[{i}].serving.decode_window_steps: got {pool.serving.decode_window_steps}, "
                                     "expected 1 with a closed-loop trace (the engine releases a session's next "
                                     "turn at its last token's step, not at the window's end)")
        claimed: dict[str, str] = {}
        for pool in self.pools:
            for label in pool.workloads:
                if label in claimed:
                    raise ValueError(f"pools: workload {label!r} is listed by both {claimed[label]!r} and {pool.name!r}")
                claimed[label] = pool.name

    def _check_prefill_decode(self) -> None:
        if len(self.pools) != 2:
            raise ValueError(f"split: prefill-decode needs exactly two pools, a prefill and a decode pool; "
                             f"got {len(self.pools)}")
        prefill, decode = self.split.pd_pools([p.name for p in self.pools])
        if prefill == decode:
            raise ValueError(f"split: prefill_pool and decode_pool are both {self.pools[prefill].name!r}")
        for i, pool in enumerate(self.pools):
            if pool.workloads:
                raise ValueError(f"pools[{i}].workloads: the prefill-decode split sends every request to both "
                                 "pools; remove the list")
        a, b = self.pools[prefill].engine.block_size, self.pools[decode].engine.block_size
        if a != b:
            raise ValueError(f"pools[{decode}].engine.block_size: got {b}, expected {a} as the prefill pool "
                             "(KV moves block for block)")

    def to_dict(self, replayed: bool = False) -> dict[str, Any]:
        # An absent `observed:` stays absent; `replayed`: without it (it only says how to read exports)
        out = {k: v for k, v in _plain(asdict(self)).items() if k != "observed" or (v is not None and not replayed)}
        if isinstance(out.get("trace"), dict):  # trace keys added later stay out while unset (same config.yaml)
            for key in _OPTIONAL_TRACE_KEYS:
                if out["trace"].get(key) is None:
                    out["trace"].pop(key, None)
            if not out["trace"].get("closed_loop"):
                out["trace"].pop("closed_loop", None)  # an open-loop config keeps its shape and hash
        for pool in out["pools"]:  # so does a pool without V0's decode windows or host terms
            for key in ("decode_window_steps", "engine_version", "v0_step_us", "v0_seq_us"):
                if pool["serving"].get(key) is None:
                    pool["serving"].pop(key, None)
        return out

    def sha256(self) -> str:
        return hashlib.sha256(yaml.safe_dump(self.to_dict(replayed=True), sort_keys=True).encode()).hexdigest()


_OPTIONAL_TRACE_KEYS = ("synthetic", "whatif")


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def load_config(path: str | Path | None, plugins: Sequence[str] | None = None) -> FleetConfig:
    """Read a fleet config; None gives the default fleet. Every problem is a ConfigError.

    `plugins` (the command's --plugin flags) are the only modules a `"module:function"` policy
    may name: a command that runs the config passes them (an empty list: none), and every user
    policy is then loaded and its signature checked here, so a mistake names the file before
    anything runs. None (a command that only reads the config) loads nothing and checks no code."""
    if plugins is not None:
        load_plugins(plugins)
    if path is None:
        return FleetConfig()
    path = Path(path)
    data = read_yaml(path)
    if data is None:
        raise ConfigError(f"{path}: config file is empty (expected a mapping with 'pools', 'model', ...)")
    return build_config(data, str(path), path.parent, checked=plugins is not None)


def build_config(data: Any, source: str, base_dir: Path, *, checked: bool = True) -> FleetConfig:
    """A fleet config from a mapping as load_config reads one (`llm-replay sweep` builds each cell
    so): every problem a ConfigError naming `source`; paths relative to `base_dir`. `checked`:
    every user policy it names is loaded and checked (the plugins already loaded)."""
    cfg = from_dict(FleetConfig, data, "", source=source)
    if checked:
        check_user_policies(cfg, source)
    return _resolve_profiles(cfg, Path(base_dir))


def _resolve_model(model: str | None, base_dir: Path) -> str | None:
    """A `model:` that is a config.json path (replay/model/hf/config.py) is relative to the config file."""
    from replay.model.hf.config import looks_like_path
    from replay.model.models import MODELS

    if not isinstance(model, str) or model in MODELS or Path(model).expanduser().is_absolute():
        return model
    if looks_like_path(model) or (base_dir / model).exists():
        return str((base_dir / model).resolve())
    return model


def check_user_policies(cfg: FleetConfig, source: str) -> None:
    """Load every policy `cfg` names that is not built in (only from --plugin modules and
    installed entry points) and check its signature; errors name `source` and the key."""
    from policies.registry import AUTOSCALERS, autoscaler_spec, split_function

    for i, pool in enumerate(cfg.pools):
        if pool.autoscaler is not None and pool.autoscaler.policy not in AUTOSCALERS:
            autoscaler_spec(pool.autoscaler.policy, f"pools[{i}].autoscaler.policy", source)
    if cfg.split.policy not in SPLITS:
        split_function(cfg.split.policy, "split.policy", source)


def _resolve_profiles(cfg: FleetConfig, base_dir: Path) -> FleetConfig:
    """Step-model profile and model config paths are relative to the config file; make them absolute."""
    cfg = replace(cfg, model=_resolve_model(cfg.model, base_dir))
    pools = []
    for pool in cfg.pools:
        if pool.model is not None:
            pool = replace(pool, model=_resolve_model(pool.model, base_dir))
        prof = pool.step_model.profile
        if prof is not None and prof not in ("splitwise", "vidur") and not Path(prof).is_absolute():
            pool = replace(pool, step_model=replace(pool.step_model, profile=str((base_dir / prof).resolve())))
        table = pool.step_model.table
        if table is not None and not Path(table).is_absolute():
            pool = replace(pool, step_model=replace(pool.step_model, table=str((base_dir / table).resolve())))
        pools.append(pool)
    return replace(cfg, pools=tuple(pools))
