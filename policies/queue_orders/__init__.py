"""Queue orders: which waiting request a replica admits next (vLLM's `scheduling_policy`).

One module per policy: a queue order is a sort key, lowest first, with ties going to the
earlier arrival and then the lower request id (the engine applies the tie-break and skips
requests queued after an async-scheduled step was planned). Each module holds `key_kernel`
and `head_kernel` (numba) and their twins `key` and `head` (plain Python), `READS_PREFIX`
and `SPECS`. `head(nwait)` true means "take the queue's head as it stands": FCFS keeps the
queue's own order, where a preempted request went back to the front. No queue order takes
parameters: upstream has none (SGLang's 128-request limit on longest-prefix is hard-coded in
`SchedulePolicy._determine_active_policy`; EDF's deadline comes from the pool's SLO).
"""
