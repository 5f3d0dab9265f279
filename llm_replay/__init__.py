"""The application layer, above tui, replay, policies, traces and common: the `llm-replay` console
entry point (`entry`), `python -m llm_replay`, and `app`, which completes replay's command table
with the dashboard's commands (`tui`, and what `run --tui` shows).

Importing this package imports nothing else, so that the entry point can turn a Ctrl-C during
the heavy imports into one line.
"""
