"""shortest-prompt: shortest prompt first, then arrival.

Shortest-job-first on the known prompt length, as proposed for vLLM and SGLang schedulers;
the prompt is what a scheduler knows at admission (the output length is not).
"""

from __future__ import annotations

from numba import njit

from policies.queue_orders._view import QueueView

READS_PREFIX = False
SPECS = (("shortest-prompt", "shortest prompt first, then arrival",
          "shortest-job-first on known prompt length (e.g. SGLang/vLLM SJF proposals)"),)


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def head_kernel(nwait):
    return False


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def key_kernel(v, p, q, hits):
    return float(v.prompt[q])


def head(nwait: int) -> bool:
    return False


def key(v: QueueView, p: int, q: int, hits: int) -> float:
    return float(v.prompt[q])
