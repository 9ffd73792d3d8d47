"""Evaluation: metrics, golden-set runs, external benchmarks, cross-validation, diagnosis, history, regression."""
