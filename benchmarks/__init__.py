"""Speed and external-benchmark scripts (not part of the library, not tests).

guards/       scripts that guard figures the project publishes (bench_*, scale, cranfield)
profiles/     profiles behind changes that were adopted
calibration/  scripts that derive a constant of the library (support_floor)
common        the helpers they share

Run one from the project root: ``uv run python -m benchmarks.guards.bench_search``.
Importing any of them does nothing; each has a ``main``.
"""
