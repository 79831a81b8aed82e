"""The backends' load-time rules, one module per backend (see rules.common)."""
