"""Serve time: run the real tritonserver on a model repository, on any CPU-only
Linux machine, with our Python-based `dali` and `onnxruntime` backends."""
