"""Scripts that derive a constant of the library from measurements (answer.SUPPORT_FLOOR, answers/support_defaults.json)."""
