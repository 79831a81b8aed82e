"""Per-request overhead of our Python-based `dali` backend, at concurrency 1.

    python -m tritonstack.diagnostics.dali_backend_overhead --requests 2000 --out reports/dali_backend_overhead.json

An identity DALI pipeline (one UINT8 row in, the same row out) is served by a
tritonserver this script starts on loopback. For each request, in turn:
- `dali_ms`: the same serialized pipeline run in this process (feed_input, run,
  output to numpy), the time DALI itself takes;
- `end_to_end_ms`: one HTTP (or gRPC) inference through the server.
The overhead of a request is end_to_end_ms - dali_ms (paired, so both see the same
machine load); p50 and p99 are over those differences. Beside it, the same request
through a plain Python-backend identity model (`python_identity`, numpy in, numpy
out, no DALI) gives the floor that Triton, the client and the Python backend's
IPC cost without any of our code; `ours_ms_p50` is what remains.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from nvidia.dali import Pipeline, fn, pipeline_def, types

from tritonstack import cli
from tritonstack.build.model_config import InstanceGroup, ModelConfig, Tensor
from tritonstack.build.model_files import write_model_folder
from tritonstack.serve.launcher import TritonServer

DALI_MODEL = "dali_identity"
PYTHON_MODEL = "python_identity"
BATCH_SIZE = 8
# The floor: a Python-backend model that does nothing but hand its input back.
PYTHON_IDENTITY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
                "DALI_OUTPUT_0", pb_utils.get_input_tensor_by_name(request, "DALI_INPUT_0").as_numpy())])
            for request in requests
        ]
"""


@pipeline_def(output_dtype=types.UINT8, output_ndim=1)
def identity_pipeline():
    return fn.external_source(name="DALI_INPUT_0", dtype=types.UINT8, ndim=1)


def identity_config(name: str, backend: str) -> ModelConfig:
    return ModelConfig(
        name=name,
        backend=backend,
        max_batch_size=BATCH_SIZE,
        instance_groups=(InstanceGroup(kind="KIND_CPU"),),
        inputs=(Tensor("DALI_INPUT_0", "UINT8", (-1,), allow_ragged_batch=True),),
        outputs=(Tensor("DALI_OUTPUT_0", "UINT8", (-1,)),),
    )


def write_models(repository: Path, serialized: bytes) -> None:
    write_model_folder(repository, identity_config(DALI_MODEL, "dali"), {"model.dali": serialized})
    write_model_folder(repository, identity_config(PYTHON_MODEL, "python"), {"model.py": PYTHON_IDENTITY})


def in_process_pipeline(serialized: bytes) -> Pipeline:
    pipeline = Pipeline.deserialize(
        serialized_pipeline=serialized, batch_size=BATCH_SIZE, num_threads=1, device_id=None, prefetch_queue_depth=1
    )
    pipeline.build()
    return pipeline


def dali_run_ms(pipeline: Pipeline, row: np.ndarray) -> float:
    started = time.perf_counter()
    pipeline.feed_input("DALI_INPUT_0", row)
    (output,) = pipeline.run()
    output.as_array()
    return (time.perf_counter() - started) * 1e3


class Sender:
    """One protocol's client, a request prepared once, sent again and again."""

    def __init__(self, server: TritonServer, protocol: str, row: np.ndarray):
        self.api = httpclient if protocol == "http" else grpcclient
        self.client = self.api.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
        self.tensor = self.api.InferInput("DALI_INPUT_0", list(row.shape), "UINT8")
        if protocol == "http":
            self.tensor.set_data_from_numpy(row, binary_data=True)
        else:
            self.tensor.set_data_from_numpy(row)
        self.row = row

    def ms(self, model: str) -> float:
        started = time.perf_counter()
        result = self.client.infer(model, [self.tensor])
        elapsed = (time.perf_counter() - started) * 1e3
        if not np.array_equal(result.as_numpy("DALI_OUTPUT_0"), self.row):
            raise AssertionError(f"{model} did not return its input")
        return elapsed


def measure(server: TritonServer, pipeline: Pipeline, protocol: str, requests: int, row_bytes: int) -> dict:
    row = np.random.default_rng(0).integers(0, 256, (1, row_bytes), dtype=np.uint8)
    sender = Sender(server, protocol, row)
    for _ in range(min(100, requests)):  # warm-up: connections, allocators, DALI buffers
        sender.ms(DALI_MODEL), sender.ms(PYTHON_MODEL), dali_run_ms(pipeline, row)
    dali, end_to_end, floor = [], [], []
    for _ in range(requests):
        dali.append(dali_run_ms(pipeline, row))
        end_to_end.append(sender.ms(DALI_MODEL))
        floor.append(sender.ms(PYTHON_MODEL))
    sender.client.close()
    overhead = np.array(end_to_end) - np.array(dali)
    return {
        "protocol": protocol,
        "requests": requests,
        "row_bytes": row_bytes,
        "end_to_end_ms_p50": _p(end_to_end, 50),
        "dali_ms_p50": _p(dali, 50),
        "overhead_ms_p50": _p(overhead, 50),
        "overhead_ms_p99": _p(overhead, 99),
        "python_backend_floor_ms_p50": _p(floor, 50),
        "python_backend_floor_ms_p99": _p(floor, 99),
        "ours_ms_p50": round(_p(overhead, 50) - _p(floor, 50), 3),
    }


def _p(values, percentile: float) -> float:
    return round(float(np.percentile(values, percentile)), 3)


@dataclass(frozen=True)
class OverheadOptions:
    requests: int = cli.option(2000, "--requests", type=cli.positive_int, help="per protocol (bounded run)")
    row_bytes: int = cli.option(1024, "--row-bytes", type=cli.positive_int, help="bytes of each request's row")
    protocols: tuple[str, ...] = cli.option(
        ("http", "grpc"), "--protocols", type=cli.comma_separated(), help="comma-separated"
    )
    out: Path = cli.out_option(Path("reports/dali_backend_overhead.json"), help="the report")


def parser() -> argparse.ArgumentParser:
    made = cli.parser(__doc__.split("\n\n")[0])
    cli.add_options(made, OverheadOptions)
    return made


def main(argv: list[str] | None = None) -> int:
    return cli.run(run, argv, parser)


def run(args: argparse.Namespace) -> int:
    options = cli.from_args(OverheadOptions, args)
    serialized = identity_pipeline(batch_size=BATCH_SIZE, num_threads=1, device_id=None).serialize()
    pipeline = in_process_pipeline(serialized)
    with tempfile.TemporaryDirectory(prefix="dali-overhead-") as repository:
        write_models(Path(repository), serialized)
        with TritonServer(repository) as server:
            results = [
                measure(server, pipeline, protocol, options.requests, options.row_bytes)
                for protocol in options.protocols
            ]
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps(results, indent=2) + "\n")
    for result in results:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
