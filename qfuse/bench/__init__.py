"""Benchmarks run by ``qfuse bench ...`` (GPU). Timing helpers live in ``timing.py``;
one module per benchmark family."""
