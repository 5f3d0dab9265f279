"""Sample traces shipped inside the package (`traces/data/`), addressed by short names."""

from __future__ import annotations

import importlib.resources
import pathlib

from common.errors import TraceError

BUNDLED: dict[str, str] = {
    "azure-conv-2023": "AzureLLMInferenceTrace_conv.csv",
    "azure-code-2023": "AzureLLMInferenceTrace_code.csv",
    "mooncake-synthetic": "synthetic_trace.jsonl",
}
DEFAULT_TRACE = "azure-conv-2023"


def bundled_trace_path(name: str) -> pathlib.Path:
    """Path of the bundled trace called `name` (works from a source tree and an installed wheel)."""
    if name not in BUNDLED:
        raise TraceError(f"unknown bundled trace {name!r}; known: {', '.join(sorted(BUNDLED))}")
    resource = importlib.resources.files("traces") / "data" / BUNDLED[name]
    return pathlib.Path(str(resource))
