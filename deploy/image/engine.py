"""A Docker engine for `make image` and `make image-test`:

    python deploy/image/engine.py

Where `docker info` finds none: Debian's docker.io and debootstrap installed if absent
(apt-get, as root), then `dockerd` started in the background with its log in
build/image/dockerd.log, and waited for. An engine that runs is left as it is, and one
started here keeps running after (as a system service would).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent.parent
LOG = PROJECT_ROOT / "build" / "image" / "dockerd.log"
PACKAGES = ("docker.io", "debootstrap")
READY_WITHIN_S = 60


def engine_answers() -> bool:
    return (
        shutil.which("docker") is not None
        and subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0
    )


def install() -> None:
    if os.geteuid() != 0:
        raise SystemExit("no Docker engine, and installing Debian's needs root: apt-get install docker.io debootstrap")
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=environment)
    subprocess.run(["apt-get", "install", "-y", "-qq", *PACKAGES], check=True, env=environment)


def start() -> None:
    LOG.parent.mkdir(parents=True, exist_ok=True)
    with open(LOG, "ab") as log:
        subprocess.Popen(["dockerd"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + READY_WITHIN_S
    while not engine_answers():
        if time.monotonic() > deadline:
            raise SystemExit(f"dockerd did not answer within {READY_WITHIN_S} s: see {LOG}")
        time.sleep(1)


def main() -> int:
    if engine_answers():
        print("docker: an engine answers")
        return 0
    if shutil.which("dockerd") is None or shutil.which("debootstrap") is None:
        install()
    start()
    print(f"docker: dockerd started (log: {LOG})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
