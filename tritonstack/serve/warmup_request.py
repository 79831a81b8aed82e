"""Send one real sample through an ensemble, over Triton's HTTP/REST API, with the
standard library only.

    python3 warmup_request.py --url http://127.0.0.1:8000 --model ensemble_x --sample sample.jpg

Triton cannot warm an ensemble by itself (`model_warmup` is refused on an ensemble:
triton-inference-server/server#6326), and warming each step alone leaves the chain's
own first-run costs to the first client. The launcher (tritonstack.serve.warmup)
calls `send_sample` for each loaded ensemble before it reports ready; the Helm chart
carries this very file in a ConfigMap and runs it as the pod's startup probe in the
NGC image, which has python3 but not our package: hence no import beyond the standard
library. Exit codes: 0 every model answered, 1 the server is not ready yet or a model
refused the sample (the probe tries again).

With `--readiness` it is the chart's readiness probe: the sample goes at the default
priority, and a refusal (HTTP 503: the queue ceilings of a busy server) counts as
ready, since a server that refuses promptly is working; an error (HTTP 500: a step's
stub that hangs or died, "Stub process ... is not healthy") or no answer within the
timeout is not. A readiness that failed under overload would take every replica out
of the Service at once.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request

# The project's ensembles take encoded bytes in one UINT8 row per item, and a regions
# ensemble boxes beside them (tritonstack.contract; repeated here: no import but the
# standard library, and a test holds the two alike).
INPUT_NAME = "INPUT"
BOXES_NAME = "BOXES"
REGIONS_PREFIX = "ensemble_regions_"
# An audio ensemble answers SEGMENTS; the others a classification OUTPUT.
AUDIO_PREFIX = "ensemble_audio_"
SEGMENTS_NAME = "SEGMENTS"
# Sent at batch priority (tritonstack.contract.BATCH_PRIORITY): a warmup waits its turn
# behind traffic and is never refused by the latency objective's queue ceilings, which
# bind interactive requests only (a busy node refused a warmup sent without it).
WARMUP_PRIORITY = 2
# One box of one pixel at the corner: inside any image, so one crop goes through the chain.
WARMUP_BOX = [0.0, 0.0, 1.0, 1.0]


class WarmupFailed(RuntimeError):
    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status  # the HTTP status, where the server answered


def _post(url: str, body: dict, timeout_s: float) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        raise WarmupFailed(f"HTTP {error.code}: {error.read().decode(errors='replace')[:300]}", error.code) from None
    except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
        raise WarmupFailed(str(error)) from None


# The answer of a server that refused a request for now (a queue ceiling): busy, not broken.
REFUSED_STATUS = 503


def send_sample(
    url: str,
    model: str,
    sample: bytes,
    timeout_s: float,
    input_name: str = INPUT_NAME,
    priority: int | None = WARMUP_PRIORITY,
) -> float:
    """Infer `sample` (one item of encoded bytes, an image, a clip or audio; with
    WARMUP_BOX for a regions ensemble) on `model` (`priority` None: the model's
    default); the seconds it took. Raises WarmupFailed with the server's answer when
    it was refused."""
    body = {
        "inputs": [{"name": input_name, "shape": [1, len(sample)], "datatype": "UINT8", "data": list(sample)}],
        "outputs": [{"name": "OUTPUT", "parameters": {"classification": 1}}],
        "parameters": {} if priority is None else {"priority": priority},
    }
    if model.startswith(AUDIO_PREFIX):
        body["outputs"] = [{"name": SEGMENTS_NAME}]
    if model.startswith(REGIONS_PREFIX):
        body["inputs"].append({"name": BOXES_NAME, "shape": [1, 1, 4], "datatype": "FP32", "data": WARMUP_BOX})
    started = time.monotonic()
    try:
        _post(f"{url.rstrip('/')}/v2/models/{model}/infer", body, timeout_s)
    except WarmupFailed as error:
        raise WarmupFailed(f"{model}: {error}", error.status) from None
    return time.monotonic() - started


def is_ready(url: str, timeout_s: float = 5.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/v2/health/ready", timeout=timeout_s) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="Triton's HTTP endpoint")
    parser.add_argument(
        "--model", action="append", nargs=2, metavar=("NAME", "SAMPLE"), required=True, help="an ensemble, its sample"
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per request")
    parser.add_argument(
        "--readiness", action="store_true", help="a readiness probe: default priority, a refusal (503) is ready"
    )
    args = parser.parse_args(argv)
    if not is_ready(args.url):
        print("warmup: the server is not ready yet", file=sys.stderr)
        return 1
    for model, path in args.model:
        with open(path, "rb") as sample:
            data = sample.read()
        try:
            took = send_sample(
                args.url, model, data, args.timeout, priority=None if args.readiness else WARMUP_PRIORITY
            )
        except WarmupFailed as error:
            if args.readiness and error.status == REFUSED_STATUS:
                print(f"warmup: {model} refused the sample for now (busy): ready")
                continue
            print(f"warmup: {error}", file=sys.stderr)
            return 1
        print(f"warmup: {model} answered in {took:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
