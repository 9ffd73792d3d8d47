"""Answers that cite their sources: prompt assembly, support floor, citation checks, the Claude call."""
