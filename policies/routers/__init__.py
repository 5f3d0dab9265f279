"""Routers: which replica of a pool takes an arriving request, one module per kernel.

Each module holds `kernel` (numba), `reference` (its plain-Python twin for `--engine
reference`), `Params` (a frozen dataclass of the parameters, or None), `READS_VIEW` (it reads
the scraped, `router_refresh_ms`-stale metrics) and `SPECS` (the names it is registered under,
with their parameters: `prefix-aware` is `weighted` with llm-d's weights). Both get the same
`RouterView` (policies/routers/_view.py) and return a replica index, or -1 for none.
"""
