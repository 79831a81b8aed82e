"""Load tests (Locust) and the benchmark of the serving stack."""
