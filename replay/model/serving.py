"""What a client's latency holds besides the engine's steps: the API server's way in and each
token's way out (a pool's `serving:` keys).

A vLLM server (`vllm serve`, V1) runs its OpenAI API server and the engine core in separate
processes. A request's way to the engine: HTTP parsing, then the prompt is tokenised by
`AsyncMicrobatchTokenizer` (vllm/utils/async_utils.py), a single-thread executor that waits up to
`batch_wait_timeout_s` = 2 ms after a prompt for others to batch with it, then `AsyncLLM.add_request`
and a ZMQ/msgpack hop to the engine core's input queue (vllm/v1/engine/core_client.py). A token's
way back: the engine core's output thread encodes `EngineCoreOutputs` after
`Scheduler.update_from_output`, the API server's output handler detokenises it incrementally
(vllm/v1/engine/output_processor.py, detokenizer.py) and serving_completion writes one SSE chunk
per step (`stream_interval` 1), which the client parses.

Modelled as: a request reaches the engine `api_server_us + tokenize_us_per_token * prompt_tokens`
after the client sent it, in order (the tokeniser is one thread: no request overtakes another);
every token reaches the client `token_return_us` after its step ends, so TTFT and E2E hold both
and TPOT/ITL neither. The defaults are fitted to the client-measured latencies of real vLLM
v0.15.1 servers (`llm-replay calibrate --experiments`, replay/calibration/requests.py); where the
data cannot tell two terms apart (they all add to TTFT), the split follows vLLM's source.

`decode_window_steps` (default 1, every step) is vLLM V0's multi-step scheduling
(`--num-scheduler-steps`, as v0.6.0 ran it; the V1 engine has no such setting), for replaying
measurements of such a server. V0's `LLMEngine.step` calls the scheduler only when the running
batch has no steps left (`_has_remaining_steps`: every running sequence is in the same window) and
hands outputs on only at the window's last step (vllm-project/vllm v0.6.x, vllm/engine/llm_engine.py).
A prompt's step is a single step (vllm/core/scheduler.py `_get_num_lookahead_slots` gives a prefill
no lookahead without chunked prefill), so the first token is not held. A sequence whose last token
comes mid-window is returned when the window ends: the GPU runs the window's steps for the whole
batch, and the output processor drops the tokens past its end (vllm/engine/output_processor/
multi_step.py). Modelled as: the request's last token reaches the client after
`ceil((output_tokens - 1) / k) * k` decode steps instead of `output_tokens - 1`, the missing steps
taking the replica's median time per output token (a window holds decode steps only: V0 runs
prefills between windows). Not modelled: the engine itself still schedules every step, so the
finished sequence leaves the batch and a waiting prompt is admitted at once, not at the window's
end (they matter under online load near capacity, not for a burst that fits the batch).

`engine_version: v0` (default v1) adds what vLLM V0 (v0.6.x, `LLMEngine`) does on the host between
its GPU steps and V1 does not: one process runs the API server's engine loop, the scheduler
(vllm/core/scheduler.py `Scheduler.schedule`, a Python pass over every running sequence group for
its blocks and lookahead slots), the input preparation of every step (vllm/worker/model_runner.py
`_prepare_model_input_tensors`; with multi-step, vllm/worker/multi_step_model_runner.py pythonises
each step's sampled tokens per sequence) and the output processing (vllm/engine/llm_engine.py
`_process_model_outputs`, vllm/engine/output_processor/multi_step.py: per sequence and new token,
the stop checks and the in-engine incremental detokeniser `Detokenizer.decode_sequence_inplace`),
serialised with the GPU (V1 moves detokenising to the API server's process and overlaps scheduling
with the GPU); vLLM's own account of V0's CPU overheads: https://blog.vllm.ai/2024/09/05/perf-update.html
(v0.6.0, which added multi-step scheduling to amortise them) and https://blog.vllm.ai/2025/01/27/
v1-alpha-release.html (why V1). Modelled as two terms added to each step of a V0 pool: `v0_step_us`
per step and `v0_seq_us` per sequence in the step (the step model's per-step and per-sequence
overheads, on top of V1's). A window's scheduling and output processing are paid once per window of
k steps in vLLM; their mean share per step is what the terms hold. The defaults (below) are fitted
on Lambda's V0 runs (replay/scenarios/lambda_v0.yaml, replay/calibration/v0.py), cross-validated
leaving one model out.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# Where a shipped request-level fit gives the serving terms (replay/profiles/request_fit_*.yaml),
# they are the defaults (`defaults()`): these constants are the fallback and the fit's fixed split.
# The tokeniser's micro-batching wait (AsyncMicrobatchTokenizer batch_wait_timeout_s = 0.002 in
# vllm/utils/async_utils.py; vllm-project/vllm#44172 measures it as "about 2ms of frontend latency
# for low-concurrency" workloads) plus HTTP parsing and the hop to the engine core.
DEFAULT_API_SERVER_US = 2000.0
# HF fast tokenisers: "~0.1ms" per encode of a typical prompt (vllm-project/vllm#45759), about
# 0.2 us per token for the 500-token prompts of those benchmarks.
DEFAULT_TOKENIZE_US_PER_TOKEN = 0.2
# Engine output to the client's parsed chunk: what the fit finds (about 5 ms on the H100 servers).
DEFAULT_TOKEN_RETURN_US = 5000.0
# The fit whose serving terms are every pool's defaults: they are CPU-side (the API server's
# process), so the H100 servers' figures stand for any GPU until other servers are fitted.
SERVING_FIT_GPU = "h100-sxm-80gb"

KEYS = ("api_server_us", "tokenize_us_per_token", "token_return_us")
# vLLM V0's host time per step and per sequence in the step, on top of V1's (the module's doc), fitted
# on Lambda's one-GPU V0 runs of 10 requests (replay/scenarios/lambda_v0.yaml, three models):
# `python -m replay.calibration.v0 lambda-v0 --only h100-burst10 --seq-us 0` finds 875 us a step
# (875-1000 us with a model left out; MAPE throughput / TTFT / TPOT / E2E 6.9 / 21.7 / 7.4 / 10.4%,
# left-one-model-out 7.3 / 21.8 / 7.8 / 10.7%, against 18.0 / 22.3 / 12.9 / 17.3% without the term).
# The same set's one-GPU runs of 40 and 80 requests, not fitted on, go from 19.8 / 30.9 / 29.7 / 22.1%
# to 5.8 / 30.1 / 22.6 / 14.4%. Its TP2 and TP4 runs do not call for the term (fitted alone they take
# 0-125 us, and at 875 us their TPOT is 44.9% against 31.7%): the replay's TP steps of the small models
# are already slow there, and those servers return a request's last tokens before its window ends
# (lambda_v0.yaml's header), so the term is fitted where neither is in play. The per-sequence term
# stays 0: at 10 requests the batch hardly varies (fitted free it goes to 0 with two of three models
# left out, 95 us with the third), and the runs of 40 and 80 requests cannot pin it: V0 runs every
# waiting prompt's prefill before any decode (vllm/core/scheduler.py `_schedule_default`), which the
# replay's engine does not, and fitted with them the per-sequence term (55 us) stands in for that wait.
DEFAULT_V0_STEP_US = 875.0
DEFAULT_V0_SEQ_US = 0.0


@dataclass(frozen=True)
class ServingTerms:
    api_server_us: float = DEFAULT_API_SERVER_US
    tokenize_us_per_token: float = DEFAULT_TOKENIZE_US_PER_TOKEN
    token_return_us: float = DEFAULT_TOKEN_RETURN_US
    decode_window_steps: int = 1
    engine_version: str = "v1"
    v0_step_us: float = 0.0  # 0 unless engine_version is v0
    v0_seq_us: float = 0.0

    def to_dict(self) -> dict[str, float | int | str]:
        out: dict[str, float | int | str] = {k: float(getattr(self, k)) for k in KEYS}
        if self.decode_window_steps != 1:  # listed where set: a V1 pool's plan keeps its shape
            out["decode_window_steps"] = self.decode_window_steps
        if self.engine_version == "v0":
            out.update(engine_version="v0", v0_step_us=float(self.v0_step_us), v0_seq_us=float(self.v0_seq_us))
        return out


@functools.lru_cache(maxsize=1)
def defaults() -> ServingTerms:
    """The shipped fit's serving terms (replay.calibration.profiles.request_fit), else the constants above."""
    from replay.calibration.profiles import request_fit

    fit = (request_fit(SERVING_FIT_GPU) or {}).get("serving") or {}
    return ServingTerms(**{k: float(fit[k]) for k in KEYS if k in fit})


def serving_terms(args: Any) -> ServingTerms:
    """A pool's terms: its `serving:` keys where set, else the defaults."""
    base = defaults()
    window = getattr(args, "decode_window_steps", None)
    v0 = (getattr(args, "engine_version", None) or "v1") == "v0"
    host = {"v0_step_us": DEFAULT_V0_STEP_US, "v0_seq_us": DEFAULT_V0_SEQ_US} if v0 else {}
    for key in host:
        if getattr(args, key, None) is not None:
            host[key] = float(getattr(args, key))
    return ServingTerms(**{k: (getattr(base, k) if getattr(args, k, None) is None else float(getattr(args, k)))
                           for k in KEYS}, decode_window_steps=1 if window is None else int(window),
                        engine_version="v0" if v0 else "v1", **host)


def with_host_terms(params: np.ndarray, terms: ServingTerms) -> np.ndarray:
    """A pool's step parameters with its engine's host terms added to the per-step and
    per-sequence overheads (V0's, the module's doc); a V1 pool's unchanged (the same array)."""
    if terms.engine_version != "v0" or (terms.v0_step_us == 0 and terms.v0_seq_us == 0):
        return params
    from replay.model.stepmodel import SEQ_OVERHEAD_US, STEP_OVERHEAD_US

    out = params.copy()
    out[STEP_OVERHEAD_US] += terms.v0_step_us
    out[SEQ_OVERHEAD_US] += terms.v0_seq_us
    return out


def engine_arrivals(arrival_us: np.ndarray, prompt_tokens: np.ndarray, pool_index: np.ndarray,
                    terms: Sequence[ServingTerms]) -> np.ndarray:
    """int64[N]: when each request reaches its engine, non-decreasing (the tokeniser is one thread
    and hands requests on in their order)."""
    if len(arrival_us) == 0:
        return np.asarray(arrival_us, np.int64)
    fixed = np.array([t.api_server_us for t in terms], np.float64)
    per_token = np.array([t.tokenize_us_per_token for t in terms], np.float64)
    out = np.array(arrival_us, np.int64)  # a copy, added to a chunk at a time: no trace-long temporaries
    for lo in range(0, len(out), _CHUNK):
        pools = pool_index[lo:lo + _CHUNK]
        out[lo:lo + _CHUNK] += np.rint(fixed[pools] + per_token[pools] * prompt_tokens[lo:lo + _CHUNK]).astype(np.int64)
    return np.maximum.accumulate(out, out=out)


_CHUNK = 1 << 20  # requests engine_arrivals adds at a time


def token_return_us(pool_index: np.ndarray, terms: Sequence[ServingTerms]) -> np.ndarray:
    """int64[N]: each request's token way back to the client, by its pool."""
    lag = np.array([round(t.token_return_us) for t in terms], np.int64)
    return lag[pool_index] if len(pool_index) else np.zeros(0, np.int64)


def _windowed(output_tokens, finished_us, window_steps):
    decode = np.asarray(output_tokens, np.int64) - 1
    return decode, (np.asarray(window_steps) > 1) & (decode > 0) & (np.asarray(finished_us) >= 0)


def window_step_us(output_tokens: np.ndarray, first_token_us: np.ndarray, finished_us: np.ndarray,
                   replica: np.ndarray, window_steps: np.ndarray) -> dict[int, float]:
    """Each replica's median (finished - first token) / (output_tokens - 1) over its requests that
    a decode window can hold (`window_delay_us`): the time a window's missing steps take there.
    Read from the whole run's columns: a median is not a sum of chunks."""
    decode, decoded = _windowed(output_tokens, finished_us, window_steps)
    if not decoded.any():
        return {}
    tpot = (np.asarray(finished_us, np.float64) - first_token_us) / np.maximum(decode, 1)
    replica = np.asarray(replica)
    return {int(r): float(np.median(tpot[decoded & (replica == r)])) for r in np.unique(replica[decoded])}


def window_delay_us(output_tokens: np.ndarray, first_token_us: np.ndarray, finished_us: np.ndarray,
                    replica: np.ndarray, window_steps: np.ndarray,
                    step_us: dict[int, float] | None = None) -> np.ndarray:
    """int64[N]: how much later each request's last token reaches its client than its last step's
    end, its engine returning tokens once per window of `window_steps` decode steps (the module's
    doc). A request unfinished (finished_us < 0), of one output token or whose decode steps fill
    its windows is not held; the others wait out their window's remaining steps at their replica's
    median time per output token (`step_us`, from `window_step_us`; these requests' own if not given)."""
    delay = np.zeros(len(output_tokens), np.int64)
    decode, decoded = _windowed(output_tokens, finished_us, window_steps)
    if not decoded.any():
        return delay
    if step_us is None:
        step_us = window_step_us(output_tokens, first_token_us, finished_us, replica, window_steps)
    k = np.asarray(window_steps, np.int64)
    missing = np.where(decoded, (-decode) % k, 0)  # ceil(decode / k) * k - decode
    replica = np.asarray(replica)
    for r in np.unique(replica[decoded]):
        mine = decoded & (replica == r)
        delay[mine] = np.rint(missing[mine] * step_us[int(r)]).astype(np.int64)
    return delay
