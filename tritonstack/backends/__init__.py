"""Our Python-based Triton backends, `dali` and `onnxruntime`, shipped inside the
package (tritonstack.backends.dali, tritonstack.backends.onnxruntime).

Triton runs a Python-based backend from `<backend-directory>/<name>/model.py`, next to
its Python backend. The launcher writes that file as one import of the package's
TritonPythonModel (`entry_point`): the stub runs this environment's Python, so the
backend is the installed package's code, whether a checkout or a wheel installed it.
"""

from __future__ import annotations

BACKENDS = ("dali", "onnxruntime")


def entry_point(backend: str) -> str:
    """The text of `<backend-directory>/<backend>/model.py`."""
    if backend not in BACKENDS:
        raise ValueError(f"no backend {backend!r} in tritonstack.backends: {', '.join(BACKENDS)}")
    return (
        f'"""Triton\'s entry to the "{backend}" backend: its code is tritonstack.backends.{backend}."""\n\n'
        f"from tritonstack.backends.{backend}.model import TritonPythonModel  # noqa: F401\n"
    )
