"""`llm-replay profile`: time a catalog model's kernels on this machine's GPU (PyTorch, random
weights) and write step times in the generic CSV that `llm-replay calibrate --format generic` reads."""

from __future__ import annotations

import argparse
import sys
from typing import Any

DESCRIPTION = """\
Time one decoder layer's kernels of MODEL with random weights (QKV, O, gate/up and down GEMMs at
the per-GPU shapes of --tp, prefill and decode attention via scaled_dot_product_attention, the
RMSNorm/SiLU work, and the all-reduces when --tp > 1 and that many GPUs are present), compose
step times for a grid of batch compositions (x layers, + LM head), and write one CSV row per
composition and repeat in calibrate's generic format (extra columns: repeat, model, gpu_name,
tensor_parallel_size, device, dtype, allreduce_measured).

The steps hold GPU kernel time only: an engine's CPU work per step (scheduling, sampling) is not
in them, so a calibration from this file fits its overheads near zero. Then:

  llm-replay calibrate profile.csv --format generic --model MODEL --gpu GPU --tp N --out gpu.yaml

Needs PyTorch (pip install 'llm-replay[profile]') and, for real profiles, a CUDA GPU;
--device cpu --tiny runs scaled-down shapes on the CPU: a check of the pipeline (calibrate refuses
CPU rows).
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("profile", help="time a model's kernels on this GPU and write a CSV for calibrate",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="catalog model id (llm-replay catalog)")
    p.add_argument("--gpu-name", required=True,
                   help="name recorded in the CSV; use the catalog GPU id to calibrate with it (e.g. h200-sxm-141gb)")
    p.add_argument("--tp", type=int, default=1, help="tensor parallel size whose shard shapes are timed (default 1)")
    p.add_argument("--out", "-o", required=True, help="CSV to write (a new file, or with --force an existing one)")
    p.add_argument("--force", action="store_true", help="replace --out if it already exists")
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu")
    p.add_argument("--tiny", action="store_true", help="scaled-down shapes and grid (CPU tests)")
    p.add_argument("--repeats", type=int, default=5, help="timed repetitions per composition (default 5)")


def run(args: argparse.Namespace) -> int:
    from replay.calibration.profiler import (
        TorchMissing, check_model, grid_tokens, import_torch, measure_allreduce, profile_rows, shapes_for, write_csv,
    )
    from replay.files import check_output_file
    from replay.model.specs import get_model
    from common.errors import UserError

    model = get_model(args.model)
    if not args.gpu_name.strip():
        raise UserError("--gpu-name: empty; expected a name for the GPU (the catalog id to calibrate with it)")
    if args.tp < 1:
        raise UserError(f"--tp: got {args.tp}, expected a whole number > 0")
    if args.repeats < 1:
        raise UserError(f"--repeats: got {args.repeats}, expected a whole number > 0")
    if args.device != "cpu" and not args.device.startswith("cuda"):
        raise UserError(f"--device: got {args.device!r}, expected cuda, cuda:N or cpu")
    check_model(model, args.tp)
    # before minutes of timing: an existing file, a FIFO or a missing directory is refused now
    check_output_file(args.out, force=args.force)
    try:
        torch = import_torch()
    except TorchMissing as exc:
        raise UserError(str(exc)) from None
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise UserError(f"--device {args.device}: PyTorch sees no CUDA GPU (torch {torch.__version__}); "
                        "use --device cpu --tiny to try the profiler on the CPU")
    allreduce = None
    if args.tp > 1:
        found = torch.cuda.device_count() if cuda else 0
        if found >= args.tp:
            s = shapes_for(model, args.tp, args.tiny)
            timings = measure_allreduce(args.tp, s.hidden, grid_tokens(args.tiny), args.repeats)
            allreduce = timings.__getitem__
        else:
            print(f"llm-replay profile: note: all-reduce not measured (--tp {args.tp} needs {args.tp} GPUs, found "
                  f"{found}); the steps hold one GPU's shard of the compute only, and calibrate keeps the step "
                  "model's assumed all-reduce cost", file=sys.stderr)

    live = sys.stderr.isatty()

    def progress(done: int, total: int) -> None:
        # one line redrawn on a terminal; in a log, a line per tenth of the grid
        if live:
            print(f"\rprofiling {model.id}: {done}/{total} batch compositions", end="", file=sys.stderr, flush=True)
        elif done == total or done % max(1, total // 10) == 0:
            print(f"profiling {model.id}: {done}/{total} batch compositions", file=sys.stderr, flush=True)

    rows = profile_rows(model, gpu_name=args.gpu_name, tp=args.tp, device=args.device, tiny=args.tiny,
                        repeats=args.repeats, allreduce=allreduce, progress=progress)
    if live:
        print(file=sys.stderr)
    write_csv(args.out, rows)
    if not cuda:
        print(f"wrote {len(rows)} measured steps to {args.out}: CPU timings of scaled-down shapes, a check of the "
              "profiler's pipeline only (calibrate refuses them); run it on the GPU to calibrate")
        return 0
    print(f"wrote {len(rows)} measured steps to {args.out}; next:\n  llm-replay calibrate {args.out} --format generic "
          f"--model {model.id} --gpu {args.gpu_name} --tp {args.tp} --out {model.id}-{args.gpu_name}.yaml")
    return 0
