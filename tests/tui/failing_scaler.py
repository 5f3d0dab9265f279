"""A user's autoscaler that fails mid-replay (tests/tui/test_cli_tui.py): the failure happens in
`run --tui`'s child process, after the parent's checks passed and the dashboard started."""

from common.errors import UserError


def fails(ctx, params, state):
    raise UserError("tests.tui.failing_scaler:fails: the replay ran out of luck")
