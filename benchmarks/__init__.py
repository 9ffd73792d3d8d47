"""Benchmark scripts (not part of the library, not tests): ``python -m benchmarks`` lists them and
``python -m benchmarks NAME [options]`` runs one. guards/ hold the scripts behind the figures the project
publishes, calibration/ the one that derives a library constant; ``common`` is what they share.
Importing any of them does nothing; each has a ``main``.
"""
