"""Prefill/decode disaggregation's KV transfer in the reference engine (the twin of
engine/transfer.py, whose comment above `transfer_blocks` gives the semantics)."""

from __future__ import annotations

import heapq
import math

from replay.engine.common import EV_ARRIVE, TRANSFERRING, WAITING
from replay.engine.reference.state import TRANSFER_DONE, Replica, Request


class TransferMixin:
    """ReferenceEngine's methods that move a prefilled request's KV to its decode replica."""

    def _transfer_blocks(self, req: Request) -> int:
        return math.ceil(req.prompt_tokens / int(self.inp.pool_block_size[self.inp.pd_decode_pool]))

    def _transfer_us(self, req: Request, t: int) -> int:
        inp = self.inp
        x = math.ceil(req.prompt_tokens * inp.pd_us_per_token)
        if inp.pd_layers > 0 and t == req.prefill_end_us:  # overlapped with the prefill, layer by layer
            x = max(math.ceil(x / inp.pd_layers), x - (req.prefill_end_us - req.prefill_start_us))
        return x + inp.pd_base_us

    def _hand_off(self, rep: Replica, req: Request, t: int) -> None:
        req.state, req.prefill_replica, req.prefill_end_us = TRANSFERRING, rep.index, t
        rep.outgoing += 1
        decode = self.replicas[req.decode_replica]
        decode.pending.append(req)
        self._accept_pending(decode, t)

    def _accept_pending(self, decode: Replica, t: int) -> None:
        """Start the transfers of the decode replica's queue while their blocks fit, in order."""
        watermark = int(self.inp.per_pool("watermark_blocks", 0)[decode.pool])
        while decode.pending and self._transfer_blocks(decode.pending[0]) <= decode.num_free - watermark:
            req = decode.pending.popleft()
            decode.reserved += self._transfer_blocks(req)
            req.kv_transfer_start_us = t
            req.kv_transfer_end_us = t + self._transfer_us(req, t)
            req.kv_transfers += 1
            heapq.heappush(self.heap, (req.kv_transfer_end_us, TRANSFER_DONE, req.index))

    def _finish_transfer(self, req: Request, t: int) -> None:
        prefill, decode = self.replicas[req.prefill_replica], self.replicas[req.decode_replica]
        self._free(prefill, req)
        prefill.outgoing -= 1
        if prefill.waiting:
            self._wake_idle(prefill, t)
        decode.reserved -= self._transfer_blocks(req)
        req.computed = 0
        self._grow(decode, req, req.prompt_tokens, int(self.inp.pool_block_size[decode.pool]))
        req.computed = req.prompt_tokens - 1  # vLLM recomputes the last prompt token for its logits
        req.replica, req.state = decode.index, WAITING
        decode.incoming -= 1
        req.queued_us = t
        decode.waiting.append(req)
        if self.inp.detailed_events:
            self._record(t, EV_ARRIVE, decode.index, req.index, prefill.index + 1)
        self._wake_idle(decode, t)
