"""The benchmark family: one benchmark of the serving stack as ratios measured side
by side (`tritonstack benchmark`, `tritonstack benchmark`), before/after
comparisons (`.compare`), Triton's trace split (`.trace`) and capacity planning from
a benchmark's figures (`.plan`)."""
