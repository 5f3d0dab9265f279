"""An experiment's workload rebuilt as inference-perf sent it: constant-rate stages of requests
over 100 fixed prompts, with the prefix-block hashes vLLM's prefix cache would compute for them.

Sources (kubernetes-sigs/inference-perf@e8e0aa9, as ../shared/measurements/vllm-s2r/README.md cites):
`inference_perf/loadgen/load_timer.py` (ConstantLoadTimer: int(rate x duration) exponential gaps
scaled to sum to the duration, the first request one gap after the stage starts, the last at its
end) and `inference_perf/datagen/shared_prefix_datagen.py` (num_groups x num_prompts_per_group
prompts, each a random system prompt shared by its group plus its own random question; request n
of a stage sends prompt n mod the prompt count). Times are µs in the trace, seconds here.
"""

from __future__ import annotations

import hashlib

import numpy as np
import polars as pl

from replay.measured.experiments import Experiment

# Token counts as vLLM sees them run about 4.7% above inference-perf's nominal lengths (random ids
# decoded to text and re-tokenised; the README of the measurements), where no mean was measured.
RETOKENIZED = 1.047
# The next stage starts this long after the previous stage's last arrival. inference-perf starts it
# once the previous stage has drained (measured pauses 4-7 s after drain); a stable stage of these
# runs drains within one E2E (at most about 6 s for the two-stage runs' ~250-token outputs), so 30 s
# leaves every stable replay drained, and a drained stage's figures do not depend on the gap. A
# replay still backlogged at the gap runs into the next stage (as a real server would not).
STAGE_GAP_S = 30.0
STAGE_LABEL = "stage-{}"  # the trace's `workload` column: which stage a request belongs to


def prompt_lengths(exp: Experiment) -> tuple[int, np.ndarray]:
    """(system prompt tokens, each prompt's tokens). Lengths are the nominal ones scaled to the
    measured mean prompt (else nominal x RETOKENIZED); the prompts' lengths differ by at most one
    token so that their mean is the target to 0.01 token."""
    nominal = exp.system_prompt_len + exp.question_len
    target = exp.measured_prompt_len_mean
    if target is None:
        target = exp.measured.get(-1, {}).get("prompt_len_mean") or nominal * RETOKENIZED
    n = exp.num_prompts
    total = max(int(round(target * n)), n)
    lengths = np.full(n, total // n, np.int64)
    lengths[: total % n] += 1
    system = min(int(round(exp.system_prompt_len * target / nominal)), int(lengths.min()) - 1)
    return max(system, 0), lengths


def _chain(parent: bytes, content: str) -> bytes:
    return hashlib.blake2b(parent + content.encode(), digest_size=8).digest()


def prompt_block_hashes(exp: Experiment, system_len: int, lengths: np.ndarray) -> list[list[int]]:
    """Each prompt's hashes, one per full block of the experiment's block_size (vLLM hashes full
    blocks only: a partial last block is never cached). A hash chains every earlier block, as
    vLLM's does (vllm/v1/core/kv_cache_utils.py, `hash_block_tokens`: the parent block's hash with
    this block's token ids), so a block wholly inside its group's system prompt is shared by the
    group's prompts, and every block from the first that holds a question token on is the prompt's own."""
    block, out = exp.block_size, []
    for p, length in enumerate(lengths):
        group = p // exp.prompts_per_group
        h, hashes = b"", []
        for b in range(int(length) // block):
            inside = (b + 1) * block <= system_len
            h = _chain(h, f"system {group} block {b}" if inside else f"prompt {p} block {b}")
            hashes.append(int.from_bytes(h, "little"))
        out.append(hashes)
    return out


def stage_arrivals_s(exp: Experiment, seed: int = 0) -> list[np.ndarray]:
    """Each stage's arrival times in seconds from the run's start (one generator per stage, seeded
    by (seed, stage)): stage k+1 starts STAGE_GAP_S after stage k's last arrival."""
    out, start = [], 0.0
    for stage in exp.stages:
        rng = np.random.default_rng([seed, stage.index])
        gaps = rng.exponential(1.0 / stage.rate_rps, stage.requests)
        gaps *= stage.duration_s / gaps.sum()
        times = start + np.cumsum(gaps)
        out.append(times)
        start = float(times[-1]) + STAGE_GAP_S
    return out


def workload_frame(exp: Experiment, seed: int = 0) -> pl.DataFrame:
    """The rebuilt requests in arrival order: arrival_us, prompt_tokens, output_tokens (output_len
    exactly: the harness set ignore_eos), workload (STAGE_LABEL of its stage), prefix_hashes."""
    system_len, lengths = prompt_lengths(exp)
    hashes = prompt_block_hashes(exp, system_len, lengths)
    arrivals = stage_arrivals_s(exp, seed)
    prompt = np.concatenate([np.arange(len(a)) % exp.num_prompts for a in arrivals])
    stage = np.concatenate([np.full(len(a), i) for i, a in enumerate(arrivals)])
    return pl.DataFrame({
        "arrival_us": np.rint(np.concatenate(arrivals) * 1e6).astype(np.int64),
        "prompt_tokens": lengths[prompt],
        "output_tokens": np.full(len(prompt), exp.output_len, np.int64),
        "workload": [STAGE_LABEL.format(s) for s in stage],
        "prefix_hashes": pl.Series([hashes[p] for p in prompt], dtype=pl.List(pl.UInt64)),
    })


def experiment_trace(exp: Experiment, seed: int = 0):
    """The workload as a LoadedTrace the replay takes (prefix hashes of the experiment's block_size)."""
    from traces import LoadedTrace, cast_to_schema

    frame = workload_frame(exp, seed)
    digest = hashlib.sha256()
    for name in ("arrival_us", "prompt_tokens", "output_tokens"):
        digest.update(frame[name].to_numpy().astype(np.int64).tobytes())
    digest.update(frame["prefix_hashes"].explode().to_numpy().astype(np.uint64).tobytes())
    source = f"experiment {exp.id}"
    return LoadedTrace(cast_to_schema(frame, source=source), source, "synthetic", exp.block_size,
                       digest.hexdigest(), {}, 0)


def stage_of(frame: pl.DataFrame) -> pl.Series:
    """The stage index (0, 1, ...) of each row of a trace or requests frame, from its workload label."""
    return frame["workload"].str.strip_prefix(STAGE_LABEL.format("")).cast(pl.Int64).alias("stage")
