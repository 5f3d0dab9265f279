"""Cost that follows events (engine/lazy.py): the numba engine with steady decoders kept lazily
against itself advancing every running request at every step (`numba-eager`, today's engine
before the change), measured in the same run, with the outputs compared.

    python bench/bench_events.py             # (a) the bundled trace on 4 replicas, (b) a million requests
    python bench/bench_events.py --quick     # (a) only

(a) azure-conv-2023 on 4 x llama-3.1-8b: the replay core (engine construction and every
    advance, kernels warm), the whole replay in this process, and the whole `llm-replay run`
    command in a fresh process (kernels from numba's cache; interpreter start and writing the
    run directory included).
(b) 1,000,000 Poisson requests at 250 req/s with Azure-conv lengths on 64 replicas, each engine
    in a process of its own (so each peak RSS is its own), the summaries compared.

Against the engine issue 15 was filed against (cad3f8d), whose step-model defaults predate the fit
to real vLLM servers: run `--only-million numba` there, and `--only-million numba
--filed-step-model` here, which sets that engine's defaults as pool keys; the two summaries are
then equal but for config_sha256 and pool_plans' set_in_config, and the walls give the ratio.
Every figure is a median of repeats; machines are shared and noisy, so quote ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_replay import engine_only, fleet, peak_rss_mb, timed
from replay.config import build_config
from replay.run import replay_trace
from traces import load_trace
from traces.synthetic import poisson_trace

FLEET_YAML = """model: llama-3.1-8b
gpu: h100-sxm-80gb
pools:
  - {name: default, replicas: 4, tensor_parallel_size: 1}
"""
ENGINES = ("numba", "numba-eager")
# cad3f8d's h100-sxm-80gb defaults (its summary's pool_plans), before session 10's fit
FILED_STEP_MODEL = {"mbu": 0.6984, "attention_mbu": 0.9143, "expert_mbu": 0.6984, "allreduce_latency_us": 9.0694,
                    "per_seq_overhead_us": 17.6066, "per_step_overhead_us": 0.0}
FILED_SERVING = {"token_return_us": 4851.5}


def bundled(repeats: int) -> None:
    conv = load_trace("azure-conv-2023")
    cfg = fleet("llama-3.1-8b", replicas=4)
    for name in ENGINES:
        engine_only(conv, cfg, name)  # kernels from numba's cache: not timed
    core = {name: statistics.median(engine_only(conv, cfg, name) for _ in range(repeats)) for name in ENGINES}
    whole = {name: timed(conv, cfg, name, repeats) for name in ENGINES}
    same = _comparable(whole["numba"][1]) == _comparable(whole["numba-eager"][1])
    print(f"(a) azure-conv-2023 ({conv.frame.height:,} requests) on 4 x llama-3.1-8b / h100-sxm-80gb:")
    print(f"  replay core (engine only, warm): lazy {core['numba']:.3f} s, eager {core['numba-eager']:.3f} s: "
          f"{core['numba-eager'] / core['numba']:.1f}x (median of {repeats})")
    print(f"  whole replay in-process: lazy {whole['numba'][0]:.3f} s, eager {whole['numba-eager'][0]:.3f} s: "
          f"{whole['numba-eager'][0] / whole['numba'][0]:.1f}x; same summary: {same}")
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp, "fleet.yaml")
        config.write_text(FLEET_YAML)
        command = [str(Path(sys.executable).with_name("llm-replay")), "run", "-c", str(config), "--quiet", "--force"]
        walls = []
        for k in range(repeats):
            started = time.perf_counter()
            subprocess.run([*command, "--out", str(Path(tmp, f"run{k}"))], check=True)
            walls.append(time.perf_counter() - started)
    print(f"  whole command `llm-replay run -c fleet.yaml --quiet` (fresh process, lazy engine): "
          f"{statistics.median(walls):.2f} s (median of {repeats})")


def _comparable(summary: dict) -> str:
    """The summary without what names the engine or the run's own timing."""
    return json.dumps({k: v for k, v in summary.items() if k not in ("engine", "wall_s", "replay_wall_s")},
                      sort_keys=True, default=str)


def million(requests: int, engine: str, filed: bool = False) -> None:
    """One engine on the million-request run; prints one JSON line: wall, peak RSS, summary."""
    conv = load_trace("azure-conv-2023")
    big = fleet("llama-3.1-8b", replicas=64)
    if filed:
        big = build_config({"model": "llama-3.1-8b", "gpu": "h100-sxm-80gb", "pools": [
            {"name": "default", "replicas": 64, "tensor_parallel_size": 1,
             "step_model": FILED_STEP_MODEL, "serving": FILED_SERVING}]}, "bench_events", Path("."))
    replay_trace(poisson_trace(conv, requests=1000, rate_rps=250.0, seed=1), big, engine=engine)  # kernels
    synth = poisson_trace(conv, requests=requests, rate_rps=250.0, seed=1)
    started = time.perf_counter()
    summary = replay_trace(synth, big, engine=engine).summary
    wall = time.perf_counter() - started
    print(json.dumps({"wall_s": wall, "peak_rss_mb": peak_rss_mb(), "summary": _comparable(summary),
                      "finished": summary["finished"], "sim_span_s": summary["sim_span_s"]}))


def millions(requests: int) -> None:
    runs = {}
    for name in ENGINES:
        out = subprocess.run([sys.executable, __file__, "--only-million", name,
                              "--requests", str(requests)], check=True, capture_output=True, text=True).stdout
        runs[name] = json.loads(out.strip().splitlines()[-1])
    lazy, eager = runs["numba"], runs["numba-eager"]
    print(f"(b) {requests:,} Poisson requests at 250 req/s (Azure conv lengths) on 64 x llama-3.1-8b "
          f"({lazy['sim_span_s']:,.0f} s simulated, {lazy['finished']:,} finished):")
    print(f"  lazy {lazy['wall_s']:.1f} s, peak RSS {lazy['peak_rss_mb']:,.0f} MB; eager {eager['wall_s']:.1f} s, "
          f"peak RSS {eager['peak_rss_mb']:,.0f} MB: {eager['wall_s'] / lazy['wall_s']:.1f}x; "
          f"same summary: {lazy['summary'] == eager['summary']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="skip the million-request benchmark")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--only-million", choices=ENGINES, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--filed-step-model", action="store_true",
                    help="with --only-million: the step-model defaults of the engine issue 15 was filed against")
    args = ap.parse_args()
    if args.only_million:
        million(args.requests, args.only_million, args.filed_step_model)
        return 0
    bundled(args.repeats)
    if not args.quick:
        millions(args.requests)
    return 0


if __name__ == "__main__":
    sys.exit(main())
