"""Fit the roofline's kernel efficiencies (mfu, mbu) and the all-reduce's link efficiency to Vidur's
measured operator and collective profiles (`../shared/profiles/vidur/`): the data behind the
shipped per-GPU defaults.

Vidur's `compute/<gpu>/<org>/<model>/mlp.csv` times every non-attention op of one decoder layer on
one TP rank (milliseconds, CUDA-event / Kineto kernel time, no CPU overhead). The step model has no
elementwise term, so the fit target is the sum of all of them, GEMMs and norms, RoPE, activation,
residual add alike: what the roofline's `FLOPs / (peak * mfu)` and `weight bytes / (hbm * mbu)` must
cover. Times here are microseconds.
"""

from __future__ import annotations

import csv
import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.errors import UserError
from common.files import read_text_file
from replay.model.specs import get_gpu

# Vidur device directory -> catalog GPU (Vidur profiled the 80 GB SXM parts on DGX nodes).
VIDUR_GPUS = {"a100": "a100-sxm-80gb", "h100": "h100-sxm-80gb"}
# One layer's ops. `emb` (token embedding) runs once per model, not per layer; Vidur leaves it out too.
LAYER_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
             "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
SHAPE_COLUMNS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "use_gated_mlp", "num_tokens",
                 "num_tensor_parallel_workers")
WEIGHT_BYTES = 2  # the profiles are fp16
STAT = "median"  # Vidur's simulator uses the median of the repeated runs
MAX_VIDUR_BYTES = 1 << 30  # Vidur's profile CSVs are under 10 MB each


@dataclass(frozen=True)
class LayerProfile:
    """One mlp.csv: per row, tokens, TP, the layer's per-rank FLOPs and weight bytes, and the measured
    time of all layer ops (`time_us`) and of the four GEMMs alone (`gemm_us`)."""

    gpu: str  # catalog id
    model: str  # Vidur's directory name, e.g. "meta-llama/Llama-2-70b-hf"
    tokens: np.ndarray
    tp: np.ndarray
    flops: np.ndarray
    weight_bytes: np.ndarray
    time_us: np.ndarray
    gemm_us: np.ndarray
    sha256: str


def _cell(path: Path, i: int, row: dict[str, str], col: str) -> float:
    text = (row.get(col) or "").strip()
    try:
        value = float(text)
    except ValueError:
        raise UserError(f"{path}: row {i} (line {i + 1}), column {col!r}: got {text!r}, expected a number") from None
    if not np.isfinite(value) or value < 0:
        raise UserError(f"{path}: row {i} (line {i + 1}), column {col!r}: got {text!r}, expected a number >= 0")
    return value


def _read_csv(path: Path, needed: tuple[str, ...], what: str) -> tuple[list[dict[str, str]], bytes]:
    """A Vidur CSV's rows (and its bytes, for the sha256), with its needed columns checked."""
    raw = read_text_file(path, str(path), "Vidur profile", MAX_VIDUR_BYTES)  # never a FIFO or a device
    rows = list(csv.DictReader(raw.decode("utf-8", errors="replace").splitlines()))
    missing = [c for c in needed if c not in (rows[0].keys() if rows else [])]
    if missing:
        raise UserError(f"{path}: missing column(s) {', '.join(missing)} (a Vidur {what})")
    return rows, raw


def read_layer_profile(path: str | Path, gpu: str, model: str) -> LayerProfile:
    """Read one Vidur mlp.csv; every malformed cell is a UserError naming file, row and column."""
    path = Path(path)
    rows, raw = _read_csv(path, (*SHAPE_COLUMNS, *(f"time_stats.{op}.{STAT}" for op in LAYER_OPS)),
                          "compute/<gpu>/<model>/mlp.csv")
    out: dict[str, list[float]] = {k: [] for k in ("tokens", "tp", "flops", "weight_bytes", "time_us", "gemm_us")}
    for i, row in enumerate(rows, start=1):
        h, heads, kv = (_cell(path, i, row, c) for c in ("n_embd", "n_head", "n_kv_head"))
        inter = _cell(path, i, row, "n_expanded_embd")
        tokens, tp = _cell(path, i, row, "num_tokens"), _cell(path, i, row, "num_tensor_parallel_workers")
        if tokens == 0 or tp == 0 or heads == 0:
            raise UserError(f"{path}: row {i} (line {i + 1}): num_tokens, num_tensor_parallel_workers and "
                            "n_head must be > 0")
        gated = row["use_gated_mlp"].strip().lower() == "true"
        head_dim = h / heads
        # Linear weights of one layer (whole model): fused QKV, output projection, (gate+)up and down.
        params = h * (heads + 2 * kv) * head_dim + h * h + (3 if gated else 2) * h * inter
        op_us = {op: _cell(path, i, row, f"time_stats.{op}.{STAT}") * 1000 for op in LAYER_OPS}
        out["tokens"].append(tokens)
        out["tp"].append(tp)
        out["flops"].append(2 * tokens * params / tp)
        out["weight_bytes"].append(WEIGHT_BYTES * params / tp)
        out["time_us"].append(sum(op_us.values()))
        out["gemm_us"].append(sum(op_us[op] for op in GEMM_OPS))
    if not rows:
        raise UserError(f"{path}: no rows")
    arrays = {k: np.asarray(v, dtype=np.float64) for k, v in out.items()}
    return LayerProfile(gpu, model, **arrays, sha256=hashlib.sha256(raw).hexdigest())


def find_layer_profiles(vidur_dir: str | Path) -> list[tuple[Path, str, str]]:
    """(path, catalog GPU, model) of every compute/<gpu>/<org>/<model>/mlp.csv under a Vidur data copy."""
    root = Path(vidur_dir)
    compute = root / "data" / "profiling" / "compute"
    if not compute.is_dir():
        raise UserError(f"{root}: no data/profiling/compute/ directory (expected a copy of Vidur's profiles, "
                        "as in ../shared/profiles/vidur/)")
    found = []
    for path in sorted(compute.glob("*/*/*/mlp.csv")):
        device = path.parts[-4]
        if device in VIDUR_GPUS:
            found.append((path, VIDUR_GPUS[device], f"{path.parts[-3]}/{path.parts[-2]}"))
    if not found:
        raise UserError(f"{compute}: no <gpu>/<org>/<model>/mlp.csv for {', '.join(VIDUR_GPUS)}")
    return found


def roofline_us(flops: np.ndarray, nbytes: np.ndarray, gpu: str, mfu: float, mbu: float) -> np.ndarray:
    """The step model's kernel term, max(FLOPs / (peak * mfu), bytes / (HBM bw * mbu)), in microseconds."""
    spec = get_gpu(gpu)
    return np.maximum(flops / (spec.bf16_flops * mfu), nbytes / (spec.hbm_bandwidth_bytes_per_s * mbu)) * 1e6


def _grid_loss(c: np.ndarray, m: np.ndarray, y: np.ndarray, w: np.ndarray, mfus: np.ndarray,
               mbus: np.ndarray) -> np.ndarray:
    """Weighted MAPE of max(c / mfu, m / mbu) against y on an (mfu, mbu) grid (rows: mfu)."""
    loss = np.empty((len(mfus), len(mbus)))
    for a, mfu in enumerate(mfus):
        pred = np.maximum((c / mfu)[None, :], (m[None, :] / mbus[:, None]))
        loss[a] = (np.abs(pred - y[None, :]) / y[None, :]) @ w
    return loss / w.sum()


def fit_efficiencies(c: np.ndarray, m: np.ndarray, y: np.ndarray, w: np.ndarray | None = None) -> tuple[float, float]:
    """(mfu, mbu) in (0, 1] minimising the weighted MAPE of max(c / mfu, m / mbu) against y.

    c, m: each point's compute and memory time at 100% efficiency. Exhaustive: an (mfu, mbu) grid of
    step 0.01, then one of step 0.0005 around its best point; no local minimum can trap it.
    (A per-layer fixed time as a third unknown was tried: it trades off against mbu, 69-76 us per
    layer with mbu 0.82-0.96, so the data cannot pin it; the pure roofline is what ships.)
    """
    w = np.ones_like(y) if w is None else w
    coarse = np.arange(0.01, 1.0001, 0.01)
    loss = _grid_loss(c, m, y, w, coarse, coarse)
    a, b = np.unravel_index(np.argmin(loss), loss.shape)
    fine_f = np.clip(np.arange(coarse[a] - 0.01, coarse[a] + 0.0101, 0.0005), 0.0005, 1.0)
    fine_b = np.clip(np.arange(coarse[b] - 0.01, coarse[b] + 0.0101, 0.0005), 0.0005, 1.0)
    loss = _grid_loss(c, m, y, w, fine_f, fine_b)
    a, b = np.unravel_index(np.argmin(loss), loss.shape)
    return float(fine_f[a]), float(fine_b[b])


def unit_times(p: LayerProfile) -> tuple[np.ndarray, np.ndarray]:
    """Compute and memory time (us) of each row at 100% efficiency."""
    spec = get_gpu(p.gpu)
    return p.flops / spec.bf16_flops * 1e6, p.weight_bytes / spec.hbm_bandwidth_bytes_per_s * 1e6


def mape_pct(pred: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - y) / y) * 100)


@dataclass(frozen=True)
class GroupError:
    """Error of a GPU's pooled fit on one (model, TP): in-sample, and with the model held out of the fit."""

    model: str
    tp: int
    points: int
    fit_mape_pct: float
    held_out_mape_pct: float
    memory_bound_mape_pct: float  # in-sample, rows on the memory side of the roofline (decode-sized)


@dataclass(frozen=True)
class GpuFit:
    gpu: str
    mfu: float
    mbu: float
    errors: list[GroupError]


def _stack(profiles: list[LayerProfile]) -> tuple[np.ndarray, ...]:
    """c, m, y, weights, group index over every (model, TP) of `profiles`; each group weighs 1 in all."""
    cs, ms, ys, ws, gs = [], [], [], [], []
    for j, p in enumerate(profiles):
        c, m = unit_times(p)
        for tp in sorted(set(p.tp.tolist())):
            i = p.tp == tp
            cs.append(c[i]), ms.append(m[i]), ys.append(p.time_us[i])
            ws.append(np.full(int(i.sum()), 1.0 / i.sum())), gs.append(np.full(int(i.sum()), j))
    return tuple(np.concatenate(a) for a in (cs, ms, ys, ws, gs))


def fit_gpu(profiles: list[LayerProfile]) -> GpuFit:
    """One (mfu, mbu) for a GPU from all its profiled models and TPs, each (model, TP) weighing the
    same; held-out error: refit without the model, predict it."""
    c, m, y, w, g = _stack(profiles)
    mfu, mbu = fit_efficiencies(c, m, y, w)
    held: dict[int, tuple[float, float]] = {}
    for j in range(len(profiles)):
        keep = g != j
        held[j] = fit_efficiencies(c[keep], m[keep], y[keep], w[keep]) if len(profiles) > 1 else (mfu, mbu)
    errors = []
    for j, p in enumerate(profiles):
        pc, pm = unit_times(p)
        for tp in sorted(set(p.tp.tolist())):
            i = p.tp == tp
            pred = np.maximum(pc[i] / mfu, pm[i] / mbu)
            hf, hb = held[j]
            mem = pm[i] / mbu >= pc[i] / mfu
            errors.append(GroupError(p.model, int(tp), int(i.sum()), mape_pct(pred, p.time_us[i]),
                                     mape_pct(np.maximum(pc[i] / hf, pm[i] / hb), p.time_us[i]),
                                     mape_pct(pred[mem], p.time_us[i][mem]) if mem.any() else float("nan")))
    return GpuFit(profiles[0].gpu, mfu, mbu, errors)


# Vidur device directory -> its single-node (DGX, NVSwitch) collective profiles.
VIDUR_NETWORK = {"a100": "a100_dgx", "h100": "h100_dgx"}
# The link efficiency is the slope of time against bytes, fitted on messages of at least 8 MiB (each
# world size gets its own intercept). Below that the curve bends as NCCL changes protocol, and the
# slope there is not the link's: fitted from 1 MiB the error doubles (to 7-9%). 8 MiB is also vLLM's
# custom all-reduce's classic max_size, above which the all-reduce went to NCCL.
SLOPE_FROM_BYTES = 8 * 2**20


@dataclass(frozen=True)
class AllReduceFit:
    """A GPU's all-reduce fit: the share of its interconnect bandwidth a ring all-reduce's traffic
    (2 (n - 1) / n of the message per GPU) attains, and per world size the fitted intercept and
    the MAPE of the fit."""

    gpu: str
    link_efficiency: float
    intercept_us: dict[int, float]
    mape_pct: dict[int, float]
    points: dict[int, int]
    sha256: str


def read_all_reduce(path: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """(world size, message bytes, median time in us) of the single-node rows of a Vidur
    network/<node>/all_reduce.csv; malformed cells are UserErrors naming file, row and column."""
    path = Path(path)
    rows, raw = _read_csv(path, ("num_workers", "size", "devices_per_node", f"time_stats.all_reduce.{STAT}"),
                          "network/<node>/all_reduce.csv")
    n, size, us = [], [], []
    for i, row in enumerate(rows, start=1):
        workers = _cell(path, i, row, "num_workers")
        if workers != _cell(path, i, row, "devices_per_node") or workers < 2:
            continue  # multi-node rows: not a TP group inside one replica
        n.append(workers)
        size.append(_cell(path, i, row, "size"))
        us.append(_cell(path, i, row, f"time_stats.all_reduce.{STAT}") * 1000)
    if not n:
        raise UserError(f"{path}: no single-node all-reduce rows")
    return np.asarray(n), np.asarray(size), np.asarray(us), hashlib.sha256(raw).hexdigest()


def fit_all_reduce(path: str | Path, gpu: str) -> AllReduceFit:
    """time = intercept(n) + bytes * 2 (n - 1) / n / (interconnect bw * link_efficiency) over the
    messages of at least SLOPE_FROM_BYTES, one efficiency for all world sizes, least squares in
    relative error.

    Only the efficiency ships: the intercepts (20-90 us) are eager NCCL's, CPU launch included,
    while vLLM runs decode's small all-reduces in CUDA graphs through its own all-reduce kernels;
    the per-all-reduce latency stays the assumed `allreduce_latency_us`."""
    n, size, us, sha = read_all_reduce(path)
    keep = size >= SLOPE_FROM_BYTES
    n, size, us = n[keep], size[keep], us[keep]
    worlds = sorted(set(n.astype(int).tolist()))
    if not worlds or len(set(size.tolist())) < 2:
        raise UserError(f"{path}: fewer than two message sizes of at least {SLOPE_FROM_BYTES} bytes")
    traffic_us = size * 2 * (n - 1) / n / get_gpu(gpu).interconnect_bytes_per_s * 1e6
    a = np.stack([(n == k).astype(float) for k in worlds] + [traffic_us], axis=1) / us[:, None]
    x, *_ = np.linalg.lstsq(a, np.ones_like(us), rcond=None)
    pred = a @ x * us
    efficiency = float(1.0 / x[-1]) if x[-1] > 0 else float("nan")
    if not 0.0 < efficiency <= 1.0:
        raise UserError(f"{path}: the all-reduce fit gives a link efficiency of {efficiency:.3g}, outside (0, 1]")
    return AllReduceFit(gpu, efficiency, {k: float(x[j]) for j, k in enumerate(worlds)},
                        {k: mape_pct(pred[n == k], us[n == k]) for k in worlds},
                        {k: int((n == k).sum()) for k in worlds}, sha)


def find_all_reduce_profiles(vidur_dir: str | Path) -> list[tuple[Path, str]]:
    """(path, catalog GPU) of every network/<gpu>_dgx/all_reduce.csv under a Vidur data copy."""
    network = Path(vidur_dir) / "data" / "profiling" / "network"
    found = [(network / node / "all_reduce.csv", VIDUR_GPUS[device]) for device, node in VIDUR_NETWORK.items()
             if (network / node / "all_reduce.csv").is_file()]
    if not found:
        raise UserError(f"{network}: no <gpu>_dgx/all_reduce.csv for {', '.join(VIDUR_NETWORK)}")
    return found


# Not fitted here, and said so in the file this writes: no shipped measurement of current vLLM's CPU
# overheads or of its CUDA-graphed all-reduce latency exists (README.md, "Calibration"). The 6 us
# per all-reduce sits below the 8.7-11.8 us that sglang-project/sglang#2904 measured for vLLM's
# custom all-reduce on H100 at <= 32 KB without CUDA graphs (launches included).
ASSUMED = {"per_step_overhead_us": 1000.0, "per_seq_overhead_us": 10.0, "prefill_overhead_us": 0.0,
           "allreduce_latency_us": 6.0}
# GPUs Vidur did not profile take the fit of the nearest measured architecture (same vendor libraries
# era): Ampere -> A100, Hopper and later (and MI300X, for want of any AMD data) -> H100.
BORROW = {"a100-sxm-40gb": "a100-sxm-80gb", "h100-pcie-80gb": "h100-sxm-80gb", "h200-sxm-141gb": "h100-sxm-80gb",
          "b200-sxm-180gb": "h100-sxm-80gb", "l40s-48gb": "h100-sxm-80gb", "mi300x-192gb": "h100-sxm-80gb"}
DEFAULTS_FORMAT = "llm-replay-step-defaults/1"


def defaults_document(vidur_dir: str | Path) -> dict:
    """The per-GPU defaults document (replay/profiles/defaults.yaml), fitted from a Vidur data copy."""
    by_gpu: dict[str, list[LayerProfile]] = {}
    files = {}
    for path, gpu, model in find_layer_profiles(vidur_dir):
        prof = read_layer_profile(path, gpu, model)
        by_gpu.setdefault(gpu, []).append(prof)
        files[str(path.relative_to(Path(vidur_dir)))] = prof.sha256
    all_reduce = {}
    for path, gpu in find_all_reduce_profiles(vidur_dir):
        all_reduce[gpu] = fit_all_reduce(path, gpu)
        files[str(path.relative_to(Path(vidur_dir)))] = all_reduce[gpu].sha256
    gpus = {}
    for gpu, profiles in sorted(by_gpu.items()):
        f = fit_gpu(profiles)
        ar = all_reduce.get(gpu)
        gpus[gpu] = {
            "step_model": {"mfu": round(f.mfu, 4), "mbu": round(f.mbu, 4), **ASSUMED,
                           **({"link_efficiency": round(ar.link_efficiency, 3)} if ar else {})},
            "error": [{"model": e.model, "tensor_parallel_size": e.tp, "points": e.points,
                       "fit_mape_pct": round(e.fit_mape_pct, 1), "held_out_model_mape_pct": round(e.held_out_mape_pct, 1),
                       "memory_bound_mape_pct": round(e.memory_bound_mape_pct, 1)} for e in f.errors],
        }
        if ar:
            gpus[gpu]["all_reduce_error"] = [
                {"tensor_parallel_size": k, "points": ar.points[k], "fit_mape_pct": round(ar.mape_pct[k], 1),
                 "nccl_intercept_us": round(ar.intercept_us[k], 1)} for k in sorted(ar.mape_pct)]
    return {
        "format": DEFAULTS_FORMAT,
        "gpus": gpus,
        "borrow": dict(BORROW),
        "provenance": {
            "fitted": "mfu, mbu, link_efficiency: `python -m replay.calibration.vidur ../shared/profiles/vidur --out "
                      "replay/profiles/defaults.yaml`",
            "data": "Vidur operator profiles (github.com/microsoft/vidur @ 7d47513, MIT): compute/<gpu>/<model>/mlp.csv, "
                    "per-layer per-rank kernel times (ms, median), Sarathi-Serve (vLLM 0.3-era) kernels, 2024; "
                    "network/<gpu>_dgx/all_reduce.csv, NCCL all-reduce times on one DGX node (ms, median)",
            "target": "sum of one layer's non-attention ops (4 GEMMs + norms, RoPE, SiLU, residual add; emb left out)",
            "method": "weighted MAPE of max(FLOPs / (peak * mfu), weight bytes / (HBM bw * mbu)); every (model, TP) "
                      "weighs the same; exhaustive grid (0.0005 steps); held-out error: the model left out of the fit",
            "all_reduce": f"link_efficiency: time = intercept(TP) + bytes * 2 (TP - 1) / TP / (interconnect bw * "
                          f"link_efficiency), least squares in relative error over messages of at least "
                          f"{SLOPE_FROM_BYTES} bytes; the intercepts (eager NCCL, CPU launch "
                          "included) are reported, not used",
            "assumed": "per_step_overhead_us, per_seq_overhead_us, prefill_overhead_us, allreduce_latency_us are "
                       "not fitted (no shipped measurement of current vLLM; see replay/profiles/README.md); the 6 us "
                       "all-reduce latency is below the 8.7-11.8 us sglang-project/sglang#2904 measured for vLLM's "
                       "custom all-reduce on H100 at <= 32 KB without CUDA graphs",
            "files_sha256": files,
        },
    }


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    import yaml

    parser = argparse.ArgumentParser(prog="python -m replay.calibration.vidur", description=__doc__)
    parser.add_argument("vidur_dir", help="a copy of Vidur's profiles (holding data/profiling/compute/)")
    parser.add_argument("--out", "-o", required=True, help="defaults YAML to write")
    args = parser.parse_args(argv)
    try:
        doc = defaults_document(args.vidur_dir)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = "# Per-GPU step-model defaults, written by `python -m replay.calibration.vidur` (see README.md here)\n"
    Path(args.out).write_text(text + yaml.safe_dump(doc, sort_keys=False, width=110), encoding="utf-8")
    for gpu, entry in doc["gpus"].items():
        sm = entry["step_model"]
        print(f"{gpu}: mfu {sm['mfu']}, mbu {sm['mbu']}, link_efficiency {sm.get('link_efficiency', '-')}")
        for e in entry.get("all_reduce_error", []):
            print(f"  all-reduce TP{e['tensor_parallel_size']}: MAPE {e['fit_mape_pct']}% ({e['points']} messages "
                  f">= {SLOPE_FROM_BYTES} bytes)")
        for e in entry["error"]:
            print(f"  {e['model']:<38} TP{e['tensor_parallel_size']}: MAPE {e['fit_mape_pct']}% "
                  f"(model held out {e['held_out_model_mape_pct']}%, memory-bound rows {e['memory_bound_mape_pct']}%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
