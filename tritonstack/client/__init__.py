"""Client side: classify images against a running Triton server (installs alone:
`pip install ".[client]"`)."""
