"""One numba dispatch per policy family, built from the registry's ordered list of kernels.

A family's integer id is the position of its kernel in that list (policies/registry.py), so
no id is written anywhere by hand. `build_dispatch(kernels, unknown)` returns a jitted
`dispatch(id, *args)` that calls `kernels[id](*args)`, or returns `unknown` for an id with no
kernel, which the engine turns into an error status (never a fallback to a default policy).

Why a chain of closures: numba cannot iterate a tuple of functions without its experimental
first-class function types (whose addresses cannot be cached), and a function made with
`exec` has no source file for `cache=True`. A closure over a kernel is compiled into the
cached engine kernel that calls it, so the engine loads from the cache in a second process
(tests/unit/test_policy_dispatch.py checks it). Each link is one integer compare.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from numba import njit


def build_dispatch(kernels: Sequence[Callable[..., Any]], unknown: Any) -> Callable[..., Any]:
    @njit(_nrt=False)
    def none_left(pid, *args):
        return unknown

    dispatch = none_left
    for i, kernel in enumerate(kernels):
        dispatch = _link(i, kernel, dispatch)
    return dispatch


def _link(i: int, kernel: Callable[..., Any], rest: Callable[..., Any]) -> Callable[..., Any]:
    @njit(_nrt=False)
    def dispatch(pid, *args):
        if pid == i:
            return kernel(*args)
        return rest(pid, *args)

    return dispatch


def build_reference(twins: Sequence[Callable[..., Any]], family: str) -> Callable[..., Any]:
    """The reference engine's dispatch: the same ids, the plain-Python twins, and an error (not a
    default) for an id with no policy."""

    def dispatch(pid: int, *args: Any) -> Any:
        if not 0 <= pid < len(twins):
            raise UnknownPolicyId(f"{family} id {pid} has no policy in policies.registry "
                                  f"(known ids 0..{len(twins) - 1})")
        return twins[pid](*args)

    return dispatch


class UnknownPolicyId(RuntimeError):
    """An engine was given a policy id the registry does not have: a bug in the tool."""
