"""Bounds on what observed-metrics files may cost to read, in one place.

An export a user was handed can be anything: a 10 GB JSON, a million series of a label-cardinality
accident, a label value of a megabyte. Each bound is one error naming the file and the bound;
none changes what is read when a file is within it. The defaults hold a day of 1 s scrapes of a
large fleet (8 pools x 16 replicas x a dozen metrics, histogram buckets included, is under
10,000 series) with room to spare.
"""

from __future__ import annotations

import dataclasses

MIB = 1 << 20


@dataclasses.dataclass(frozen=True)
class ObservedLimits:
    """`max_bytes`: one file's size; `max_files`: files per read; `max_series`: series over all
    files; `max_samples`: samples over all files; `max_labels`: labels of one series;
    `max_label_names`: distinct label names over all series (the labels struct's fields);
    `max_label_bytes`: one label name or value, in UTF-8 bytes; `max_line_bytes`: one line of a
    text format (CSV, OpenMetrics)."""

    max_bytes: int = 512 * MIB
    max_files: int = 64
    max_series: int = 200_000
    max_samples: int = 100_000_000
    max_labels: int = 64
    max_label_names: int = 256
    max_label_bytes: int = 1024
    max_line_bytes: int = 4 * MIB

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{f.name}: got {value!r}, expected a positive integer")


DEFAULT_LIMITS = ObservedLimits()
