"""Capacity plans: the cheapest fleet that meets an SLO on a trace (`llm-replay plan`)."""
