"""Autoscaling policies: one file each, pure `policy(ctx, params, state) -> Decision[state]`."""

# Each module has a frozen `Params` dataclass (upstream defaults, seconds in `_s` fields) and a
# frozen `State`; `guard.py` wraps every one with the decision interval, bounds and cooldowns.
# Select them by name through `policies.registry.AUTOSCALERS`.
