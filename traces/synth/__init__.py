"""Synthetic workloads from a spec (README "Workloads"): `synthesize(spec) -> LoadedTrace`."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from traces.loader import LoadedTrace
from traces.synth.frame import to_frame
from traces.synth.generate import parts
from traces.synth.spec import Spec, load_spec, parse_spec


def synthesize(spec: Spec, base_dir: str | Path | None = None, source: str = "synth") -> LoadedTrace:
    """The trace `spec` describes; paths in it are relative to `base_dir`."""
    from common.errors import ConfigError

    try:
        frame = to_frame(list(parts(spec, Path(base_dir) if base_dir else None)), source)
    except ConfigError as exc:  # what generating found (a rate past max_requests, a ServeGen file), named by spec
        text = str(exc)
        raise ConfigError(text if text.startswith(f"{source}: ") else f"{source}: {text}") from None
    if frame.height == 0:
        raise ConfigError(f"{source}: the spec generates no request (every rate is 0 over duration_s)")
    import dataclasses

    tag = json.dumps(dataclasses.asdict(spec), sort_keys=True, default=str)
    return LoadedTrace(frame=frame, source=source, format="synthetic", prefix_block_tokens=spec.prefix_block_tokens,
                       sha256=hashlib.sha256(tag.encode()).hexdigest(), dropped={}, reordered=0)


def synthesize_from(spec: str | dict, base_dir: str | Path | None = None) -> LoadedTrace:
    """A spec file or inline mapping (trace: {synthetic: ...}) synthesized."""
    parsed, folder, name = load_spec(spec, base_dir)
    return synthesize(parsed, folder, name)


__all__ = ["Spec", "load_spec", "parse_spec", "synthesize", "synthesize_from"]
