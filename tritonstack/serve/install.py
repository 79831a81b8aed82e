"""Where the real tritonserver comes from, and the backend directory it is given.

The nvidia-pytriton wheel carries a real `tritonserver` binary, its shared libraries
and Triton's Python backend. Our backends (`tritonstack.backends.dali`,
`tritonstack.backends.onnxruntime`) are Triton "Python-based backends": a folder named
like the backend holding `model.py`, next to the Python backend that runs it. With them in
`--backend-directory`, a model that says `backend: "dali"` loads here exactly as it
does in the NGC container with the C++ backend.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytriton

from tritonstack.backends import BACKENDS, entry_point


@functools.lru_cache(maxsize=None)
def _help_text(binary: Path, library_dir: Path) -> str:
    env = dict(os.environ, LD_LIBRARY_PATH=str(library_dir))
    result = subprocess.run([str(binary), "--help"], capture_output=True, text=True, env=env, timeout=60)
    return result.stdout + result.stderr


@dataclass(frozen=True)
class TritonInstall:
    binary: Path
    library_dir: Path
    python_backend: Path  # libtriton_python.so and triton_python_backend_utils.py
    python_stub: Path  # triton_python_backend_stub for this Python version
    # Triton's response cache libraries (<folder>/local/libtritoncache_local.so); None: the binary's default.
    cache_directory: Path | None = None

    @classmethod
    def from_pytriton(cls) -> "TritonInstall":
        root = Path(pytriton.__file__).resolve().parent / "tritonserver"
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        install = cls(
            binary=root / "bin" / "tritonserver",
            library_dir=root.parent.parent / "nvidia_pytriton.libs",
            python_backend=root / "backends" / "python",
            python_stub=root / "python_backend_stubs" / version / "triton_python_backend_stub",
            cache_directory=root / "caches",
        )
        missing = [path for path in vars(install).values() if path is not None and not path.exists()]
        if missing:
            raise FileNotFoundError(f"nvidia-pytriton install is incomplete, missing: {missing}")
        return install

    @property
    def help_text(self) -> str:
        """`tritonserver --help`: what this build's flags are (they vary by release)."""
        return _help_text(self.binary, self.library_dir)

    def supports(self, flag: str) -> bool:
        """Whether this tritonserver knows `flag` (e.g. --http-max-input-size, new in
        releases after 2.51)."""
        return f"{flag} " in self.help_text

    def environment(self) -> dict[str, str]:
        """The server's environment: its libraries, and this interpreter first on
        PATH, since the Python backend stub runs the `python` it finds there."""
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(self.library_dir), env.get("LD_LIBRARY_PATH")]))
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        return env

    def assemble_backends(self, destination: Path) -> Path:
        """Lay out `destination/{python,dali,onnxruntime}`. Files are copied, not
        linked: Triton refuses a backend library whose real path lies outside
        the backend directory. Each of ours is a model.py importing the package's."""
        python_dir = destination / "python"
        python_dir.mkdir(parents=True, exist_ok=True)
        for source in (
            self.python_backend / "libtriton_python.so",
            self.python_backend / "triton_python_backend_utils.py",
            self.python_stub,
        ):
            shutil.copy2(source, python_dir / source.name)
        for backend in BACKENDS:
            (destination / backend).mkdir(exist_ok=True)
            (destination / backend / "model.py").write_text(entry_point(backend))
        return destination
