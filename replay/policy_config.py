"""The config sections that choose policies: preemption, autoscaler, admission and the pool split.

Names are checked here against policies/registry.py, a user's "module:function" policy against
what policies/user_config.py demands of it; replay/config.py assembles them into a FleetConfig
(and re-exports them: `from replay.config import AdmissionConfig` keeps working).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from common.configtools import suggest
from policies.plugins import is_entry_point
from policies.registry import ADMISSIONS, SPLITS, VICTIMS, user_policy_or_none
from policies.user_config import not_found


def user_choice(key: str, name: str, family: str, params: dict[str, Any] | None = None) -> Any:
    """The user policy `name` names (checked and compiled), None if it names none; ValueError
    prefixed with `key` for one that is wrong (no twin, a signature that does not compile)."""
    try:
        return user_policy_or_none(name, family, params)
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}") from None


@dataclass(frozen=True)
class PreemptionConfig:
    """When KV blocks run out: which running request is preempted (recompute), and the admission
    gates that keep it from happening. `victim: auto` is vLLM's: vllm-priority under the priority
    scheduling policy, else vllm-fcfs."""

    victim: str = "auto"
    # recompute (vLLM V1's only mode) or swap: the victim's KV goes to host memory at the host
    # link's bandwidth while `swap_space_gib` per GPU lasts (vLLM V0's --swap-space, default 4).
    mode: str = "recompute"
    swap_space_gib: float = 4.0
    host_link_bytes_per_s: float = 64e9  # PCIe Gen5 x16, one direction
    watermark: float = 0.0  # share of KV blocks admission leaves free (vLLM V0's default was 0.01)
    whole_prompt_gate: bool = False  # admit only if every remaining prompt token fits, not the chunk

    def __post_init__(self) -> None:
        known = self.victim == "auto" or self.victim in VICTIMS
        if not known and user_choice("victim", self.victim, "preemption victim") is None:
            raise ValueError(f"victim: unknown preemption victim {self.victim!r}"
                             f"{suggest(self.victim, ['auto', *VICTIMS])}; "
                             f"{not_found(['auto', *sorted(VICTIMS)])}")
        if self.mode not in ("recompute", "swap"):
            raise ValueError(f"mode: got {self.mode!r}, expected recompute or swap")
        if self.swap_space_gib < 0:
            raise ValueError(f"swap_space_gib: got {self.swap_space_gib}, expected >= 0")
        if not self.host_link_bytes_per_s > 0:
            raise ValueError(f"host_link_bytes_per_s: got {self.host_link_bytes_per_s}, expected > 0")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"watermark: got {self.watermark}, expected a share in [0, 1)")


@dataclass(frozen=True)
class AutoscalerConfig:
    """A pool's autoscaler: a policy by name (llm-replay policies lists them), its parameters,
    bounds, and the guards every policy shares (cooldowns, decision interval, scrape delay)."""

    policy: str = "fixed"
    min_replicas: int = 1
    max_replicas: int = 8
    params: dict[str, Any] = field(default_factory=dict)
    guard: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.min_replicas < 0:
            raise ValueError(f"min_replicas: got {self.min_replicas}, expected >= 0")
        if self.max_replicas < max(self.min_replicas, 1):
            raise ValueError(
                f"max_replicas: got {self.max_replicas}, expected >= min_replicas ({self.min_replicas}) and >= 1"
            )


@dataclass(frozen=True)
class AdmissionConfig:
    """At arrival, admit or reject with a reason (llm-replay policies lists them)."""

    policy: str = "always"
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.policy in ADMISSIONS:
            return
        if not isinstance(self.params, dict):
            raise ValueError(f"params: got {self.params!r}, expected a mapping of the policy's parameters")
        if user_choice("policy", self.policy, "admission", self.params) is None:
            raise ValueError(f"policy: unknown admission policy {self.policy!r}{suggest(self.policy, ADMISSIONS)}; "
                             f"{not_found(sorted(ADMISSIONS))}")


# KV-transfer links between a prefill and a decode replica, in bytes/s one way:
# NVLink 4 (H100 SXM, 900 GB/s both ways), PCIe 5.0 x16 (64 GB/s), InfiniBand NDR 400 Gb/s
# (ConnectX-7), 25 Gb Ethernet. NVIDIA's H100 and ConnectX-7 data sheets; PCI-SIG 5.0.
LINK_PRESETS: dict[str, float] = {
    "nvlink4": 450e9,
    "pcie5x16": 64e9,
    "ib-ndr": 50e9,
    "eth-25g": 3.125e9,
}


@dataclass(frozen=True)
class SplitConfig:
    """How requests are split over the pools. `by-workload`: the pool whose `workloads` lists the
    request's label, else the pool with no list; `by-prompt-length`: pools in order, a request
    going to the first pool whose threshold its prompt is below (the last pool takes the rest);
    `prefill-decode`: two pools, prefill and decode, with a KV transfer between them of
    `prompt_tokens * kv_bytes_per_token / link_bytes_per_s + base_latency_ms`."""

    policy: str = "by-workload"
    prompt_thresholds: tuple[int, ...] = ()
    # prefill-decode: pool names (default: the first pool prefills, the second decodes).
    prefill_pool: str | None = None
    decode_pool: str | None = None
    link: str = "ib-ndr"
    link_bytes_per_s: float | None = None  # overrides the link preset
    base_latency_ms: float = 1.0  # per transfer: connection, descriptors, completion (assumed)
    transfer: str = "layerwise"  # overlapped with the prefill layer by layer, or "serial" after it
    # The P/D decider: a request whose uncached prompt (after the decode replica's prefix cache)
    # is below this many tokens is prefilled by its decode replica. 0: every request goes remote.
    # (Dynamo's `max_local_prefill_length` defaults to 1000.)
    local_prefill_threshold: int = 0

    def __post_init__(self) -> None:
        if self.policy not in SPLITS and ":" not in self.policy and not is_entry_point(self.policy):
            raise ValueError(f"policy: unknown pool split {self.policy!r}{suggest(self.policy, SPLITS)}; known: "
                             f"{', '.join(sorted(SPLITS))}, or 'module:function' of a --plugin module, or a "
                             "plugin's llm_replay.policies entry point")
        if list(self.prompt_thresholds) != sorted(set(self.prompt_thresholds)) or any(
                t <= 0 for t in self.prompt_thresholds):
            raise ValueError(f"prompt_thresholds: got {list(self.prompt_thresholds)}, expected increasing "
                             "token counts > 0")
        if self.link not in LINK_PRESETS:
            raise ValueError(f"link: unknown link {self.link!r}{suggest(self.link, LINK_PRESETS)}; known: "
                             f"{', '.join(LINK_PRESETS)} "
                             "(or set link_bytes_per_s)")
        if self.link_bytes_per_s is not None and not self.link_bytes_per_s > 0:
            raise ValueError(f"link_bytes_per_s: got {self.link_bytes_per_s}, expected > 0")
        if not self.base_latency_ms >= 0:
            raise ValueError(f"base_latency_ms: got {self.base_latency_ms}, expected >= 0")
        if self.transfer not in ("layerwise", "serial"):
            raise ValueError(f"transfer: got {self.transfer!r}, expected 'layerwise' or 'serial'")
        if self.local_prefill_threshold < 0:
            raise ValueError(f"local_prefill_threshold: got {self.local_prefill_threshold}, expected >= 0")

    @property
    def bytes_per_s(self) -> float:
        return self.link_bytes_per_s if self.link_bytes_per_s is not None else LINK_PRESETS[self.link]

    def pd_pools(self, names: list[str]) -> tuple[int, int]:
        """Indices of the prefill and the decode pool among the pools named `names`."""
        found = []
        for key, name, default in (("prefill_pool", self.prefill_pool, 0), ("decode_pool", self.decode_pool, 1)):
            if name is None:
                found.append(default)
            elif name in names:
                found.append(names.index(name))
            else:
                raise ValueError(f"split.{key}: no pool is named {name!r}; pools: {', '.join(names)}")
        return found[0], found[1]
