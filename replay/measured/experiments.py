"""Real vLLM experiments (a folder holding experiments.csv and ground_truth.csv, as the sim-to-real
set of ../shared/measurements/vllm-s2r/ lays them out), read into checked `Experiment`s.

Both files are read bounded (common/files.py) and checked whole before anything runs: a bad row is
one UserError naming the file, the line, the column, the value and what was expected. Times are
ms in the measured figures, seconds in the stage lists (as the files give them).
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from common.errors import UserError
from common.files import read_text_file
from replay.measured.models import resolve_model

MAX_TABLE_BYTES = 16 << 20  # the shipped pair is about 100 kB; a campaign of thousands fits
WHOLE_RUN = -1  # ground_truth.csv's stage for figures over every request of the run

# The GPUs of the campaign (its README: "H100 80GB HBM3, A100 SXM4 80GB, L40S") -> catalog ids.
HARDWARE = {"H100": "h100-sxm-80gb", "A100": "a100-sxm-80gb", "L40S": "l40s-48gb"}
SETS = ("trainval", "validation")
# Measured figures this tool reads, and the unit each must be given in. Other metrics are kept as
# they are (a later file may add some) but never compared.
UNITS = {
    "ttft_mean": "ms", "ttft_p90": "ms", "ttft_p99": "ms", "itl_mean": "ms",
    "e2e_mean": "ms", "e2e_p90": "ms", "e2e_p99": "ms",
    "throughput_output_tok_s": "tokens/s", "throughput_input_tok_s": "tokens/s",
    "throughput_req_s": "requests/s", "prompt_len_mean": "tokens",
    "output_len_mean_retokenized": "tokens", "requests_ok": "requests", "requests_failed": "requests",
}
EXPERIMENT_COLUMNS = (
    "exp_id", "set", "model_hf", "hardware", "tp", "dp", "precision", "quantization", "max_num_batched_tokens",
    "max_num_seqs", "max_model_len", "gpu_memory_utilization", "cpu_offload", "cpu_offload_gib",
    "enable_prefix_caching", "enable_chunked_prefill", "block_size", "num_gpu_blocks", "num_stages",
    "stage_rates_rps", "stage_durations_s", "stage_requests", "system_prompt_len", "question_len", "output_len",
    "ignore_eos", "eff_num_groups", "eff_prompts_per_group", "manifest_notes", "measured_prompt_len_mean",
)
TRUTH_COLUMNS = ("exp_id", "set", "stage", "subset", "metric", "actual", "units")


@dataclass(frozen=True)
class Stage:
    """One constant-rate stage of inference-perf: `requests` = int(rate_rps x duration_s)."""

    index: int
    rate_rps: float
    duration_s: float
    requests: int


@dataclass(frozen=True)
class Experiment:
    """One real vLLM server under one workload, and what its client measured.

    `model` is what a fleet config's `model:` takes (a catalog id, or the path of a config.json
    found under --models). `measured[stage][metric]` holds ground_truth.csv's figures of subset
    `all` (stage 0, 1, ... or WHOLE_RUN); times in ms. `unsafe`: the manifest says the server could
    not sustain the rate (its queue grew)."""

    id: str
    set: str
    model_hf: str
    model: str
    hardware: str
    gpu: str
    tp: int
    dp: int
    precision: str
    quantization: str | None
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    gpu_memory_utilization: float
    cpu_offload: bool
    cpu_offload_gib: float | None
    enable_prefix_caching: bool
    enable_chunked_prefill: bool
    block_size: int
    num_gpu_blocks: int | None  # vLLM's logged KV cache size / block size, where known
    vllm_version: str
    workload: str
    stages: tuple[Stage, ...]
    system_prompt_len: int
    question_len: int
    output_len: int
    num_groups: int
    prompts_per_group: int
    manifest_notes: str
    unsafe: bool
    measured_prompt_len_mean: float | None
    measured: dict[int, dict[str, float]] = field(default_factory=dict)
    # The harness's output-token count over output_len on this model's runs that give one: what an
    # experiment of the same model without a count is read with (the count comes from the model's
    # tokenizer, so it is the model's, not the run's).
    counted_ratio: float | None = None

    @property
    def num_prompts(self) -> int:
        return self.num_groups * self.prompts_per_group

    def output_tokens_counted(self, stage: int) -> float:
        """Mean output tokens as the harness counted them for ITL (re-tokenised text where the
        ground truth gives the count, which undercounts Llama-2's; else output_len, as generated)."""
        got = self.measured.get(stage, {}).get("output_len_mean_retokenized")
        if got is not None:
            return float(got)
        return float(self.output_len) * (self.counted_ratio or 1.0)

    def not_modelled(self) -> tuple[str, ...]:
        """Engine settings of the real server the replay does not reproduce (shown beside its rows)."""
        out = []
        if self.cpu_offload:
            out.append(f"CPU KV offload ({self.cpu_offload_gib:g} GiB): not modelled")
        if not self.enable_chunked_prefill:
            out.append("chunked prefill off: not modelled (the replay always chunks)")
        return tuple(out)


class _Row:
    """One CSV row with its file and line, for messages."""

    def __init__(self, display: str, line: int, values: dict[str, str]):
        self.display, self.line, self.values = display, line, values

    def fail(self, column: str, expected: str) -> UserError:
        shown = repr(self.values.get(column, ""))
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        ident = self.values.get("exp_id", "")
        where = f"line {self.line}" + (f" (exp_id {ident})" if ident and column != "exp_id" else "")
        return UserError(f"{self.display}: {where}: column {column}: got {shown}, expected {expected}")

    def text(self, column: str, *, required: bool = True) -> str:
        value = self.values[column].strip()
        if required and not value:
            raise self.fail(column, "a value")
        return value

    def integer(self, column: str, *, low: int = 1, blank: int | None = None) -> int:
        value = self.values[column].strip()
        if not value and blank is not None:
            return blank
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not number.is_integer() or number < low or number > 1 << 40:
            raise self.fail(column, f"a whole number >= {low}")
        return int(number)

    def number(self, column: str, *, positive: bool = True) -> float:
        try:
            number = float(self.values[column])
        except ValueError:
            number = math.nan
        if not math.isfinite(number) or (number <= 0 if positive else number < 0) or number > 1e15:
            raise self.fail(column, f"a number {'> 0' if positive else '>= 0'}")
        return number

    def flag(self, column: str) -> bool:
        value = self.values[column].strip()
        if value not in ("True", "False", "true", "false"):
            raise self.fail(column, "True or False")
        return value.lower() == "true"

    def numbers(self, column: str, count: int) -> list[float]:
        parts = self.values[column].split(";")
        try:
            out = [float(p) for p in parts]
        except ValueError:
            out = []
        if len(out) != count or not all(math.isfinite(x) and x > 0 for x in out):
            raise self.fail(column, f"{count} number(s) > 0 separated by ';' (num_stages is {count})")
        return out


def _rows(path: Path, columns: tuple[str, ...]) -> list[_Row]:
    display = str(path)
    data = read_text_file(path, display, "table", MAX_TABLE_BYTES)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UserError(f"{display}: not UTF-8 text (expected a CSV table)") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
        if not header:
            raise UserError(f"{display}: empty (expected a CSV header with {', '.join(columns)})")
        header = [h.strip() for h in header]
        missing = [c for c in columns if c not in header]
        if missing:
            raise UserError(f"{display}: line 1: missing column {missing[0]!r} (expected {', '.join(columns)})")
        rows = []
        for record in reader:
            if not any(cell.strip() for cell in record):
                continue
            if len(record) != len(header):
                raise UserError(f"{display}: line {reader.line_num}: {len(record)} fields, expected {len(header)} "
                                "as the header")
            rows.append(_Row(display, reader.line_num, dict(zip(header, record))))
    except csv.Error as exc:
        raise UserError(f"{display}: line {reader.line_num}: not valid CSV ({exc})") from None
    if not rows:
        raise UserError(f"{display}: no rows (expected one per experiment)")
    return rows


def _experiment(row: _Row, models_dir: Path | None) -> Experiment:
    ident = row.text("exp_id")
    if row.text("set") not in SETS:
        raise row.fail("set", " or ".join(SETS))
    hardware = row.text("hardware")
    if hardware not in HARDWARE:
        raise row.fail("hardware", "one of " + ", ".join(HARDWARE))
    precision = row.text("precision")
    if precision not in ("FP16", "BF16", "FP8"):
        raise row.fail("precision", "FP16, BF16 or FP8")
    num_stages = row.integer("num_stages")
    rates = row.numbers("stage_rates_rps", num_stages)
    durations = row.numbers("stage_durations_s", num_stages)
    counts = row.numbers("stage_requests", num_stages)
    stages = []
    for i, (rate, duration, count) in enumerate(zip(rates, durations, counts)):
        # inference-perf's ConstantLoadTimer sends int(rate * duration) requests (load_timer.py)
        if count != int(rate * duration):
            raise row.fail("stage_requests", f"int(rate x duration) = {int(rate * duration)} for stage {i} "
                                             f"({rate:g} req/s x {duration:g} s)")
        stages.append(Stage(i, rate, duration, int(count)))
    if not row.flag("ignore_eos"):
        raise row.fail("ignore_eos", "True (the workload is rebuilt with exactly output_len tokens per request)")
    offload = row.flag("cpu_offload")
    notes = row.values["manifest_notes"].strip()
    prompt_mean = row.values["measured_prompt_len_mean"].strip()
    return Experiment(
        id=ident, set=row.text("set"), model_hf=row.text("model_hf"),
        model=resolve_model(row.text("model_hf"), models_dir, lambda expected: row.fail("model_hf", expected)),
        hardware=hardware, gpu=HARDWARE[hardware], tp=row.integer("tp"), dp=row.integer("dp", blank=1),
        precision=precision, quantization=row.text("quantization", required=False) or None,
        max_num_batched_tokens=row.integer("max_num_batched_tokens"), max_num_seqs=row.integer("max_num_seqs"),
        max_model_len=row.integer("max_model_len"),
        gpu_memory_utilization=_share(row, "gpu_memory_utilization"),
        cpu_offload=offload, cpu_offload_gib=row.number("cpu_offload_gib") if offload else None,
        enable_prefix_caching=row.flag("enable_prefix_caching"),
        enable_chunked_prefill=row.flag("enable_chunked_prefill"), block_size=row.integer("block_size"),
        num_gpu_blocks=row.integer("num_gpu_blocks", blank=0) or None,
        vllm_version=row.values.get("vllm_version", "").strip(), workload=row.values.get("workload", "").strip(),
        stages=tuple(stages), system_prompt_len=row.integer("system_prompt_len", low=0),
        question_len=row.integer("question_len", low=0), output_len=row.integer("output_len"),
        num_groups=row.integer("eff_num_groups"), prompts_per_group=row.integer("eff_prompts_per_group"),
        manifest_notes=notes, unsafe="unsafe" in notes.lower(),
        measured_prompt_len_mean=row.number("measured_prompt_len_mean") if prompt_mean else None,
    )


def _share(row: _Row, column: str) -> float:
    value = row.number(column)
    if value > 1:
        raise row.fail(column, "a share in (0, 1]")
    return value


def _ground_truth(path: Path, experiments: dict[str, Experiment]) -> None:
    """Fill each experiment's `measured` from ground_truth.csv (subset `all`)."""
    seen: set[tuple[str, int, str, str]] = set()
    for row in _rows(path, TRUTH_COLUMNS):
        ident = row.text("exp_id")
        exp = experiments.get(ident)
        if exp is None:
            raise row.fail("exp_id", "an exp_id of experiments.csv")
        if row.text("set") != exp.set:
            raise row.fail("set", f"{exp.set!r}, the experiment's set in experiments.csv")
        stage = row.integer("stage", low=WHOLE_RUN)
        if stage >= len(exp.stages):
            raise row.fail("stage", f"-1 (whole run) or a stage of the experiment (0..{len(exp.stages) - 1})")
        metric = row.text("metric")
        if metric in UNITS and row.text("units") != UNITS[metric]:
            raise row.fail("units", f"{UNITS[metric]!r} for {metric}")
        value = row.number("actual", positive=False)
        key = (ident, stage, row.text("subset"), metric)
        if key in seen:
            raise row.fail("metric", f"one row per experiment, stage, subset and metric ({metric} appears twice)")
        seen.add(key)
        if key[2] == "all":
            exp.measured.setdefault(stage, {})[metric] = value


def load_experiments(folder: str | Path, models: str | Path | None = None) -> list[Experiment]:
    """Every experiment of `folder`/experiments.csv with its figures from `folder`/ground_truth.csv,
    in file order. A model not in the catalog is looked up under `models` (replay/measured/models.py)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"{folder}: not a folder (expected the measurements folder holding experiments.csv "
                        "and ground_truth.csv)")
    models_dir = Path(models) if models is not None else None
    if models_dir is not None and not models_dir.is_dir():
        raise UserError(f"--models {models_dir}: not a folder (expected one holding model config.json folders)")
    experiments: dict[str, Experiment] = {}
    for row in _rows(folder / "experiments.csv", EXPERIMENT_COLUMNS):
        exp = _experiment(row, models_dir)
        if exp.id in experiments:
            raise row.fail("exp_id", "an id no other row uses")
        experiments[exp.id] = exp
    _ground_truth(folder / "ground_truth.csv", experiments)
    return _with_counted_ratios(list(experiments.values()))


def _with_counted_ratios(experiments: list[Experiment]) -> list[Experiment]:
    """Experiments without the harness's token count read with their model's ratio (README: the
    harness re-tokenises the text, which for Llama-2-7B counts about 195-209 of 248 tokens)."""
    ratios: dict[str, list[float]] = {}
    for e in experiments:
        got = e.measured.get(WHOLE_RUN, {}).get("output_len_mean_retokenized")
        if got is not None:
            ratios.setdefault(e.model_hf, []).append(got / e.output_len)
    return [replace(e, counted_ratio=sum(ratios[e.model_hf]) / len(ratios[e.model_hf]))
            if e.model_hf in ratios and "output_len_mean_retokenized" not in e.measured.get(WHOLE_RUN, {}) else e
            for e in experiments]
