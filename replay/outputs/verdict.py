"""A run's verdict: one line per thing that went wrong (requests rejected or left unfinished, the
SLO missed), so an overloaded replay never reads like any other table. Pure function of
summary.json's figures; `summary["verdict"]` holds the lines and the CLI prints them."""

from __future__ import annotations

# Below this share of requests meeting the SLO, the verdict says so (the default fleet meets
# 99.99%; the incident demo's shared pool 39%).
SLO_WARN_BELOW = 0.9
# From this share of unfinished requests on, the fleet is called overloaded (a few stragglers at
# the end of max_drain_s are not an overload but are still reported).
OVERLOADED_FROM = 0.05


def reason_text(reason: str, plans: dict) -> str:
    """What a reject reason means for this run's pools, in the units a user can act on."""
    def per_pool(key: str, fmt: str) -> str:
        values = sorted({int(p[key]) for p in plans.values() if p.get(key) is not None})
        return " / ".join(format(v, fmt) for v in values) if values else "?"

    if reason == "context_length":
        return f"prompt + output > max_model_len {per_pool('max_model_len', 'd')}"
    if reason == "exceeds_kv_capacity":
        return f"prompt + output > a replica's whole KV cache of {per_pool('kv_tokens_per_replica', ',')} tokens"
    return {
        "no_replica": "the pool had no replica active or starting",
        "queue_limit": "admission: the pool's queue was full",
        "rate_limit": "admission: over the token-bucket rate limit",
        "shed_low_priority": "admission: low-priority requests shed under load",
        "predicted_ttft_over_slo": "admission: predicted TTFT over the SLO",
        "admission_policy": "admission: rejected by the pool's user admission rule",
    }.get(reason, reason)


def _reasons(by_reason: dict[str, int], plans: dict) -> str:
    ranked = sorted(by_reason.items(), key=lambda kv: (-kv[1], kv[0]))
    return "; ".join(f"{reason} {count:,} ({reason_text(reason, plans)})" for reason, count in ranked)


def _ms(value: float) -> str:
    return f"{value / 1000:g} s" if value >= 1000 else f"{value:g} ms"


def verdict(summary: dict, slo: dict | None = None, max_drain_s: float | None = None) -> list[str]:
    """Lines saying what went wrong, most serious first; [] for a healthy run. `slo` is the
    fleet's {ttft_ms, tpot_ms} (for the wording only)."""
    n = summary.get("requests") or 0
    if n == 0:
        return ["no requests: the trace (after its filters) is empty"]
    rejected, unfinished = summary.get("rejected", 0), summary.get("unfinished", 0)
    by_reason = summary.get("rejected_by_reason") or {}
    plans = summary.get("pool_plans") or {}
    lines = []
    if rejected == n:
        lines.append(f"all requests rejected: {_reasons(by_reason, plans)}")
        return lines
    if unfinished:
        share = unfinished / n
        drain = f" (max_drain_s {max_drain_s:g})" if max_drain_s is not None else ""
        head = "overloaded: " if share >= OVERLOADED_FROM else ""
        lines.append(f"{head}{share:.0%} of requests unfinished at the end of the trace: {unfinished:,} of {n:,} "
                     f"still waiting or running when the replay stopped{drain}" if share >= 0.01 else
                     f"{unfinished:,} of {n:,} requests unfinished at the end of the trace{drain}")
    if rejected:
        lines.append(f"{rejected / n:.1%} of requests rejected ({rejected:,} of {n:,}): {_reasons(by_reason, plans)}")
    attained = summary.get("slo_attainment")
    if attained is not None and attained < SLO_WARN_BELOW:
        target = f" (TTFT <= {_ms(slo['ttft_ms'])} and TPOT <= {_ms(slo['tpot_ms'])})" if slo else ""
        lines.append(f"SLO met by only {attained:.1%} of requests{target}")
    return lines
