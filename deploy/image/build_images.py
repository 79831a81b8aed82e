"""Build the CPU serving image (`make image`):

    python deploy/image/build_images.py --repository model_repository --tag tritonstack-cpu:latest

1. **The base**, once: Debian bookworm (`debootstrap --variant=minbase`, python3 and
   venv) from this machine's own apt source, read from /etc/apt at build time and
   written nowhere, imported as `tritonstack-base:bookworm-<digest of the packages>`. No registry image is
   pulled: a machine that reaches only its package registries builds it.
2. **The wheels**: this project's, and every dependency of its `serve` and `client`
   extras pinned by constraints.txt, fetched on this machine with its own pip settings
   into build/image/wheels: the image build needs no network and bakes no pip setting.
3. **The images**: deploy/image/Dockerfile over a context of those wheels and the built
   repository (`make build` writes it), and the chart's Locust image
   (deploy/locust/Dockerfile) the same way. Prints their sizes.

Needs a running Docker engine (`docker info`); deploy/image/engine.py starts Debian's
where none runs.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent.parent
DEFAULT_TAG = "tritonstack-cpu:latest"
LOCUST_TAG = "tritonstack-locust:latest"
SUITE = "bookworm"
# libpython3.11: Triton's Python backend stub links it (without it every stub fails to start).
BASE_PACKAGES = "python3,python3-venv,libpython3.11,ca-certificates"
# Named after what it holds: a changed package list builds a new base.
BASE_IMAGE = f"tritonstack-base:{SUITE}-{hashlib.sha256(BASE_PACKAGES.encode()).hexdigest()[:8]}"
CONTEXT = PROJECT_ROOT / "build" / "image"
LEGACY_BUILDER = {**os.environ, "DOCKER_BUILDKIT": "0"}


def run(*command: str, **options) -> subprocess.CompletedProcess:
    print("+", " ".join(command), flush=True)
    return subprocess.run(command, check=True, **options)


def has_image(name: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", name], capture_output=True).returncode == 0


def apt_source(sources: Path = Path("/etc/apt")) -> str:
    """The URI of this machine's Debian archive (deb822 `URIs:` or a `deb` line)."""
    for path in sorted([*sources.glob("sources.list.d/*.sources"), *sources.glob("sources.list*")]):
        if not path.is_file():
            continue
        for match in re.finditer(r"^(?:URIs:\s*|deb\s+(?:\[[^]]*\]\s+)?)(\S+)", path.read_text(), re.MULTILINE):
            if "security" not in match.group(1):
                return match.group(1)
    raise SystemExit("no Debian apt source found in /etc/apt: debootstrap needs one")


def build_base(name: str = BASE_IMAGE) -> None:
    if has_image(name):
        print(f"{name}: present")
        return
    if shutil.which("debootstrap") is None:
        raise SystemExit("debootstrap is missing: apt-get install debootstrap")
    with tempfile.TemporaryDirectory(prefix="tritonstack-base-") as root:
        run("debootstrap", "--variant=minbase", f"--include={BASE_PACKAGES}", SUITE, root, apt_source())
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            shutil.rmtree(Path(root, cache), ignore_errors=True)
        tar = subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE)
        run("docker", "import", "--change", "ENV LANG=C.UTF-8", "-", name, stdin=tar.stdout)
        tar.wait()


@dataclass(frozen=True)
class ImageSpec:
    """What one image installs: this project's wheel with `extras`, and `packages`."""

    dockerfile: Path
    extras: str
    packages: tuple[str, ...] = ()
    repository: bool = False  # the built repository baked in


SERVE = ImageSpec(PROJECT_ROOT / "deploy" / "image" / "Dockerfile", "serve,client", repository=True)
# The chart's Locust pods: the client package, Locust, gevent, scikit-image (its photos
# are the corpus) and the users (tritonstack/loadtests/, in the client package); the
# chart mounts the locustfile from its ConfigMap.
LOCUST = ImageSpec(PROJECT_ROOT / "deploy" / "locust" / "Dockerfile", "client", ("locust", "gevent", "scikit-image"))


def fetch_wheels(out: Path, spec: ImageSpec) -> None:
    """The project's wheel and its dependencies for `spec`, pinned, as wheels only."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    python = sys.executable
    run(python, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(out), str(PROJECT_ROOT))
    (wheel,) = out.glob("tritonstack-*.whl")
    run(
        python, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--dest", str(out),
        "--constraint", str(PROJECT_ROOT / "constraints.txt"), f"{wheel}[{spec.extras}]", *spec.packages,
    )  # fmt: skip


def build_image(spec: ImageSpec, repository: Path, tag: str, base: str = BASE_IMAGE) -> None:
    context = CONTEXT / spec.dockerfile.parent.name
    context.mkdir(parents=True, exist_ok=True)
    fetch_wheels(context / "wheels", spec)
    if spec.repository:
        if not (repository / "ensemble_dali_efficientnet_lite0").is_dir():
            raise SystemExit(f"{repository} is not a built repository: run `make build` first")
        shutil.rmtree(context / "model_repository", ignore_errors=True)
        shutil.copytree(repository, context / "model_repository", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(spec.dockerfile, context / "Dockerfile")
    # The classic builder: Debian's docker.io has no buildx, and a newer client's default needs it.
    run("docker", "build", "--build-arg", f"BASE={base}", "--tag", tag, str(context), env=LEGACY_BUILDER)
    size = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Size}}", tag], capture_output=True, text=True, check=True
    ).stdout.strip()
    print(f"{tag}: {int(size) / 2**30:.2f} GiB")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repository", type=Path, default=PROJECT_ROOT / "model_repository")
    parser.add_argument("--tag", default=DEFAULT_TAG, help="the serving image's")
    parser.add_argument("--locust-tag", default=LOCUST_TAG, help="the Locust image's")
    args = parser.parse_args(argv)
    build_base()
    build_image(SERVE, args.repository.resolve(), args.tag)
    build_image(LOCUST, args.repository.resolve(), args.locust_tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
