"""What the launcher tells our Python-based backends, in one place.

Triton does not give a Python backend's auto-complete the model's location, and
Triton 2.51 has no request-size flag: the launcher (tritonstack.server) exports both
through the environment, and backends/dali and backends/onnxruntime read them here.
Imports only the standard library: the backends load it in every stub process.
"""

from __future__ import annotations

from pathlib import Path

# The model repository's root, for auto-complete.
REPOSITORY_ENV = "TRITONSTACK_MODEL_REPOSITORY"
# Largest input tensor a backend accepts, in bytes; the default is Triton's own
# --http-max-input-size default in the releases that have that flag.
MAX_INPUT_BYTES_ENV = "TRITONSTACK_MAX_INPUT_BYTES"
DEFAULT_MAX_INPUT_BYTES = 64 * 1024 * 1024


def latest_version_dir(model_dir: Path) -> Path:
    """The highest numeric version folder: what auto-complete inspects."""
    versions = [int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()]
    if not versions:
        raise FileNotFoundError(f"{model_dir} has no numeric version folder")
    return model_dir / str(max(versions))
