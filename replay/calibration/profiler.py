"""Time a model's kernels with PyTorch (random weights) and compose engine step times from them.

One decoder layer's operations are timed per batch composition (QKV, O, gate/up and down GEMMs at
the per-GPU shard shapes of tensor parallelism, prefill and decode attention with
`scaled_dot_product_attention`, the RMSNorm and SiLU element-wise work, and two all-reduces of
the hidden state when several GPUs are available), then multiplied by the layer count, plus the
LM head for each sequence's sampled token. Times are milliseconds. What is not measured: the
engine's CPU work (scheduler, sampling, detokenisation), which `calibrate` fits as overheads only
when the measured steps include it; these composed steps do not.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replay.files import write_atomically
from replay.model.models import ModelSpec

# Batch compositions of a full-size profile: (prefill tokens, prefill seqs, decode seqs, context per decode seq).
FULL_GRID: tuple[tuple[int, int, int, int], ...] = (
    *((p, 1, 0, 0) for p in (128, 512, 1024, 2048, 4096, 8192)),
    (4096, 8, 0, 0), (8192, 16, 0, 0),
    *((0, 0, b, c) for b in (1, 8, 32, 64, 128, 256) for c in (512, 2048)),
    (0, 0, 16, 8192), (0, 0, 64, 8192),
    (512, 1, 32, 1024), (2048, 1, 64, 1024), (1024, 2, 128, 512),
)
# CPU tests: small enough to run in seconds with --tiny shapes.
TINY_GRID: tuple[tuple[int, int, int, int], ...] = (
    (16, 1, 0, 0), (32, 1, 0, 0), (64, 1, 0, 0), (64, 2, 0, 0),
    (0, 0, 1, 32), (0, 0, 4, 32), (0, 0, 8, 64), (0, 0, 16, 32),
    (32, 1, 4, 32),
)
CSV_COLUMNS = ("prefill_tokens", "prefill_seqs", "prefill_context_tokens", "decode_seqs", "decode_context_tokens",
               "step_time_ms", "repeat", "model", "gpu_name", "tensor_parallel_size", "device", "dtype",
               "allreduce_measured")


class TorchMissing(Exception):
    """PyTorch is not installed."""


def import_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise TorchMissing("llm-replay profile needs PyTorch: pip install 'llm-replay[profile]'") from None
    return torch


@dataclass(frozen=True)
class Shapes:
    """Per-GPU shapes of one decoder layer under tensor parallelism."""

    layers: int
    hidden: int
    heads: int  # query heads per GPU
    kv_heads: int  # KV heads per GPU (at least 1: vLLM replicates KV heads when tp > kv heads)
    head_dim: int
    ffn: int  # intermediate size per GPU
    vocab: int  # LM-head rows per GPU
    tp: int


def shapes_for(model: ModelSpec, tp: int, tiny: bool = False) -> Shapes:
    """The model's per-GPU shapes; `tiny` divides widths by 32 (heads by 8, at least one) and keeps
    2 layers, so a CPU runs the whole grid in seconds. Dense attention models only."""
    if tiny:
        heads = max(1, model.num_attention_heads // 8)
        kv = max(1, min(heads, model.num_kv_heads // 8))
        head_dim = max(8, model.head_dim // 8)
        return Shapes(2, heads * head_dim, max(1, heads // tp), max(1, kv // tp), head_dim,
                      max(8, model.intermediate_size // 32 // tp), max(8, model.vocab_size // 256 // tp), tp)
    return Shapes(model.num_layers, model.hidden_size, model.num_attention_heads // tp,
                  max(1, model.num_kv_heads // tp), model.head_dim, model.intermediate_size // tp,
                  model.vocab_size // tp, tp)


def check_model(model: ModelSpec, tp: int) -> None:
    from common.errors import UserError

    if model.is_mla or model.is_moe:
        raise UserError(f"--model {model.id}: profile times dense attention models only (this one is "
                        f"{'MLA' if model.is_mla else 'MoE'})")
    if model.num_attention_heads % tp or model.intermediate_size % tp:
        raise UserError(f"--tp {tp}: {model.id} has {model.num_attention_heads} attention heads and FFN "
                        f"{model.intermediate_size}; expected a TP that divides both")


class Timer:
    """Times a callable: CUDA events on a GPU, perf_counter on the CPU; `repeats` samples after warm-up."""

    def __init__(self, torch: Any, device: str, repeats: int, warmup: int = 2):
        self.torch, self.device, self.repeats, self.warmup = torch, device, repeats, warmup

    def __call__(self, fn: Callable[[], Any]) -> list[float]:
        torch = self.torch
        for _ in range(self.warmup):
            fn()
        out = []
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
            for _ in range(self.repeats):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                out.append(float(start.elapsed_time(end)))
        else:
            for _ in range(self.repeats):
                t0 = time.perf_counter()
                fn()
                out.append((time.perf_counter() - t0) * 1e3)
        return out


class LayerOps:
    """Random weights of one layer (and the LM head) and the timed operations, cached by shape."""

    def __init__(self, torch: Any, s: Shapes, device: str, dtype: Any, timer: Timer):
        self.torch, self.s, self.device, self.dtype, self.timer = torch, s, device, dtype, timer
        g = torch.Generator(device="cpu").manual_seed(0)

        def w(rows: int, cols: int) -> Any:
            return (torch.randn(rows, cols, generator=g) * 0.02).to(device=device, dtype=dtype)

        q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
        self.w_qkv, self.w_o = w(s.hidden, q + 2 * kv), w(q, s.hidden)
        self.w_up, self.w_down = w(s.hidden, 2 * s.ffn), w(s.ffn, s.hidden)
        self.w_head = w(s.hidden, s.vocab)
        self.cache: dict[tuple, list[float]] = {}

    def _x(self, rows: int, cols: int) -> Any:
        return self.torch.randn(rows, cols, device=self.device, dtype=self.dtype)

    def _timed(self, key: tuple, make: Callable[[], Callable[[], Any]]) -> list[float]:
        if key not in self.cache:
            self.cache[key] = self.timer(make())
        return self.cache[key]

    def gemms(self, tokens: int) -> list[float]:
        """QKV, O, gate/up, down GEMMs and the element-wise work of one layer for `tokens` rows."""
        torch, s = self.torch, self.s

        def make():
            x, a = self._x(tokens, s.hidden), self._x(tokens, s.heads * s.head_dim)
            weight = torch.ones(s.hidden, device=self.device, dtype=self.dtype)

            def run():
                torch.nn.functional.rms_norm(x, (s.hidden,), weight)
                x @ self.w_qkv
                a @ self.w_o
                torch.nn.functional.rms_norm(x, (s.hidden,), weight)
                up = x @ self.w_up
                act = torch.nn.functional.silu(up[:, :s.ffn]) * up[:, s.ffn:]
                act @ self.w_down
            return run
        return self._timed(("gemm", tokens), make)

    def head(self, seqs: int) -> list[float]:
        return self._timed(("head", seqs), lambda: (lambda x=self._x(seqs, self.s.hidden): x @ self.w_head))

    def prefill_attention(self, chunk: int, seqs: int, context: int) -> list[float]:
        """Causal attention of `seqs` chunks of `chunk` new tokens over `context` cached tokens each."""
        torch, s = self.torch, self.s

        def make():
            q = torch.randn(seqs, s.heads, chunk, s.head_dim, device=self.device, dtype=self.dtype)
            k = torch.randn(seqs, s.kv_heads, context + chunk, s.head_dim, device=self.device, dtype=self.dtype)
            v = torch.randn_like(k)
            mask = None
            if context:  # causal within the chunk, full over the cached prefix
                mask = torch.ones(chunk, context + chunk, device=self.device, dtype=torch.bool).tril(context)
            return lambda: torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=s.kv_heads != s.heads)
        return self._timed(("prefill", chunk, seqs, context), make)

    def decode_attention(self, seqs: int, context: int) -> list[float]:
        torch, s = self.torch, self.s

        def make():
            q = torch.randn(seqs, s.heads, 1, s.head_dim, device=self.device, dtype=self.dtype)
            k = torch.randn(seqs, s.kv_heads, context, s.head_dim, device=self.device, dtype=self.dtype)
            v = torch.randn_like(k)
            return lambda: torch.nn.functional.scaled_dot_product_attention(
                q, k, v, enable_gqa=s.kv_heads != s.heads)
        return self._timed(("decode", seqs, context), make)


def step_samples(ops: LayerOps, composition: tuple[int, int, int, int],
                 allreduce: Callable[[int], list[float]] | None) -> list[float]:
    """Composed step times (ms), one per repeat: layers x (GEMMs + attention + 2 all-reduces) + LM head."""
    prefill_tokens, prefill_seqs, decode_seqs, context = composition
    tokens = prefill_tokens + decode_seqs
    parts = [ops.gemms(tokens)]
    if prefill_tokens:
        parts.append(ops.prefill_attention(prefill_tokens // prefill_seqs, prefill_seqs, 0))
    if decode_seqs:
        parts.append(ops.decode_attention(decode_seqs, context))
    if allreduce is not None:
        parts.extend([allreduce(tokens)] * 2)
    head = ops.head(prefill_seqs + decode_seqs)
    n = len(head)
    return [ops.s.layers * sum(p[r] for p in parts) + head[r] for r in range(n)]


def profile_rows(model: ModelSpec, *, gpu_name: str, tp: int, device: str, tiny: bool, repeats: int,
                 allreduce: Callable[[int], list[float]] | None = None,
                 progress: Callable[[int, int], None] | None = None) -> list[dict[str, Any]]:
    """One CSV row per composition and repeat, in `calibrate --format generic`'s columns."""
    torch = import_torch()
    check_model(model, tp)
    s = shapes_for(model, tp, tiny)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    ops = LayerOps(torch, s, device, dtype, Timer(torch, device, repeats))
    grid = TINY_GRID if tiny else FULL_GRID
    rows = []
    with torch.inference_mode():
        for i, comp in enumerate(grid):
            prefill_tokens, prefill_seqs, decode_seqs, context = comp
            for r, ms in enumerate(step_samples(ops, comp, allreduce)):
                rows.append({
                    "prefill_tokens": prefill_tokens, "prefill_seqs": prefill_seqs, "prefill_context_tokens": 0,
                    "decode_seqs": decode_seqs, "decode_context_tokens": decode_seqs * context,
                    "step_time_ms": round(ms, 6), "repeat": r, "model": model.id, "gpu_name": gpu_name,
                    "tensor_parallel_size": tp, "device": device, "dtype": str(dtype).replace("torch.", ""),
                    "allreduce_measured": allreduce is not None,
                })
            if progress is not None:
                progress(i + 1, len(grid))
    return rows


def grid_tokens(tiny: bool) -> list[int]:
    """Token counts the grid's steps push through the all-reduces."""
    return sorted({p + d for p, _, d, _ in (TINY_GRID if tiny else FULL_GRID)})


def _allreduce_worker(rank: int, tp: int, port: int, hidden: int, tokens: list[int], repeats: int, out: str) -> None:
    import json

    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=tp)
    timer = Timer(torch, f"cuda:{rank}", repeats, warmup=5)
    result = {}
    for t in tokens:
        x = torch.randn(t, hidden, device=f"cuda:{rank}", dtype=torch.bfloat16)
        dist.barrier()
        result[t] = timer(lambda: dist.all_reduce(x))
    if rank == 0:
        Path(out).write_text(json.dumps(result))
    dist.destroy_process_group()


def measure_allreduce(tp: int, hidden: int, tokens: list[int], repeats: int) -> dict[int, list[float]]:
    """All-reduce times (ms) of a [tokens, hidden] BF16 tensor over `tp` local GPUs (NCCL), one
    list of `repeats` samples per token count."""
    import json
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "allreduce.json")
        mp.spawn(_allreduce_worker, args=(tp, port, hidden, tokens, repeats, out), nprocs=tp, join=True)
        data = json.loads(Path(out).read_text())
    return {int(k): v for k, v in data.items()}


def write_csv(path: str | Path, rows: list[dict[str, Any]]) -> None:
    """Write atomically (temp file, then rename): an interrupted profile leaves nothing behind."""
    import csv

    def write(fh) -> None:
        writer = csv.DictWriter(fh, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)

    write_atomically(path, write, newline="")
