"""The whole way in, for a command: read the files, map them to the fleet's pools, align them
on the replay's grid. What the caller prints comes back with it: the unknown metric names, the
known ones not compared, and the samples dropped outside the window."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

from traces.observed.align import Aligned, Grid, align
from traces.observed.config import ObservedConfig
from traces.observed.limits import DEFAULT_LIMITS, ObservedLimits
from traces.observed.mapping import Mapped, select
from traces.observed.read import read_observed


@dataclasses.dataclass(frozen=True)
class Observation:
    aligned: Aligned
    mapped: Mapped

    def notes(self) -> list[str]:
        """Lines for the CLI to print: what was read and not used."""
        out = []
        if self.mapped.unknown:
            out.append(f"observed: not a metric this tool knows, left out: {', '.join(self.mapped.unknown)}")
        if self.mapped.unused:
            out.append(f"observed: known, not compared: {', '.join(self.mapped.unused)}")
        if self.mapped.dropped:
            n = self.mapped.dropped
            out.append(f"observed: {n:,} sample{'s' if n != 1 else ''} outside the trace's window left out")
        return out


def observe(paths: Sequence[str | Path], config: ObservedConfig, pools: Sequence[str], grid: Grid,
            trace_offset_s: float | None = None, by_replica: bool = False,
            limits: ObservedLimits = DEFAULT_LIMITS) -> Observation:
    """`paths` read, mapped to `pools` over the grid's span, and aligned on `grid` (trace seconds;
    `trace_offset_s`: the wall time of trace time 0 when the config has no `offset_s`)."""
    observed = read_observed(paths, limits)
    window = (grid.start_s, grid.start_s + grid.tick_s * (grid.n - 1))
    mapped = select(observed, config, pools, window, trace_offset_s)
    return Observation(align(mapped, grid, config, by_replica), mapped)
