"""Measured step times in, as batch compositions: the Splitwise `perf_model.csv` and a generic CSV.

Times are read in milliseconds (both formats) and kept in microseconds (`step_us`). Every row that
is read but not used is counted with its reason; a malformed row is a UserError naming the file,
the row and the column.
"""

from __future__ import annotations

import csv
import hashlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from common.errors import UserError
from common.files import read_text_file

FORMATS = ("splitwise", "generic")
# A table of measured steps is a few MB (Splitwise's profile: 1.3 MB); 1 GiB is a mistake.
MAX_TABLE_BYTES = 1 << 30

# Splitwise names -> catalog ids. h100-80gb-pcap is the H100 with a power cap, and its rows are
# derived, not measured (prompt_time = 1.3 x h100-80gb, token_time identical): never used.
SPLITWISE_MODELS = {"llama2-70b": "llama-2-70b"}
SPLITWISE_GPUS = {"a100-80gb": "a100-sxm-80gb", "h100-80gb": "h100-sxm-80gb"}
SPLITWISE_DERIVED_GPUS = ("h100-80gb-pcap",)
SPLITWISE_COLUMNS = ("model", "hardware", "prompt_size", "batch_size", "token_size", "prompt_time", "token_time",
                     "e2e_time", "tensor_parallel")

GENERIC_REQUIRED = ("prefill_tokens", "decode_seqs", "decode_context_tokens", "step_time_ms")
GENERIC_OPTIONAL = ("prefill_seqs", "prefill_context_tokens")
GENERIC_HELP = (
    "generic CSV: one row per measured engine step, with a header. Required columns: "
    "prefill_tokens (new prompt tokens computed in the step, chunks included), decode_seqs "
    "(sequences decoding one token), decode_context_tokens (their context lengths summed), "
    "step_time_ms (measured step duration). Optional: prefill_seqs (sequences with a prefill "
    "chunk; default 1 when prefill_tokens > 0), prefill_context_tokens (tokens already in the KV "
    "cache that the chunks attend to, summed; default 0). A row whose device column is cpu is "
    "refused (CPU timings cannot stand for a GPU's). Other columns are ignored."
)

# Minimum distinct batch compositions to fit the five coefficients and hold some out.
MIN_CONFIGS = 6


@dataclass
class Measured:
    """Measured steps as the step model sees them; one entry per measurement (repetitions kept)."""

    prefill_tokens: np.ndarray
    prefill_pairs: np.ndarray
    prefill_ctx: np.ndarray
    decode_seqs: np.ndarray
    decode_ctx: np.ndarray
    num_seqs: np.ndarray
    tp: np.ndarray
    step_us: np.ndarray
    column: np.ndarray  # which measured column each point comes from (str)
    config: np.ndarray  # batch-composition key: repetitions of one configuration share it (str)
    rows_read: int = 0
    excluded: dict[str, int] = field(default_factory=dict)
    sha256: str = ""

    def __len__(self) -> int:
        return len(self.step_us)

    def take(self, mask: np.ndarray) -> Measured:
        arrays = {k: getattr(self, k)[mask] for k in ("prefill_tokens", "prefill_pairs", "prefill_ctx", "decode_seqs",
                                                        "decode_ctx", "num_seqs", "tp", "step_us", "column", "config")}
        return Measured(**arrays, rows_read=self.rows_read, excluded=self.excluded, sha256=self.sha256)


def _read(path: Path, required: tuple[str, ...], what: str) -> tuple[list[dict[str, str]], str]:
    # Only a regular file, and a bounded one: a FIFO would hang and /dev/zero never ends.
    raw = read_text_file(path, str(path), what, MAX_TABLE_BYTES)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a text file (expected CSV)") from None
    reader = csv.DictReader(text.splitlines())
    header = reader.fieldnames or []
    missing = [c for c in required if c not in header]
    if missing:
        raise UserError(f"{path}: missing column(s) {', '.join(missing)}; expected {', '.join(required)} "
                        f"(header has: {', '.join(header) or 'nothing'})")
    return list(reader), hashlib.sha256(raw).hexdigest()


def _number(path: Path, i: int, row: dict[str, str], col: str, *, integer: bool = False,
            positive: bool = False) -> float:
    text = (row.get(col) or "").strip()
    where = f"{path}: row {i} (line {i + 1}), column {col!r}"
    try:
        value = float(text)
    except ValueError:
        raise UserError(f"{where}: got {text!r}, expected a number") from None
    if not np.isfinite(value) or value < 0 or (positive and value == 0):
        raise UserError(f"{where}: got {text!r}, expected a {'positive' if positive else 'non-negative'} number")
    if integer and value != int(value):
        raise UserError(f"{where}: got {text!r}, expected a whole number")
    return value


def _finish(path: Path, points: list[tuple], rows_read: int, excluded: Counter, sha: str, what: str,
            fitting: bool) -> Measured:
    configs = {p[-1] for p in points}
    if fitting and len(configs) < MIN_CONFIGS:
        raise UserError(f"{path}: {len(configs)} distinct batch composition(s) {what}; need at least {MIN_CONFIGS} "
                        "to fit the step model's 5 coefficients and cross-validate them")
    if not points:
        raise UserError(f"{path}: no measured steps {what}")
    cols = list(zip(*points))
    f = lambda k: np.asarray(cols[k], dtype=np.float64)  # noqa: E731
    return Measured(f(0), f(1), f(2), f(3), f(4), f(5), f(6).astype(np.int64), f(7),
                    np.asarray(cols[8], dtype=object), np.asarray(cols[9], dtype=object),
                    rows_read=rows_read, excluded=dict(excluded), sha256=sha)


def read_splitwise(path: str | Path, model: str, gpu: str, tp: int | None, fitting: bool = True) -> Measured:
    """Splitwise rows for `model` on `gpu` (catalog ids) at `tp` (None: every TP in the file).

    A row is a batch of `batch_size` identical requests (`prompt_size` tokens in, `token_size`
    out) run alone. `prompt_time` is one prefill step of batch_size x prompt_size tokens;
    `token_time` is the mean decode step of batch_size sequences, whose context grows from
    prompt_size to prompt_size + generated, so the mean context is prompt_size + generated / 2.
    For token_size >= 1024 generation stopped early (the README's caveat 2): the tokens
    generated are estimated as 1 + (e2e_time - prompt_time) / token_time, capped at token_size.
    """
    path = Path(path)
    rows, sha = _read(path, SPLITWISE_COLUMNS, "profile" if fitting else "table")
    excluded: Counter = Counter()
    points = []
    present: dict[tuple[str, str], set[str]] = {}
    for i, row in enumerate(rows, start=1):
        name, hw = row["model"].strip(), row["hardware"].strip()
        present.setdefault((name, hw), set()).add(row["tensor_parallel"].strip())
        if hw in SPLITWISE_DERIVED_GPUS:
            excluded[f"hardware {hw}: derived from h100-80gb, not measured"] += 1
            continue
        if SPLITWISE_MODELS.get(name) != model or SPLITWISE_GPUS.get(hw) != gpu:
            excluded[f"not asked for: {name} on {hw}"] += 1
            continue
        row_tp = int(_number(path, i, row, "tensor_parallel", integer=True, positive=True))
        if tp is not None and row_tp != tp:
            excluded[f"not asked for: tensor_parallel {row_tp}"] += 1
            continue
        p = _number(path, i, row, "prompt_size", integer=True, positive=True)
        b = _number(path, i, row, "batch_size", integer=True, positive=True)
        t = _number(path, i, row, "token_size", integer=True, positive=True)
        prompt_ms = _number(path, i, row, "prompt_time", positive=True)
        token_ms = _number(path, i, row, "token_time", positive=True)
        e2e_ms = _number(path, i, row, "e2e_time", positive=True)
        if row_tp == 2 and b == 64:
            excluded["tensor_parallel 2, batch_size 64: anomalous (memory exhaustion; the data's README, caveat 3)"] += 1
            continue
        key = f"tp{row_tp} prompt{int(p)} batch{int(b)} tokens{int(t)}"
        points.append((b * p, b * p * (p + 1) / 2, 0.0, 0.0, 0.0, b, row_tp, prompt_ms * 1000, "prompt_time", key))
        generated = min(t, max(1.0, 1 + (e2e_ms - prompt_ms) / token_ms))
        points.append((0.0, 0.0, 0.0, b, b * (p + generated / 2), b, row_tp, token_ms * 1000, "token_time", key))
    what = f"for {model} on {gpu}" + (f" at tensor_parallel {tp}" if tp is not None else "")
    if not points:
        usable = sorted(f"{SPLITWISE_MODELS[n]} on {SPLITWISE_GPUS[h]} (TP {', '.join(sorted(tps, key=int))})"
                        for (n, h), tps in present.items() if n in SPLITWISE_MODELS and h in SPLITWISE_GPUS)
        other = sorted({n for n, _ in present if n not in SPLITWISE_MODELS})
        raise UserError(f"{path}: no measured steps {what}; it has {'; '.join(usable) or 'none the catalog knows'}"
                        + (f" (and {', '.join(other)}, which the catalog lacks)" if other else ""))
    return _finish(path, points, len(rows), excluded, sha, what, fitting)


def read_generic(path: str | Path, tp: int, fitting: bool = True) -> Measured:
    """Rows of the generic format (see GENERIC_HELP); prefill chunks are taken as equal in size."""
    path = Path(path)
    rows, sha = _read(path, GENERIC_REQUIRED, "profile" if fitting else "table")
    points = []
    for i, row in enumerate(rows, start=1):
        pt = _number(path, i, row, "prefill_tokens", integer=True)
        ds = _number(path, i, row, "decode_seqs", integer=True)
        dctx = _number(path, i, row, "decode_context_tokens", integer=True)
        ms = _number(path, i, row, "step_time_ms", positive=True)
        ps = _number(path, i, row, "prefill_seqs", integer=True) if (row.get("prefill_seqs") or "").strip() \
            else float(pt > 0)
        pctx = _number(path, i, row, "prefill_context_tokens", integer=True) \
            if (row.get("prefill_context_tokens") or "").strip() else 0.0
        if (row.get("device") or "").strip().lower() == "cpu":
            raise UserError(f"{path}: row {i} (line {i + 1}), column 'device': got 'cpu'; steps timed on the CPU "
                            "(llm-replay profile --device cpu --tiny: a pipeline check on scaled-down shapes) cannot "
                            "stand for a GPU's steps")
        if pt + ds == 0:
            raise UserError(f"{path}: row {i} (line {i + 1}), columns 'prefill_tokens' and 'decode_seqs': both 0, "
                            "expected a step that computes at least one token")
        if (pt > 0) != (ps > 0):
            raise UserError(f"{path}: row {i} (line {i + 1}), column 'prefill_seqs': got {ps:g} with "
                            f"prefill_tokens {pt:g}; expected > 0 exactly when prefill_tokens > 0")
        chunk = pt / ps if ps else 0.0
        pairs = ps * (chunk * (pctx / ps if ps else 0.0) + chunk * (chunk + 1) / 2)
        key = f"prefill{pt:g}x{ps:g}+{pctx:g} decode{ds:g}@{dctx:g}"
        points.append((pt, pairs, pctx, ds, dctx, ps + ds, tp, ms * 1000, "step_time", key))
    return _finish(path, points, len(rows), Counter(), sha, "in the file", fitting)
