"""The backends' load-time rules, one module per backend (see rules.common), applied
when a model loads and offline by `tritonstack check`; with them, how those rules read
a serialized pipeline (dali_proto) and word DALI's errors (dali_errors), and what an
unbuilt repository looks like (unbuilt)."""
