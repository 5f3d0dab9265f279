"""Multi-LoRA adapter slots in the reference engine (the twin of engine/lora.py)."""

from __future__ import annotations

from replay.engine.reference.state import Replica, Request


class LoraMixin:
    """ReferenceEngine's methods over adapters and each replica's adapter slots."""

    def _lora(self, req: Request) -> int:
        """The request's adapter where it runs (-1: none, or the pool serves no LoRA)."""
        pool = self.replicas[req.replica].pool
        return req.adapter if self.lora_slots[pool] > 0 else -1

    def _activate_lora(self, rep: Replica, adapter: int, t: int) -> int:
        """Adapter resident for the step at t: 1 if it was loaded into the least recently used
        slot that no request of this step uses (the lowest such slot on ties), else 0."""
        if adapter in rep.lora_id:
            rep.lora_used[rep.lora_id.index(adapter)] = t
            return 0
        free = [s for s in range(len(rep.lora_id)) if rep.lora_used[s] < t]
        slot = min(free, key=lambda s: (rep.lora_used[s], s))
        rep.lora_id[slot], rep.lora_used[slot] = adapter, t
        return 1

    def _empty_lora_slots(self, rep: Replica) -> None:
        slots = self.lora_slots[rep.pool]
        rep.lora_id, rep.lora_used = [-1] * slots, [-1] * slots
