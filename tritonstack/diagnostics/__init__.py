"""Diagnostics that start servers of their own and report on them: the soak
(`python -m tritonstack.diagnostics.soak`, `make soak`), the memory probe
(`.memory_probe`) and the dali backend's own overhead (`.dali_backend_overhead`)."""
