"""samples.numbers, the bulk reading of a range query's value strings, against `number`, the
one-at-a-time definition: the same floats when every text is a number without space around
it, None (the caller's checked loop then names the sample) when any is not."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, strategies as st

from traces.observed.prom_json import _well_formed
from traces.observed.samples import number, numbers

# Texts near the grammar: numbers, their case and spacing variants, and what float() alone takes
_PIECES = st.sampled_from(["0", "1", "12", "0.5", ".5", "5.", "1e5", "1E-05", "+3", "-2.5e+3", "NaN", "nan",
                           "+Inf", "-Inf", "inf", "Infinity", "naN", "INF", "1_000", " 1", "1 ", "", "1-2",
                           "1.2.3", "e5", "\n", "1\n2", "٣", "0x10", "1e400", "-0"])
_TEXT = st.one_of(_PIECES, st.lists(_PIECES, min_size=1, max_size=3).map("".join),
                  st.text(alphabet="0123456789.eE+-naINfity \n", max_size=6))


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))


@given(st.lists(_TEXT, max_size=12))
def test_numbers_is_number_of_each_or_none(texts):
    got = numbers(texts)
    each = [number(t) for t in texts]
    if got is None:
        assert any(x is None or t != t.strip() or "\n" in t for t, x in zip(texts, each))
    else:
        assert len(got) == len(texts)
        assert all(x is not None and _same(g, x) for g, x in zip(got.tolist(), each))
    if all(x is not None and t == t.strip() for t, x in zip(texts, each)):
        assert got is not None


@given(st.lists(st.tuples(st.one_of(st.integers(-2**60, 2**60), st.floats(allow_nan=False, allow_infinity=False),
                                    st.booleans(), st.text(max_size=2)),
                          _TEXT), max_size=8),
       st.sampled_from([None, 1, 3]))
def test_well_formed_pairs_read_as_the_checked_loop_would(pairs, odd_length):
    values = [list(p) for p in pairs]
    if odd_length is not None and values:
        values[0] = values[0][:odd_length] if odd_length < 2 else values[0] + ["x"]
    got = _well_formed(values)
    ok = all(len(p) == 2 and type(p[0]) in (int, float) and isinstance(p[1], str) and number(p[1]) is not None
             and p[1] == p[1].strip() and "\n" not in p[1] for p in values)
    assert (got is not None) == ok
    if got is not None:
        t, v = got
        np.testing.assert_array_equal(t, [float(p[0]) for p in values])
        assert all(_same(a, number(p[1])) for a, p in zip(v.tolist(), values))
