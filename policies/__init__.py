"""Scheduling, routing and scaling policies, selected by name (see `policies.registry`).

Policies never import `replay`: they see the frozen context types of `policies.api` (issue 3)
and return a choice; the engine does the accounting.
"""
