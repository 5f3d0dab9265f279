"""The engines: every replica of a fleet, stepped as vLLM V1 steps it.

Two engines give the same outputs. The numba kernels here are the fast one, a module per part:

    common.py        what both engines share: EngineInputs, state codes, event kinds, reasons
    state.py         the kernels' state (NamedTuples of arrays) and status codes
    events.py        the event buffer, and each replica's next event
    queues.py        the waiting queues and the held-at-pool FIFO
    kvblocks.py      paged KV blocks, the prefix hash table, a request's blocks
    routing.py       an arrival: routing, admission and placement
    transfer.py      prefill/decode disaggregation's KV transfer
    lora.py          multi-LoRA adapter slots
    scheduling.py    one scheduler step, and its end
    lazy.py          steady decoders kept lazily: a step costs what changes in it
    loop.py          the event loop (advance_nb), snapshot and reset
    variants.py      the kernels' feature flags: a run compiles only the features it uses
    numba_engine.py  NumbaEngine: the host side that lays out the state and runs the loop

`reference/` is the same algorithm in plain Python, written to be read, module for module under
the same names (`reference/engine.py` is NumbaEngine's twin; the waiting queues are deques there,
so it has no queues.py). tests/differential holds the two together.
"""
