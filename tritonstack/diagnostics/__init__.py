"""Diagnostics that start servers of their own and report on them: the soak
(`tritonstack soak`, `make soak`), the memory probe
(`.memory_probe`) and the dali backend's own overhead (`.dali_backend_overhead`)."""
