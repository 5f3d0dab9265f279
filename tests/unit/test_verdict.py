"""A run that went wrong says so: the verdict's lines from summary figures."""

from replay.outputs.verdict import verdict

PLANS = {"default": {"max_model_len": 8192, "kv_tokens_per_replica": 400_000}}
SLO = {"ttft_ms": 2000, "tpot_ms": 100}


def summary(**figures):
    base = {"requests": 100, "finished": 100, "rejected": 0, "unfinished": 0, "rejected_by_reason": {},
            "slo_attainment": 0.99, "pool_plans": PLANS}
    return {**base, **figures}


def test_a_healthy_run_has_no_verdict():
    assert verdict(summary(), SLO, 3600) == []


def test_all_rejected_names_the_reason_and_the_limit_behind_it():
    lines = verdict(summary(finished=0, rejected=100, rejected_by_reason={"context_length": 100},
                            slo_attainment=0.0), SLO)
    assert lines == ["all requests rejected: context_length 100 (prompt + output > max_model_len 8192)"]


def test_many_unfinished_is_an_overload_with_its_share():
    lines = verdict(summary(finished=37, unfinished=63, slo_attainment=0.3), SLO, 600)
    assert lines[0].startswith("overloaded: 63% of requests unfinished at the end of the trace: 63 of 100")
    assert "max_drain_s 600" in lines[0]
    assert lines[1] == "SLO met by only 30.0% of requests (TTFT <= 2 s and TPOT <= 100 ms)"


def test_a_few_stragglers_are_reported_but_not_called_an_overload():
    lines = verdict(summary(requests=1000, finished=999, unfinished=1), SLO)
    assert lines == ["1 of 1,000 requests unfinished at the end of the trace"]


def test_some_rejected_lists_every_reason_most_frequent_first():
    lines = verdict(summary(finished=90, rejected=10,
                            rejected_by_reason={"no_replica": 3, "exceeds_kv_capacity": 7}), SLO)
    assert lines == ["10.0% of requests rejected (10 of 100): exceeds_kv_capacity 7 (prompt + output > a "
                     "replica's whole KV cache of 400,000 tokens); no_replica 3 (the pool had no replica active "
                     "or starting)"]


def test_an_empty_trace_says_so():
    assert verdict(summary(requests=0, finished=0)) == ["no requests: the trace (after its filters) is empty"]
