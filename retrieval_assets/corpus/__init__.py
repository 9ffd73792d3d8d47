"""The documents and the questions asked of them: golden sets, external benchmark datasets, a synthetic corpus."""
