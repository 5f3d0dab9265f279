"""Closed loop: an autoscaler reads the arrivals the replay released, not the recorded ones."""

from __future__ import annotations

from tests.e2e.test_closed_loop_cli import HEADER, _row

# s1's second turn was recorded 29 s after its first, which the real server took 28.5 s to answer
# (think time 0.5 s); the replay answers in about a second, so it releases that turn at ~2 s.
ROWS = [_row(0, "s1", 1_000_000, 400, 20, 28_500_000), _row(1, "s1", 30_000_000, 480, 20, 1_000_000)]

PLUGIN = '''
from policies.api import Decision

def record(ctx, params, state):
    with open({log!r}, "a") as fh:
        m = ctx.metrics
        fh.write(f"{{m.now_us}},{{m.arrivals_per_s}},{{m.mean_prompt_tokens}},{{m.mean_output_tokens}}\\n")
    return Decision(1, state, {{}})
'''


def test_an_autoscaler_sees_released_turns_when_they_arrive(cli, write, tmp_path):
    log = tmp_path / "seen.csv"
    plugin = write("rec.py", PLUGIN.format(log=str(log)))
    trace = write("sessions.csv", "\n".join([HEADER, *ROWS]) + "\n")
    write("fleet.yaml", f"model: llama-3.1-8b\ngpu: h100-sxm-80gb\ntick_s: 1\n"
                        f"trace: {{path: {trace}, closed_loop: true}}\npools:\n"
                        "  - {name: default, replicas: 1, autoscaler: {policy: 'rec:record', min_replicas: 1, "
                        "max_replicas: 1}}\n")
    res = cli("run", "--config", "fleet.yaml", "--out", "o", "-q", "--plugin", str(plugin))
    assert res.code == 0, res.err
    seen = [tuple(float(x) for x in line.split(",")) for line in log.read_text().splitlines()]
    arrived = [(t, rate) for t, rate, _, _ in seen if rate > 0]
    assert sum(rate for _, rate in arrived) == 2  # 1 s ticks: every request counted once
    assert all(t <= 10_000_000 for t, _ in arrived), arrived  # not at its recorded 30 s
    assert [p for _, rate, p, _ in seen if rate > 0] in ([400.0, 480.0], [440.0])
    assert max(t for t, *_ in seen) >= 30_000_000  # the run still spans the recorded trace
