"""`llm-replay capacity`: weights, KV bytes per token and KV capacity of one replica, or with
--break-even the prefill/decode break-even KV link bandwidth per model."""

from __future__ import annotations

import argparse
import json
from typing import Any

from common.errors import UserError


# capacity's numeric flags and the config keys whose ranges they share (common/bounds.py).
CAPACITY_FLAGS = {"tp": "tensor_parallel_size", "gpu_memory_utilization": "gpu_memory_utilization",
                  "block_size": "block_size", "max_num_batched_tokens": "max_num_batched_tokens",
                  "num_gpu_blocks_override": "num_gpu_blocks_override", "flops": "flops",
                  "max_num_seqs": "max_num_seqs", "gpu_memory_bytes": "gpu_memory_bytes"}


def _check_flag_ranges(args: argparse.Namespace, flags: dict[str, str]) -> None:
    """A flag refuses what its config key refuses, nan and inf included: one UserError naming it."""
    from common.bounds import out_of_bounds

    for dest, key in flags.items():
        value = getattr(args, dest)
        problem = None if value is None else out_of_bounds(None, key, value)
        if problem is not None:
            flag = "--" + dest.replace("_", "-")
            shown = f"{value:g}" if isinstance(value, float) else str(value)
            raise UserError(f"{args.command}: {flag}: got {shown}, expected {problem}")


def add_parser(sub: Any) -> None:
    cap = sub.add_parser("capacity", help="weights, KV bytes per token and KV capacity of one replica; "
                                          "--break-even: the prefill/decode break-even KV link bandwidth")
    cap.add_argument("--model", help="catalog model (required, except with --break-even: every model)")
    cap.add_argument("--gpu", help="catalog GPU (required, except with --break-even and --flops)")
    cap.add_argument("--tp", type=int, default=1,
                     help="tensor parallel size: GPUs per replica (default 1)")
    cap.add_argument("--kv-cache-dtype", default="auto",
                     help="KV cache dtype as vLLM's --kv-cache-dtype: auto (the model's dtype), fp8, ... (default auto)")
    cap.add_argument("--weight-dtype", default=None,
                     help="weight dtype, e.g. bf16, fp8, int4 (default: the catalog model's own)")
    cap.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                     help="share of GPU memory vLLM may use, in (0, 1] (default 0.9)")
    cap.add_argument("--block-size", type=int, default=16,
                     help="tokens per KV block: a power of 2 up to 128 (default 16)")
    cap.add_argument("--max-num-batched-tokens", type=int, default=8192,
                     help="tokens per step, which sizes the activation memory reserved (default 8192)")
    cap.add_argument("--max-num-seqs", type=int, default=256,
                     help="sequences per step, which sizes the profile's sampler pass (default 256)")
    cap.add_argument("--gpu-memory-bytes", type=float, default=None,
                     help="memory per GPU in bytes, e.g. 80e9, instead of the total CUDA reports for --gpu "
                          "(79.22 GiB for an H100 80GB)")
    cap.add_argument("--num-gpu-blocks-override", type=int, default=None,
                     help="KV blocks per replica instead of what memory allows (vLLM's flag of that name)")
    cap.add_argument("--break-even", action="store_true",
                     help="print W* = kv_bytes_per_token x F / (2 x active params) per model, and the KV "
                          "transfer's share of the prefill over each link preset")
    cap.add_argument("--flops", type=float, default=None,
                     help="with --break-even: the achieved prefill FLOP/s F (default: the GPU's dense peak for "
                          "the model's weights x the MFU a pool of that GPU runs at by default)")
    cap.add_argument("--json", action="store_true", help="print the result as JSON instead of the table")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from replay.model.memory import kv_capacity
    from replay.outputs.report import print_capacity
    from replay.model.specs import get_gpu, get_model

    _check_flag_ranges(args, CAPACITY_FLAGS)
    if args.break_even:
        return _cmd_break_even(args)
    if not args.model or not args.gpu:
        raise UserError("capacity: --model and --gpu are required (or use --break-even)")
    try:
        cap = kv_capacity(
            get_model(args.model), get_gpu(args.gpu), args.tp,
            gpu_memory_utilization=args.gpu_memory_utilization, block_size=args.block_size,
            kv_cache_dtype=args.kv_cache_dtype, weight_dtype=args.weight_dtype,
            num_gpu_blocks_override=args.num_gpu_blocks_override,
            max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
            gpu_memory_bytes=args.gpu_memory_bytes,
        )
    except UserError as exc:
        # Name the flag the user typed, not the parameter behind it.
        text = str(exc)
        for flag in ("gpu_memory_utilization", "block_size", "kv_cache_dtype", "weight_dtype",
                     "num_gpu_blocks_override", "max_num_batched_tokens", "max_num_seqs", "gpu_memory_bytes",
                     "tensor_parallel_size"):
            text = text.replace(flag, "--tp" if flag == "tensor_parallel_size" else "--" + flag.replace("_", "-"))
        raise UserError(f"capacity: {text}") from None
    if args.json:
        print(json.dumps(cap.to_dict(), indent=2))
    else:
        print_capacity(Console(), cap)
    return 0


def _cmd_break_even(args: argparse.Namespace) -> int:
    """W* per model (ref 000 section 02): the link speed at which moving a prompt's KV costs as
    long as computing it."""
    from rich.console import Console
    from rich.table import Table

    from replay.config import LINK_PRESETS
    from replay.model.specs import MODELS, get_gpu, get_model, normalize_weight_dtype
    from replay.calibration.profiles import default_coefficients
    from replay.model.stepmodel import DEFAULT_MFU
    from replay.model.stepterms import break_even_rows

    models = [get_model(args.model)] if args.model else list(MODELS.values())
    if args.flops is not None:
        flops = {m.id: args.flops for m in models}
        source = f"F = {args.flops:.3g} FLOP/s (--flops)"
    elif args.gpu:
        gpu = get_gpu(args.gpu)
        # the mfu a default pool of this GPU runs at (its Vidur-fitted default, else stepmodel's)
        mfu = (default_coefficients(gpu.id) or {}).get("mfu", DEFAULT_MFU)
        flops = {m.id: gpu.matmul_flops(normalize_weight_dtype(args.weight_dtype or m.default_weight_dtype)) * mfu
                 for m in models}
        source = f"F = {gpu.id} dense peak x MFU {mfu:g} (its default)"
    else:
        raise UserError("capacity: --break-even needs --gpu (F from its peak FLOP/s) or --flops")
    rows = [row for m in models for row in break_even_rows([m], flops[m.id], LINK_PRESETS)]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = Table(title=f"Break-even KV link W* = kv_bytes_per_token x F / (2 P); {source}; "
                        "then the transfer's % of the prefill per link", title_justify="left")
    table.add_column("model", no_wrap=True)
    table.add_column("KV", no_wrap=True)
    for name in ("KiB/token", "W* GB/s", *LINK_PRESETS):
        table.add_column(name, justify="right", no_wrap=True)
    for row in rows:
        table.add_row(row["model"], row["kv_cache_dtype"], f"{row['kv_bytes_per_token'] / 1024:,.0f}",
                      f"{row['break_even_bytes_per_s'] / 1e9:.2f}",
                      *(f"{share * 100:.1f}" for share in row["transfer_share"].values()))
    console = Console()
    Console(width=max(console.width, 104)).print(table)
    return 0
