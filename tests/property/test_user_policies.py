"""The example user policies checked one call at a time with policies.testing, as a user checks theirs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from policies import examples
from policies.testing import check_choice, views

POLICIES = [examples.least_waiting_tokens, examples.least_outstanding, examples.shortest_job,
            examples.fewest_blocks, examples.cap_long_prompts]


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
def test_kernel_and_twin_agree_on_valid_choices(policy):
    @settings(max_examples=60, deadline=None)
    @given(views(policy))
    def check(args):
        check_choice(policy, args)

    check()


def test_check_choice_catches_a_twin_that_disagrees():
    import dataclasses

    wrong = dataclasses.replace(examples.least_outstanding, reference=lambda replicas, request, params, state: 0)

    @settings(max_examples=200, deadline=None)
    @given(views(wrong))
    def check(args):
        check_choice(wrong, args)

    with pytest.raises(AssertionError, match="kernel .* != twin"):
        check()
