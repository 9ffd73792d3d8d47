"""Profiles behind changes that were adopted: where the time went, and the candidates measured beside it."""
