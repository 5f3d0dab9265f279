"""Preemption victims: which running request gives up its KV when a step runs out of blocks.

One module per policy: `kernel` (numba), `reference` (its plain-Python twin), `SPECS` (name,
summary, upstream source). Both get a `VictimView` (policies/victims/_view.py) and return an
index into the replica's running list. None has parameters: upstream, the victim follows from
vLLM's `scheduling_policy` and takes no setting of its own.
"""
