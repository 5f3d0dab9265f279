"""An arriving request in the reference engine: rejected, routed, admitted and queued, or held
at its pool (the twin of engine/routing.py)."""

from __future__ import annotations

import heapq
import math

from replay.engine.common import (
    EV_ARRIVE,
    EV_REJECT,
    REJECT_CONTEXT,
    REJECT_KV,
    REJECT_NO_REPLICA,
    REJECTED,
    R_ACTIVE,
    R_STARTING,
    WAITING,
)
from replay.engine.reference.state import REFRESH, Replica, Request
from policies._dispatch import UnknownPolicyId, build_reference
from policies.registry import ADMISSION_MODULES, QUEUE_MODULES, ROUTER_MODULES, VICTIM_MODULES
from policies.routers._view import RouterView

# The policies' plain-Python twins, by the same ids as the numba engine's kernels.
FAMILIES = {"router": ROUTER_MODULES, "preemption victim": VICTIM_MODULES, "queue order": QUEUE_MODULES,
            "admission": ADMISSION_MODULES}
route_reference = build_reference([m.reference for m in ROUTER_MODULES], "router")
admission_reference = build_reference([m.reference for m in ADMISSION_MODULES], "admission")


class RoutingMixin:
    """ReferenceEngine's methods for an arrival: routing, admission and placement."""

    def _check_policy_ids(self) -> None:
        """As engine/routing.check_policy_ids: an id without a policy stops the run, before any event."""
        columns = {"router": self.inp.pool_router, "preemption victim": self.victims, "queue order": self.queues,
                   "admission": self.admissions}
        for family, ids in columns.items():
            for p, pid in enumerate(ids):
                user_link = pid == len(FAMILIES[family]) - 1  # needs the pool's user policy
                if not 0 <= pid < len(FAMILIES[family]) or (user_link and self.user[family].addr[p] is None):
                    raise UnknownPolicyId(f"pool {p}: {family} id {int(pid)} has no policy in policies.registry "
                                          f"(stopped at t_us={self.now})")

    def _arrive(self, req: Request, t: int) -> None:
        p = int(self.inp.pool[req.index])
        self.arrivals[p] += 1  # counted at its home pool, as requests.parquet's `pool` column
        self.arrived_tokens[p][0] += req.prompt_tokens
        self.arrived_tokens[p][1] += req.output_tokens
        total = req.prompt_tokens + req.output_tokens
        bs = int(self.inp.pool_block_size[p])
        if total > self.inp.pool_max_model_len[p]:
            self._reject(req, REJECT_CONTEXT, t)
        elif math.ceil((total - 1) / bs) > self.inp.pool_kv_blocks[p] - self.inp.per_pool("watermark_blocks", 0)[p]:
            self._reject(req, REJECT_KV, t)
        else:
            self._place(req, t)

    def _reject(self, req: Request, reason: int, t: int) -> None:
        req.state, req.reject = REJECTED, reason
        self.rejected[int(self.inp.pool[req.index])] += 1
        self.ended += 1
        self._record(t, EV_REJECT, -1, req.index, reason)
        self._release_next(req, t)

    def _place(self, req: Request, t: int) -> None:
        """Route a request (arriving, or held at its pool until now) and admit it. With no replica
        active or starting, a pool that holds keeps it (`held`); any other rejects it."""
        p = int(self.inp.pool[req.index])
        r = self._route(p, req, t)
        if r is None:
            r = self._route_starting(p)
        if r is None:
            if self.hold[p]:
                self.held[p].append(req)
            else:
                self._reject(req, REJECT_NO_REPLICA, t)
            return
        decode = None
        if self._remote_prefill(p, self.replicas[r], req):
            pp = self.inp.pd_prefill_pool
            rp = self._route(pp, req, t)
            if rp is None:
                rp = self._route_starting(pp)
            if rp is not None:  # else no prefill replica at all: the decode replica prefills it
                decode, r, p = self.replicas[r], rp, pp
        reason = self._admit(p, self.replicas[r], req, t)
        if reason:
            self._reject(req, reason, t)
            return
        if decode is not None:
            req.decode_replica = decode.index
            decode.incoming += 1
        rep = self.replicas[r]
        req.replica, req.state = rep.index, WAITING
        if self.inp.detailed_events:
            self._record(t, EV_ARRIVE, rep.index, req.index, 0)
        req.queued_us = t
        rep.waiting.append(req)
        self._wake_idle(rep, t)

    def _remote_prefill(self, p: int, decode: Replica, req: Request) -> bool:
        """The P/D decider (see engine/routing.remote_prefill): prefill on the prefill pool unless the
        uncached prompt is below the threshold or could never fit a prefill replica."""
        inp = self.inp
        pp = inp.pd_prefill_pool
        if pp < 0 or p != inp.pd_decode_pool:
            return False
        if math.ceil(req.prompt_tokens / int(inp.pool_block_size[pp])) > (
                inp.pool_kv_blocks[pp] - inp.per_pool("watermark_blocks", 0)[pp]):
            return False
        if inp.pd_local_threshold <= 0:
            return True
        bs = int(inp.pool_block_size[p])
        hits = self._prefix_hits(decode, req, bs) if self.caching[p] else 0
        return req.prompt_tokens - hits * bs >= inp.pd_local_threshold

    def _admit(self, p: int, rep: Replica, req: Request, t: int) -> int:
        """The pool's admission policy's twin (policies/admission/) on a request routed to `rep`:
        0 or its reject reason."""
        waiting = waiting_tokens = active = 0
        if self.adm_pool[p]:
            members = [self.replicas[x] for x in self.pool_members[p]]
            waiting = sum(len(m.waiting) for m in members)
            waiting_tokens = sum(x.num_tokens for m in members for x in m.waiting)
            active = sum(m.state == R_ACTIVE for m in members)
        view = self.admission_view._replace(waiting=waiting, waiting_tokens=waiting_tokens, active=active)
        if admission_reference(int(self.admissions[p]), view, p, rep.index, req.index, t, self.adm_rows[p]):
            return int(self.adm_reason[p])
        return 0

    def _routable(self, rep: Replica, t: int) -> bool:
        if rep.state == R_STARTING and rep.active_at <= t:
            rep.state = R_ACTIVE  # loading finished
        return rep.state == R_ACTIVE

    def _route_starting(self, p: int) -> int | None:
        """No active replica: the starting one that is ready first holds the request meanwhile."""
        starting = [r for r in self.pool_members[p] if self.replicas[r].state == R_STARTING]
        return min(starting, key=lambda r: self.replicas[r].active_at) if starting else None

    def _refresh(self, p: int, t: int) -> None:
        for r in self.pool_members[p]:
            rep = self.replicas[r]
            rep.view = (len(rep.waiting), len(rep.running), rep.kv.num_blocks - rep.num_free)
        heapq.heappush(self.heap, (t + int(self.inp.refresh_us[p]), REFRESH, p))

    def _route(self, p: int, req: Request, t: int) -> int | None:
        """The pool's router (policies/routers/, the twin of its numba kernel) over a RouterView;
        starting replicas whose loading has finished become active first, as in engine/routing.route."""
        members = self.pool_members[p]
        active = [r for r in members if self._routable(self.replicas[r], t)]
        if not active:
            return None
        bs = int(self.inp.pool_block_size[p])
        hits = [0] * len(self.replicas)
        if self.route_hits[p]:
            for r in active:
                hits[r] = self._prefix_hits(self.replicas[r], req, bs)
        reps = self.replicas
        view = RouterView(
            state=[rep.state for rep in reps], wait=[rep.view[0] for rep in reps], run=[rep.view[1] for rep in reps],
            kv=[rep.view[2] for rep in reps], blocks=[rep.kv.num_blocks for rep in reps],
            live_wait=[len(rep.waiting) for rep in reps], live_run=[len(rep.running) for rep in reps],
            wait_tokens=[sum(x.num_tokens for x in rep.waiting) for rep in reps], hits=hits, rng=self.rng, rr=self.rr_next, req=self.user_columns, q=req.index, user=self.user["router"],
        )
        r = route_reference(int(self.inp.pool_router[p]), view, p, members[0], len(members), len(active),
                            -(-req.prompt_tokens // bs), self.router_params[p])
        return None if r < 0 else r
