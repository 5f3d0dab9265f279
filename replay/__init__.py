"""The replay core: specs and memory arithmetic, step model, engines, cluster, metrics, outputs, CLI."""
