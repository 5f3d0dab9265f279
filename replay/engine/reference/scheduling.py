"""One scheduler step in the reference engine, written to be read (the twin of
engine/scheduling.py); it follows `vllm/v1/core/sched/scheduler.py` (`Scheduler.schedule`)."""

from __future__ import annotations

import heapq
import math

from replay.engine.common import (
    EV_FINISH,
    EV_FIRST_TOKEN,
    EV_PREEMPT,
    EV_SCHEDULE,
    EV_SWAP_OUT,
    FINISHED,
    RUNNING,
    SPEC_CREDIT_SCALE,
    WAITING,
    InvariantViolation,
)
from replay.engine.reference.state import STEP_END, Replica, Request
from replay.model.stepmodel import step_time_us_nb
from policies._dispatch import build_reference
from policies.registry import QUEUE_MODULES, VICTIM_MODULES

victim_reference = build_reference([m.reference for m in VICTIM_MODULES], "preemption victim")
queue_head_reference = build_reference([m.head for m in QUEUE_MODULES], "queue order")
queue_key_reference = build_reference([m.key for m in QUEUE_MODULES], "queue order")


class SchedulingMixin:
    """ReferenceEngine's methods that build a step, and apply it when it ends."""

    def _start_step(self, rep: Replica, t: int) -> None:
        """Build the step that starts at t on `rep` (as engine/scheduling.py's `schedule`) and
        queue its end; with nothing to run, schedule again if it preempted."""
        p = rep.pool
        # Async scheduling (vLLM V1's default, `EngineCore.step_with_batch_queue`): while requests
        # run, this step was scheduled as the previous one started (rep.step_start), so only the
        # requests queued by then can join it; an engine with nothing running schedules at once.
        cutoff = rep.step_start if self.async_scheduling[p] and rep.running else t
        budget, preempted, swap_blocks = self._schedule_running(rep, t)
        if not preempted:  # admission never preempts
            swap_blocks += self._schedule_waiting(rep, t, budget, cutoff)
        self._run_step(rep, t, preempted, swap_blocks)

    @staticmethod
    def _chunk(threshold: int, new: int, budget: int) -> int:
        """The tokens a request computes in this step: capped by long_prefill_token_threshold
        and by the budget left."""
        if 0 < threshold < new:
            new = threshold
        return min(new, budget)

    def _schedule_running(self, rep: Replica, t: int) -> tuple[int, bool, int]:
        """Step 1: running requests first, in order; make room by preempting the policy's victim.
        Returns the token budget left, whether it preempted, and the blocks swapped out."""
        p = rep.pool
        bs = int(self.inp.pool_block_size[p])
        threshold = int(self.inp.pool_long_prefill_token_threshold[p])
        budget = int(self.inp.pool_max_num_batched_tokens[p])
        preempted = False
        swap_blocks = 0  # copied to or from host memory in this step
        i = 0
        while i < len(rep.running) and budget > 0:
            req = rep.running[i]
            new = self._chunk(threshold, self._wanted(req), budget)
            while self._blocks_needed(req, req.computed + new, bs) > rep.num_free:
                vi = self._victim(rep, i)
                victim = rep.running.pop(vi)
                budget += victim.scheduled  # a victim scheduled earlier in this step gives its tokens back
                victim.scheduled = 0
                swap_blocks += self._preempt(rep, victim, t)
                preempted = True
                if victim is req:
                    break
                i -= vi < i
            else:
                self._grow(rep, req, req.computed + new, bs)
                req.scheduled = new
                budget -= new
                i += 1
                continue
            break
        return budget, preempted, swap_blocks

    def _schedule_waiting(self, rep: Replica, t: int, budget: int, cutoff: int) -> int:
        """Step 2: waiting requests, in the queue order's pick. A step holds at most max_loras
        distinct adapters: a request that would need one more is skipped and keeps its place at
        the head of the queue (vLLM V1 `Scheduler.schedule`). Returns the blocks swapped in."""
        p = rep.pool
        bs = int(self.inp.pool_block_size[p])
        max_loras = self.lora_slots[p]
        swap_blocks = 0
        skipped = []
        while rep.waiting and budget > 0 and len(rep.running) < self.inp.pool_max_num_seqs[p]:
            req = self._next_waiting(rep, bs, cutoff)
            if req is None:
                break  # the rest joined the queue after this step was scheduled
            loras = {self._lora(x) for x in rep.running if x.scheduled} - {-1}
            if self._lora(req) >= 0 and self._lora(req) not in loras and len(loras) >= max_loras:
                rep.waiting.remove(req)
                skipped.append(req)
                continue
            fit = self._fit_waiting(rep, req, budget)
            if fit is None:
                break  # its chunk does not fit
            hits, computed, new = fit
            swap_blocks += self._join_batch(rep, req, t, hits, computed, new)
            budget -= new
        rep.waiting.extendleft(reversed(skipped))
        return swap_blocks

    def _fit_waiting(self, rep: Replica, req: Request, budget: int) -> tuple[list[int], int, int] | None:
        """Where a waiting request would start and what it would compute in this step: (its
        prefix-cache hit blocks, computed, new), or None when its chunk does not fit."""
        inp, p = self.inp, rep.pool
        bs = int(inp.pool_block_size[p])
        received = len(req.blocks)  # blocks it holds already: KV received from a prefill replica
        resumed = req.swapped  # KV tokens coming back from host memory
        hits = [] if resumed or received else self._cached_prefix(rep, req, bs)
        computed = req.computed if received else (resumed or len(hits) * bs)
        new = self._chunk(int(inp.pool_long_prefill_token_threshold[p]), req.num_tokens - computed, budget)
        evictable = sum(1 for b in hits if rep.kv.ref[b] == 0)
        # The chunk must fit; with the whole-prompt gate, everything still to compute must; the
        # watermark keeps blocks free for running requests to grow into.
        upto = req.num_tokens if inp.per_pool("whole_prompt", 0)[p] else computed + new
        watermark = int(inp.per_pool("watermark_blocks", 0)[p])
        need = math.ceil(upto / bs) - len(hits) - received
        if need > 0 and need + evictable > rep.num_free - watermark:
            return None
        return hits, computed, new

    def _join_batch(self, rep: Replica, req: Request, t: int, hits: list[int], computed: int, new: int) -> int:
        """A waiting request joins the step with `new` tokens from `computed` (its prefix-cache
        hits taken first); returns the blocks swapped back in from host memory."""
        bs = int(self.inp.pool_block_size[rep.pool])
        swap_blocks = 0
        resumed = req.swapped
        if not req.blocks:  # received no KV from a prefill replica
            for block in hits:
                rep.kv.touch(block)
            req.blocks = hits
            req.num_cached_blocks = len(hits)
            req.computed = computed
        self._grow(rep, req, computed + new, bs)
        if resumed:  # swap in: the host copy is released
            back = math.ceil(resumed / bs)
            rep.host_free += back
            swap_blocks += back
            req.swapped = 0
        rep.waiting.remove(req)
        rep.running.append(req)
        req.state = RUNNING
        req.scheduled = new
        req.prefill_start_us = t
        if req.first_scheduled_us < 0:
            req.first_scheduled_us, req.cached_tokens = t, computed
            rep.counters["hit_tokens"] += computed
            rep.counters["query_tokens"] += req.prompt_tokens
        rep.counters["admitted"] += 1
        if self.inp.detailed_events:
            self._record(t, EV_SCHEDULE, rep.index, req.index, computed)
        return swap_blocks

    def _run_step(self, rep: Replica, t: int, preempted: bool, swap_blocks: int) -> None:
        """Step 3: what the step computes, for the step model; adapters not in a slot are loaded."""
        inp, p = self.inp, rep.pool
        batch = [req for req in rep.running if req.scheduled]
        if not batch:
            if preempted:  # the victim was the request itself: schedule again, as vLLM
                self._wake(rep, t)
            elif rep.waiting and not rep.outgoing and not rep.reserved:  # impossible: see engine/loop.advance_nb
                raise InvariantViolation(f"replica {rep.index} has {len(rep.waiting)} waiting requests but cannot "
                                         f"schedule any at t_us={t}")
            return
        prefill = [(req.scheduled, req.computed) for req in batch if not req.is_decoding]
        decodes = [(req.scheduled, req.computed) for req in batch if req.is_decoding]
        adapters = []  # distinct, in batch order
        for req in batch:
            if self._lora(req) >= 0 and self._lora(req) not in adapters:
                adapters.append(self._lora(req))
        loads = sum(self._activate_lora(rep, a, t) for a in adapters)
        duration = int(step_time_us_nb(
            inp.pool_step_params[p],
            sum(new for new, _ in prefill),
            sum(new * before + new * (new + 1) / 2.0 for new, before in prefill),
            sum(before for _, before in prefill),
            len(decodes),
            sum(before + 1 for _, before in decodes),
            len(batch),
            sum(new - 1 for new, _ in decodes),  # draft tokens verified
            len(adapters),
        )) + swap_blocks * int(inp.per_pool("swap_us_per_block", 0)[p])
        duration += loads * int(inp.per_pool("lora_load_us", 0)[p])
        rep.step_start, rep.busy_until = t, t + duration
        rep.counters["steps"] += 1
        heapq.heappush(self.heap, (rep.busy_until, STEP_END, rep.index))

    def _wanted(self, req: Request) -> int:
        """Tokens a running request computes next: the rest of its prompt, one decode token, or
        under speculative decoding a verify step of the token plus up to k drafts (none past its
        last output token)."""
        k = self.spec_k[self.replicas[req.replica].pool]
        if k and req.is_decoding:
            return 1 + min(k, req.output_tokens - req.generated - 1)
        return req.num_tokens - req.computed

    def _victim(self, rep: Replica, i: int) -> int:
        """Index in the running list of the request to preempt while scheduling index i: the
        pool's victim policy's twin (policies/victims/) over a VictimView."""
        view = self.victim_view._replace(run=[req.index for req in rep.running], pool=rep.pool)
        return victim_reference(int(self.victims[rep.pool]), view, 0, len(rep.running), i)

    def _next_waiting(self, rep: Replica, bs: int, cutoff: int) -> Request | None:
        """The queue order's pick among the requests queued by `cutoff` (None: no such request);
        ties go to the earlier arrival, then the lower index."""
        policy, p = int(self.queues[rep.pool]), rep.pool
        eligible = [req for req in rep.waiting if req.queued_us <= cutoff]
        received = [req for req in eligible if req.blocks]  # KV arrived: goes first (see engine/scheduling.pick_waiting)
        if received:
            return received[0]
        if not eligible:
            return None
        if queue_head_reference(policy, len(rep.waiting)):
            return eligible[0]  # the queue's own order (FCFS)

        def key(req: Request) -> tuple:
            hits = len(self._cached_prefix(rep, req, bs)) if self.queue_hits[p] else 0
            return (queue_key_reference(policy, self.queue_view, p, req.index, hits), req.arrival_us, req.index)

        return min(eligible, key=key)

    def _preempt(self, rep: Replica, req: Request, t: int) -> int:
        """Back to the head of the queue; swap mode keeps the KV in host memory while the swap
        space lasts (returns the blocks copied, which the step pays for), else recompute."""
        held = len(req.blocks)
        swap = self.inp.per_pool("swap", 0)[rep.pool] and held <= rep.host_free
        self._free(rep, req)
        if swap:
            rep.host_free -= held
            req.swapped = req.computed
        req.computed = 0
        req.state = WAITING
        req.preemptions += 1
        rep.counters["preemptions"] += 1
        req.queued_us = t
        rep.waiting.appendleft(req)
        self._record(t, EV_SWAP_OUT if swap else EV_PREEMPT, rep.index, req.index, req.generated)
        return held if swap else 0

    def _finish_step(self, rep: Replica, t: int) -> None:
        still_running = []
        for req in rep.running:
            new, req.scheduled = req.scheduled, 0
            if new:
                if not req.is_decoding:
                    rep.counters["prefill_tokens"] += new
                else:  # the expected tokens of the step, the fraction carried (1 without speculation)
                    credit = req.spec_credit + int(self.spec_credit[rep.pool, new - 1])
                    new, req.spec_credit = divmod(credit, SPEC_CREDIT_SCALE)
                req.computed += new
                if req.computed >= req.num_tokens and req.decode_replica >= 0 and not req.generated \
                        and rep.index != req.decode_replica:
                    self._hand_off(rep, req, t)  # prefilled: its KV goes to the decode replica
                    continue
                if req.computed >= req.num_tokens:
                    emitted = req.computed - req.num_tokens + 1
                    req.generated += emitted
                    rep.counters["output_tokens"] += emitted
                    if req.first_token_us < 0:
                        req.first_token_us = t
                        if self.inp.detailed_events:
                            self._record(t, EV_FIRST_TOKEN, rep.index, req.index, 0)
                    if req.generated >= req.output_tokens:
                        self._free(rep, req)
                        req.state, req.finished_us = FINISHED, t
                        rep.counters["finished"] += 1
                        self.ended += 1
                        if self.inp.detailed_events:
                            self._record(t, EV_FINISH, rep.index, req.index, req.generated)
                        self._release_next(req, t)
                        continue
            still_running.append(req)
        rep.running = still_running
        if rep.pending:
            self._accept_pending(rep, t)  # blocks may have been freed
        rep.counters["busy_us"] += t - rep.step_start
        rep.busy_until = -1
        self._wake(rep, t)
