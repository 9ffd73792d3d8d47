"""Scripts that guard the figures the project publishes (benchmarks/README.md); each prints, none asserts."""
