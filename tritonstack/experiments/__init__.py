"""The engines of the commands that measure beside the benchmark: before and after
(`tritonstack compare`: `.interleaved`), beyond capacity (`tritonstack overload`:
`.goodput`, `.overload_soak`), layouts measured and chosen (`tritonstack tune`:
`.layout_search`, `.tune_output`) and a capacity plan (`tritonstack plan`: `.capacity_plan`)."""
