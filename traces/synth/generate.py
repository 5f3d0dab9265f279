"""`synthesize(spec)`: every workload of a synth spec generated and merged into one canonical
frame, sorted by arrival (ties keep the spec's workload order). Deterministic: each workload
(and each ServeGen client) draws from its own generator seeded by (spec seed, workload, client),
so the same spec and seed give the same rows, and adding a workload leaves the others alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from common.errors import ConfigError
from traces.synth import hashes
from traces.synth.arrivals import KINDS, arrivals, counts, times
from traces.synth.lengths import windowed, clipped, token_sampler
from traces.synth.servegen import WINDOW_S, client_files, dataset_beside, read_windows
from traces.synth.sessions import session_rows
from traces.synth.spec import MAX_TOKENS, Spec, Workload
from traces.synth.servegen import read_dataset, read_dataset_fields


@dataclass
class Part:
    """One workload's (or client's) rows, as numpy columns."""

    arrival_us: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    tenant: str
    workload: str
    priority: int
    adapter: np.ndarray | None  # index into the workload's adapters, -1: none; None: no adapters
    adapters: tuple[str, ...]
    session: np.ndarray | None = None  # session number, -1: none
    think_us: np.ndarray | None = None  # -1: null
    hash_flat: np.ndarray | None = None
    hash_len: np.ndarray | None = None
    extra: dict = field(default_factory=dict)


def _us(t_s: np.ndarray) -> np.ndarray:
    return np.floor(t_s * 1e6).astype(np.int64)


def _rng(spec: Spec, *keys: int) -> np.random.Generator:
    return np.random.default_rng([spec.seed, *keys])


def _adapters(rng, w: Workload, n: int) -> np.ndarray | None:
    if not w.adapters:
        return None
    pick = rng.integers(0, len(w.adapters), n)
    return np.where(rng.random(n) < w.adapter_share, pick, -1)


def _groups(rng, w: Workload, n: int) -> np.ndarray:
    sp = w.system_prompt
    if sp is None:
        return np.full(n, -1, np.int64)
    return np.where(rng.random(n) < sp.share, rng.integers(0, sp.groups, n), -1)


def _group_ns(spec: Spec, w: Workload) -> np.uint64:
    label = w.system_prompt.namespace if w.system_prompt and w.system_prompt.namespace else w.name
    return hashes.namespace(spec.namespace, spec.seed, "system", label)


def _plain(spec: Spec, index: int, w: Workload, base_dir: Path | None, where: str) -> Part:
    rng = _rng(spec, index)
    t = arrivals(rng, w.arrival, spec.duration_s, spec.max_requests, where)
    n = len(t)
    question = token_sampler(w.prompt, f"{where}.prompt", base_dir)(rng, n, t)
    output = token_sampler(w.output, f"{where}.output", base_dir)(rng, n, t)
    group = _groups(rng, w, n)
    part = Part(_us(t), question, output, w.tenant or w.name, w.name, w.priority, _adapters(rng, w, n), w.adapters)
    if w.system_prompt is not None:
        g_tokens = np.where(group >= 0, w.system_prompt.tokens, 0)
        part.prompt = np.minimum(question.astype(np.int64) + g_tokens, MAX_TOKENS)
        has = group >= 0
        part.hash_len = np.where(has, -(-part.prompt // spec.prefix_block_tokens), 0)
        ns = hashes.namespace(spec.namespace, spec.seed, w.name, "request")
        part.hash_flat = hashes.prompt_hashes(part.prompt[has], spec.prefix_block_tokens, ns, np.flatnonzero(has),
                                              _group_ns(spec, w), group[has], g_tokens[has])
    return part


def _sessions(spec: Spec, index: int, w: Workload, base_dir: Path | None, where: str) -> Part:
    rng = _rng(spec, index)
    starts = arrivals(rng, w.arrival, spec.duration_s, spec.max_requests, where)
    s = w.sessions
    turns = token_sampler(s.turns, f"{where}.sessions.turns", base_dir)
    samplers = (token_sampler(w.prompt, f"{where}.prompt", base_dir), token_sampler(w.output, f"{where}.output", base_dir),
                clipped(s.think_s, f"{where}.sessions.think_s", base_dir, 0.0, 1e6), turns)
    group = _groups(rng, w, len(starts))
    rows = session_rows(rng, starts, samplers, s, group, w.system_prompt.tokens if w.system_prompt else 0,
                        spec.duration_s, spec.max_requests)
    adapter = _adapters(rng, w, len(starts))
    adapter = adapter[rows.session] if adapter is not None else None
    part = Part(rows.arrival_us, rows.prompt, rows.output, w.tenant or w.name, w.name, w.priority, adapter, w.adapters,
                session=rows.session, think_us=rows.think_us)
    part.hash_len = -(-rows.prompt // spec.prefix_block_tokens)
    ns = hashes.namespace(spec.namespace, spec.seed, w.name, "session")
    g = group[rows.session]
    part.hash_flat = hashes.prompt_hashes(rows.prompt, spec.prefix_block_tokens, ns, rows.session, _group_ns(spec, w),
                                          g, np.where(g >= 0, w.system_prompt.tokens if w.system_prompt else 0, 0))
    return part


def _servegen_lengths(w: Workload, trace_file: Path, where: str, base_dir: Path | None):
    """The workload's own prompt/output samplers, else the client's dataset.json beside its trace."""
    if w.prompt is not None and w.output is not None:
        return token_sampler(w.prompt, f"{where}.prompt", base_dir), token_sampler(w.output, f"{where}.output", base_dir)
    dataset = dataset_beside(trace_file)
    if dataset is None:
        raise ConfigError(f"{where}.prompt: {trace_file.parent} has no chunk-<id>-dataset.json for client "
                          f"{trace_file.name}; give prompt and output distributions")
    # deepseek-r1 has input_tokens; mm-image splits the prompt into text/image/audio/video tokens
    fields = read_dataset_fields(str(dataset), where)
    output = windowed(read_dataset(str(dataset), "output_tokens", where), f"{dataset}: output_tokens")
    inputs = [windowed(table, f"{dataset}: {name}") for name, table in fields.items()
              if name.endswith("_tokens") and name != "output_tokens" and table]

    def prompt(rng, n, t):
        return np.maximum(np.rint(sum(s(rng, n, t) for s in inputs)), 1).astype(np.int32)
    return prompt, (lambda rng, n, t: np.maximum(np.rint(output(rng, n, t)), 1).astype(np.int32))


def _servegen(spec: Spec, index: int, w: Workload, base_dir: Path | None, where: str):
    sg = w.servegen
    folder = str(Path(base_dir) / sg.path) if base_dir and not Path(sg.path).expanduser().is_absolute() else sg.path
    for c, (client, path) in enumerate(client_files(folder, sg.clients, f"{where}.servegen")):
        win = read_windows(client, path)
        end = sg.start_s + spec.duration_s
        if win.start_s[-1] + WINDOW_S < end:
            raise ConfigError(f"{path}: its windows end at {win.start_s[-1] + WINDOW_S:,.0f} s, before "
                              f"{where}.servegen.start_s + duration_s = {end:,.0f} s")
        keep = (win.start_s + WINDOW_S > sg.start_s) & (win.start_s < end) & (win.pattern > 0)
        start = np.maximum(win.start_s[keep], sg.start_s)
        length = np.minimum(win.start_s[keep] + WINDOW_S, end) - start
        kind = np.where(win.pattern[keep] == 1, KINDS["gamma"], KINDS["weibull"]).astype(np.int8)
        rng = _rng(spec, index, c)
        n = counts(rng, kind, length, win.rate[keep] * sg.rate_scale)
        t = times(rng, start - sg.start_s, length, n, kind, win.shape[keep])
        prompt, output = _servegen_lengths(w, path, where, base_dir)
        yield Part(_us(t), prompt(rng, len(t), t + sg.start_s), output(rng, len(t), t + sg.start_s),
                   w.tenant or f"client-{client}", w.name, w.priority, _adapters(rng, w, len(t)), w.adapters)


def parts(spec: Spec, base_dir: Path | None):
    """Every workload's parts, in spec order; a running total past max_requests stops the spec."""
    total = 0
    for i, w in enumerate(spec.workloads):
        where = f"workloads[{i}]"
        if w.servegen is not None:
            gen = _servegen(spec, i, w, base_dir, where)
        else:
            gen = iter([(_sessions if w.sessions else _plain)(spec, i, w, base_dir, where)])
        for part in gen:
            total += len(part.arrival_us)
            if total > spec.max_requests:
                raise ConfigError(f"{where}: the spec makes more than max_requests={spec.max_requests:,} requests "
                                  "(raise max_requests, or shorten duration_s)")
            yield part
