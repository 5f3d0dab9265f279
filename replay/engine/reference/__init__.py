"""The reference engine: the numba engine's algorithm in plain Python, module for module under
the same names as the kernels' (see replay/engine/__init__.py); `engine.ReferenceEngine` is the
`Engine`."""
