"""Step-model profiles: what `llm-replay calibrate` writes, what `step_model: {profile: ...}` reads,
and the shipped per-GPU calibrations (replay/profiles/, from measured data; `profile: splitwise`).

A profile holds one fit per tensor-parallel size for one (model, GPU), each with its coefficients,
its cross-validated error and the data it came from. Overheads are microseconds.
"""

from __future__ import annotations

import datetime
import functools
import math
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from common.bounds import MIN_EFFICIENCY
from common.errors import ConfigError
from common.yamlfile import read_yaml
from replay.calibration.steps import COEFFICIENTS, KNEE_COEFFICIENTS
from replay.files import write_atomically
from replay.model.serving import SERVING_FIT_GPU as REQUEST_FIT_GPU
from replay.model.specs import get_gpu

FORMAT = "llm-replay-step-profile/1"
# replay/profiles/: package data of `replay` (pyproject.toml), beside this package, not in it.
PROFILES_DIR = Path(__file__).resolve().parents[1] / "profiles"

# Shipped calibrations: Splitwise's measured Llama-2-70B profile (replay/profiles/README.md). GPUs
# without measurements borrow the nearest measured part's coefficients (same software era).
DEFAULT_PROFILES = {
    "a100-sxm-80gb": "splitwise-llama-2-70b-a100-sxm-80gb.yaml",
    "h100-sxm-80gb": "splitwise-llama-2-70b-h100-sxm-80gb.yaml",
}
BORROWED_DEFAULTS = {
    "a100-sxm-40gb": "a100-sxm-80gb",
    "h100-pcie-80gb": "h100-sxm-80gb",
    "h200-sxm-141gb": "h100-sxm-80gb",
    "b200-sxm-180gb": "h100-sxm-80gb",
    "l40s-48gb": "h100-sxm-80gb",
    "mi300x-192gb": "h100-sxm-80gb",
}


@dataclass(frozen=True)
class Profile:
    path: str
    model: str
    gpu: str
    # tp -> {coefficient: value}; allreduce_latency_us rides along (the value the fit assumed).
    fits: dict[int, dict[str, float]]


def tool_version() -> str:
    try:
        return metadata.version("llm-replay")
    except metadata.PackageNotFoundError:
        return "unknown"


def profile_document(model: str, gpu: str, fits: list[dict[str, Any]], provenance: dict[str, Any]) -> dict[str, Any]:
    """The YAML document of a profile; `fits` entries: tensor_parallel_size, step_model, error, points."""
    return {
        "format": FORMAT,
        "model": model,
        "gpu": gpu,
        "fits": fits,
        "provenance": {"date": datetime.date.today().isoformat(), "tool_version": tool_version(), **provenance},
    }


def write_profile(path: str | Path, document: dict[str, Any]) -> None:
    """Write atomically (temp file then rename): a failed run leaves no partial profile."""
    text = "# Step-model profile written by `llm-replay calibrate`; use it with step_model: {profile: <this file>}\n"
    text += yaml.safe_dump(document, sort_keys=False, width=110)
    write_atomically(path, lambda fh: fh.write(text))


REQUIRED = tuple(k for k in COEFFICIENTS if k not in KNEE_COEFFICIENTS)


OPTIONAL = (*KNEE_COEFFICIENTS, "link_efficiency")


class ProfileEntryError(ValueError):
    """One fit of a profile is malformed; the message says how."""


def _coefficients(step_model: dict[str, Any]) -> dict[str, float]:
    """A fit's coefficients; profiles written before the knee existed have none (no knee)."""
    if not isinstance(step_model, dict):
        raise ProfileEntryError(f"step_model: expected a mapping, got {step_model!r}")
    unknown = sorted(set(step_model) - {*REQUIRED, "allreduce_latency_us", *OPTIONAL})
    if unknown:
        raise ProfileEntryError(f"step_model: unknown key {unknown[0]!r}; expected {', '.join(REQUIRED)}, "
                                f"allreduce_latency_us and optionally {', '.join(OPTIONAL)}")
    missing = [k for k in (*REQUIRED, "allreduce_latency_us") if k not in step_model]
    if missing:
        raise ProfileEntryError(f"step_model: missing {', '.join(missing)}")
    try:
        values = {k: float(step_model[k]) for k in (*REQUIRED, "allreduce_latency_us")}
        if step_model.get("link_efficiency") is not None:
            values["link_efficiency"] = float(step_model["link_efficiency"])
        if float(step_model.get("knee_tokens") or 0) > 0:
            if step_model.get("past_knee_mfu") is None:
                raise ProfileEntryError(f"step_model: knee_tokens {step_model['knee_tokens']} without past_knee_mfu, "
                                        "the matmul efficiency past the knee")
            values["knee_tokens"] = float(step_model["knee_tokens"])
            values["past_knee_mfu"] = float(step_model["past_knee_mfu"])
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ProfileEntryError):
            raise
        raise ProfileEntryError(f"step_model: expected numbers ({exc})") from None
    for key, value in values.items():
        if key in ("mfu", "mbu", "past_knee_mfu", "link_efficiency"):
            if not MIN_EFFICIENCY <= value <= 1.0:
                raise ProfileEntryError(f"step_model.{key}: got {value:g}, expected a value in "
                                        f"[{MIN_EFFICIENCY:g}, 1] (an efficiency)")
        elif not (math.isfinite(value) and value >= 0):
            raise ProfileEntryError(f"step_model.{key}: got {value:g}, expected a number >= 0")
    if values.get("past_knee_mfu", 0.0) > values["mfu"]:
        raise ProfileEntryError(f"step_model.past_knee_mfu: got {values['past_knee_mfu']:g}, expected at most mfu "
                                f"({values['mfu']:g}): past the knee matmuls are no faster")
    return values


def read_profile(path: str | Path, where: str = "") -> Profile:
    """A profile file, checked; every problem is a ConfigError naming `where` (the config key) and the file."""
    path = Path(path)
    head = f"{where}: {path}" if where else str(path)
    try:
        data = read_yaml(path, "step-model profile")
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}" if where else str(exc)) from None
    if isinstance(data, dict) and data.get("format") == REQUEST_FIT_FORMAT:
        raise ConfigError(f"{head}: a request-level fit (`llm-replay calibrate --experiments`), not a step-model "
                          "profile: copy its step_model: and serving: keys into the pool")
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConfigError(f"{head}: not a step-model profile (expected 'format: {FORMAT}', as `llm-replay "
                          "calibrate` writes)")
    fits: dict[int, dict[str, float]] = {}
    for j, entry in enumerate(data.get("fits") or []):
        try:
            tp = int(entry["tensor_parallel_size"])
            values = _coefficients(entry["step_model"])
        except ProfileEntryError as exc:
            raise ConfigError(f"{head}: fits[{j}].{exc}") from None
        except (KeyError, TypeError, ValueError):
            raise ConfigError(f"{head}: fits[{j}]: expected tensor_parallel_size and step_model with "
                              f"{', '.join(REQUIRED)}, allreduce_latency_us (and optionally "
                              f"{', '.join(OPTIONAL)})") from None
        fits[tp] = values
    if not fits or not isinstance(data.get("model"), str) or not isinstance(data.get("gpu"), str):
        raise ConfigError(f"{head}: expected model, gpu and at least one entry in fits")
    return Profile(str(path), data["model"], data["gpu"], fits)


# `step_model: {profile: vidur}` (replay/profiles/defaults.yaml): mfu and mbu per GPU fitted to Vidur's
# kernel profiles by replay/calibration/vidur.py; overheads and all-reduce latency assumed. Meant to become
# the default of pools with no step_model settings (replay/profiles/README.md says what blocks it).
VIDUR = "vidur"
DEFAULTS_FILE = PROFILES_DIR / "defaults.yaml"
DEFAULTS_FORMAT = "llm-replay-step-defaults/1"


@functools.lru_cache(maxsize=None)
def _defaults_table() -> tuple[dict[str, dict[str, float]], dict[str, str]]:
    data = yaml.safe_load(DEFAULTS_FILE.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or data.get("format") != DEFAULTS_FORMAT:
        raise ConfigError(f"{DEFAULTS_FILE}: expected 'format: {DEFAULTS_FORMAT}' (regenerate it: "
                          "python -m replay.calibration.vidur ../shared/profiles/vidur --out replay/profiles/defaults.yaml)")
    gpus = {gpu: _coefficients(entry["step_model"]) for gpu, entry in data["gpus"].items()}
    return gpus, dict(data.get("borrow") or {})


def default_coefficients(gpu_id: str) -> dict[str, float] | None:
    """The shipped default coefficients of `gpu_id` (its own fit, or the one it borrows); None for a
    GPU the file does not name (stepmodel's DEFAULT_* constants then apply)."""
    gpus, borrow = _defaults_table()
    if gpu_id in gpus:
        return dict(gpus[gpu_id])
    entry = gpus.get(borrow.get(gpu_id, ""))
    if entry is None:
        return None
    entry = dict(entry)
    # The link efficiency was measured over NVLink + NVSwitch; a GPU on PCIe or Infinity Fabric
    # keeps its data sheet's bandwidth (1.0) rather than borrow another fabric's.
    if not get_gpu(gpu_id).interconnect.startswith("NVLink"):
        entry.pop("link_efficiency", None)
    return entry


REQUEST_FIT_FORMAT = "llm-replay-request-fit/1"


@functools.lru_cache(maxsize=None)
def request_fit(gpu_id: str) -> dict[str, Any] | None:
    """The shipped request-level fit of `gpu_id` (`llm-replay calibrate --experiments`: replays of real
    vLLM servers matched to what their clients measured), or None for a GPU without one. Its
    step-model keys win over the GPU's Vidur-fitted ones when a pool sets no profile."""
    path = PROFILES_DIR / f"request_fit_{gpu_id}.yaml"
    if not path.is_file():
        return None
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or data.get("format") != REQUEST_FIT_FORMAT or data.get("gpu") != gpu_id:
        raise ConfigError(f"{path}: expected 'format: {REQUEST_FIT_FORMAT}' for gpu {gpu_id}")
    return data


# The GPUs the H100 request-level fit is carried to: the other GPUs of the campaign it comes from (vLLM
# v0.15.1 servers on H100, A100 and L40S, BLIS sim-to-real; issue 11). What the fit finds is mostly the
# host's and vLLM's: the engine core schedules, prepares inputs and bookkeeps each step on the CPU
# (vllm/v1/engine/core.py `EngineCore.step`), so per_step / per_seq / prefill overheads carry over as
# fitted (instead of the assumed 1 ms per step), and so does the all-reduce latency, on NVLink parts that
# of vLLM's one-shot custom all-reduce, a barrier more than a transfer
# (vllm/distributed/device_communicators/custom_all_reduce.py; on more than two PCIe-only GPUs vLLM
# falls back to NCCL, whose latency over PCIe no shipped measurement gives). Its bandwidth shares (mbu,
# attention_mbu) carry over unchanged too: measured A100 / H100 ratios of the share scatter around 1 -
# Vidur's GEMMs 0.947 over all its models but 1.00 for Llama-2-7B (memory-bound times 1.639x the H100's
# against a bandwidth ratio of 1.643), Splitwise's fits 1.07 (TP2) and 1.04 (TP4), and vLLM 0.23 on an
# A100 40GB decoding Llama-3.1-8B at ~75 tok/s at concurrency 1 (johnmusgrave.com, "vLLM
# throughput-latency sweep on NVIDIA A100") about 1.12. Keys the fit may hold beyond these (mfu, knees) are
# the H100's own and stay behind. The other GPUs keep their Vidur defaults: carried to the H200,
# `llm-replay validate published` reads throughput 32.6% (from 37.9%) but E2E 14.0% (from 6.6%), its
# two H200 latency rows (vLLM's nightly benchmark, an older vLLM) then reading 15-23% fast.
CARRIED_TO = ("a100-sxm-40gb", "a100-sxm-80gb", "l40s-48gb")
CARRIED_TERMS = ("per_step_overhead_us", "per_seq_overhead_us", "prefill_overhead_us", "allreduce_latency_us",
                 "mbu", "attention_mbu", "expert_mbu")


def transferred_request_fit(gpu_id: str) -> dict[str, float]:
    """The request-level fit's step-model keys for `gpu_id`: its own shipped fit, else for a GPU of
    CARRIED_TO the CARRIED_TERMS of the REQUEST_FIT_GPU's; else {}."""
    own = request_fit(gpu_id)
    if own is not None:
        return dict(own.get("step_model") or {})
    fit = request_fit(REQUEST_FIT_GPU)
    if fit is None or gpu_id not in CARRIED_TO:
        return {}
    return {k: v for k, v in (fit.get("step_model") or {}).items() if k in CARRIED_TERMS}


def default_source(gpu_id: str) -> str:
    """What a pool without a profile takes its step model from, for summary.json."""
    if request_fit(gpu_id) is not None:
        return f"{gpu_id} defaults (request-level fit to real vLLM servers, replay/profiles/request_fit_{gpu_id}.yaml)"
    if request_fit(REQUEST_FIT_GPU) is not None and gpu_id in CARRIED_TO:
        return (f"{gpu_id} defaults (the {REQUEST_FIT_GPU} request-level fit to real vLLM servers carried over)")
    return f"{gpu_id} defaults"


@functools.lru_cache(maxsize=None)
def _shipped(name: str) -> Profile:
    return read_profile(PROFILES_DIR / name)


def gpu_defaults(gpu_id: str, tp: int) -> dict[str, float] | None:
    """The shipped coefficients for `gpu_id` at the measured TP nearest `tp` (ties: the larger);
    None for a GPU with neither data nor a borrowed default."""
    name = DEFAULT_PROFILES.get(BORROWED_DEFAULTS.get(gpu_id, gpu_id))
    if name is None:
        return None
    fits = _shipped(name).fits
    nearest = min(fits, key=lambda t: (abs(t - tp), -t))
    return dict(fits[nearest])


# `step_model: {profile: splitwise}` selects the shipped calibration of the pool's GPU (any model).
SHIPPED = "splitwise"


def step_coefficients(args: Any, model_id: str, gpu_id: str, tp: int, where: str) -> dict[str, float | None]:
    """Keyword arguments of `stepmodel.step_params` for a pool: keys set in its `step_model` win,
    then its profile (a calibrated file for this model, GPU and TP, or `splitwise`: the shipped
    calibration of the pool's GPU at the nearest measured TP; or `vidur`: the GPU's entry in
    replay/profiles/defaults.yaml), then stepmodel's DEFAULT_* constants.

    `args` is the pool's StepModelArgs; `where` names its config key, e.g. "cfg.yaml: pools[0].step_model".
    """
    base: dict[str, float | None] = dict.fromkeys((*COEFFICIENTS, "allreduce_latency_us", "link_efficiency",
                                                   "attention_mbu", "expert_mbu"))
    if args.profile is None:  # the default: the GPU's Vidur-fitted efficiencies, when it has some,
        base.update(default_coefficients(gpu_id) or {})  # and its request-level fit (or the one
        base.update(transferred_request_fit(gpu_id))  # carried over from the measured GPU)
    elif args.profile == VIDUR:
        defaults = default_coefficients(gpu_id)
        if defaults is None:
            raise ConfigError(f"{where}.profile: no Vidur-fitted defaults for {gpu_id}; known: "
                              f"{', '.join(sorted([*_defaults_table()[0], *_defaults_table()[1]]))}")
        base.update(defaults)
    elif args.profile == SHIPPED:
        defaults = gpu_defaults(gpu_id, tp)
        if defaults is None:
            raise ConfigError(f"{where}.profile: no shipped calibration for {gpu_id}; known: "
                              f"{', '.join(sorted([*DEFAULT_PROFILES, *BORROWED_DEFAULTS]))}")
        base.update(defaults)
    elif args.profile is not None:
        prof = read_profile(args.profile, f"{where}.profile")
        if prof.model != model_id or prof.gpu != gpu_id or tp not in prof.fits:
            raise ConfigError(
                f"{where}.profile: {args.profile} was calibrated for {prof.model} on {prof.gpu} at "
                f"tensor_parallel_size {', '.join(map(str, sorted(prof.fits)))}; this pool runs {model_id} on "
                f"{gpu_id} at tensor_parallel_size {tp}")
        base.update(prof.fits[tp])
    for key in base:
        value = getattr(args, key, None)
        if value is not None:
            base[key] = value
    if args.past_knee_mfu is not None and not base["knee_tokens"]:
        raise ConfigError(f"{where}.past_knee_mfu: set without a knee (knee_tokens, here or in the profile), so it "
                          "would change nothing")
    if base["knee_tokens"] and base["past_knee_mfu"] is not None and base["mfu"] is not None \
            and base["past_knee_mfu"] > base["mfu"]:
        raise ConfigError(f"{where}.past_knee_mfu: {base['past_knee_mfu']:g} is above mfu {base['mfu']:g}; past the "
                          "knee matmuls are no faster (set both, or knee_tokens: 0 to drop the knee)")
    if base["knee_tokens"] and base["past_knee_mfu"] is None:
        raise ConfigError(f"{where}.past_knee_mfu: knee_tokens {base['knee_tokens']:g} needs the matmul efficiency "
                          "past the knee, a value in (0, 1]")
    return base
