"""The load test's report.html as a person sees it: rendered by headless Chromium
(Debian's `chromium`, which `make test` installs as root), it draws its charts and names the
endpoint the users really talked to."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess

import pytest
from PIL import Image

from tritonstack.commands import loadtest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
RENDER_TIMEOUT_S = 90
# The page is a local file: Chromium's own traffic (component updates, sync, first-run
# pings, QUIC) stays off, so the test talks to nothing beyond this machine.
NO_NETWORK = (
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
    "--disable-default-apps",
)


def chromium(tmp_path, *options: str) -> str:
    """Run headless Chromium (its own profile, its own process group, killed at
    the end whatever happens); returns its stdout."""
    process = subprocess.Popen(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            *NO_NETWORK,
            f"--user-data-dir={tmp_path / 'profile'}",
            "--virtual-time-budget=5000",
            *options,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = process.communicate(timeout=RENDER_TIMEOUT_S)
        assert process.returncode == 0
        return out
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # renderer and GPU helpers too
        except ProcessLookupError:
            pass
        process.wait()


@pytest.fixture(scope="module")
def report(server, tmp_path_factory):
    folder = tmp_path_factory.mktemp("report")
    code = loadtest.main(
        [
            "--url",
            server.http_url,
            "--grpc-url",
            server.grpc_url,
            "--user",
            "grpc",
            "--shape",
            "closed",
            "--users",
            "1",
            "--run-time",
            "3",
            "--out",
            str(folder),
        ]
    )
    assert code == 0
    return folder


# `make test` installs chromium where it can (root and apt-get) and fails if that
# install fails; only a machine where it cannot skips this one test, saying how to run it.
@pytest.mark.skipif(
    CHROMIUM is None,
    reason="needs a headless Chromium to render report.html, and this machine "
    "has none (`make test` installs it only as root with apt-get): "
    "`sudo apt-get install chromium` runs this test",
)
def test_report_html_renders_its_charts_and_the_real_endpoint(server, report, tmp_path):
    page = f"file://{report / 'report.html'}"
    screenshot = tmp_path / "report.png"
    chromium(tmp_path, "--window-size=1280,2000", f"--screenshot={screenshot}", page)
    image = Image.open(screenshot).convert("L")
    assert image.size == (1280, 2000)
    drawn = sum(count for count, shade in image.getcolors(256) if shade < 240) / (1280 * 2000)
    assert drawn > 0.02, f"only {drawn:.1%} of the page is drawn"

    dom = chromium(tmp_path, "--dump-dom", page)
    for text in (
        "Locust Test Report",
        "Total Requests per Second",
        "Response Times (ms)",
        "<canvas",
        f"grpc://{server.grpc_url}",
        # our plots of the whole run, below Locust's charts of its last seconds
        'id="tritonstack-plots"',
        "ensemble_dali_efficientnet_lite0 over gRPC, closed shape",
        'src="over_time.png"',
        'src="against_users.png"',
    ):
        assert text in dom, text
