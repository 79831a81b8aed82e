"""The classifier's batch from its cost curve on this machine, not a constant.

Triton's dynamic batcher forms the largest of the classifier's preferred batches
(`preferred_batch_size`: the build writes 8) that its queue holds. What a batch costs per image depends on
the CPU: on one EPYC generation a batch of 8 cost about what a batch of 2 did, on the
next 17 % more (docs/performance.md#the-classifiers-batch-from-its-cost-curve-on-this-machine).

So with `--layout cores` (the default) the launcher times each classifier step's ONNX
file in this process at batches 1 to 8, with the threads the layout gives an instance,
before any traffic, and adds to the build's batch (kept for a backlog:
preferred_sizes) the smallest batch of at least `MIN_BATCH` within `TOLERANCE` of the
cheapest per image. The smallest: the requests of one batch run one
after the other on one core while another instance may idle, so a batch larger than the
curve pays for only lengthens the tail. At least 2: a batch of one pays the stubs' and
Triton's round trip for every image, which a curve timed in process does not see. A
curve is kept in the user's cache folder, keyed by the file's content, the threads, the
CPU model and the ONNX Runtime release: measured once a machine, it costs about a
second a model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from tritonstack.contract import TRITON_TO_NUMPY, onnx_type
from tritonstack.repository_files import latest_version_dir
from tritonstack.serve.layout import CLASSIFIER_BACKEND, sizable
from tritonstack.serve.loaded import differs, ensemble_steps

LOGGER = logging.getLogger("tritonstack.serve")
SIZES = (1, 2, 4, 8)
REPEATS = 5
# Timing noise on a shared machine is a few per cent: within this of the cheapest, a
# batch costs the same.
TOLERANCE = 0.05
# A batch of one pays a round trip through the stubs per image (the module's docstring).
MIN_BATCH = 2
CACHE_ENV = "TRITONSTACK_CACHE"


def cost_curve(onnx_path: Path, threads: int, sizes=SIZES, repeats: int = REPEATS) -> dict[int, float]:
    """Milliseconds per image at each batch size: the fastest of `repeats` timed runs
    (on a shared machine noise only adds), after one untimed run a size (its arena,
    its kernels' first choice)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # as the backend runs it
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    (model_input,) = session.get_inputs()
    item_shape = [dim if isinstance(dim, int) else 1 for dim in model_input.shape[1:]]
    dtype = np.dtype(TRITON_TO_NUMPY[onnx_type(model_input.type)])
    rng = np.random.default_rng(0)
    curve = {}
    for size in sizes:
        # The graph's own input type: a UINT8 classifier normalizes inside its graph.
        batch = {model_input.name: (rng.random((size, *item_shape)) * 255).astype(dtype)}
        session.run(None, batch)
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            session.run(None, batch)
            times.append(time.perf_counter() - started)
        curve[size] = 1000 * min(times) / size
    return curve


def chosen_batch(curve: dict[int, float], tolerance: float = TOLERANCE) -> int:
    """The smallest batch of at least MIN_BATCH whose cost per image is within
    `tolerance` of the cheapest; 1 only when no larger batch is."""
    cheapest = min(curve.values())
    affordable = [size for size, ms in curve.items() if ms <= cheapest * (1 + tolerance)]
    return min([size for size in affordable if size >= MIN_BATCH] or affordable)


def cache_path() -> Path:
    root = os.environ.get(CACHE_ENV) or os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "tritonstack" / "batch_cost.json"


def cached_curve(onnx_path: Path, threads: int, cache: Path | None = None) -> dict[int, float]:
    """cost_curve, read from `cache` when this file, threads, CPU and ONNX Runtime were
    measured before; measured and written there otherwise (an unwritable cache only
    costs the measurement next time)."""
    cache = cache or cache_path()
    digest = hashlib.sha256(onnx_path.read_bytes()).hexdigest()
    key = f"{digest}:{threads}:{_cpu_model()}:{ort.__version__}"
    try:
        known = json.loads(cache.read_text())
    except (OSError, ValueError):
        known = {}
    if key in known:
        return {int(size): ms for size, ms in known[key].items()}
    curve = cost_curve(onnx_path, threads)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        written = cache.with_suffix(f".{os.getpid()}.tmp")
        written.write_text(json.dumps({**known, key: curve}, indent=1))
        os.replace(written, cache)  # whole or not at all, for a launcher reading it beside
    except OSError as error:
        LOGGER.info("batch cost curve not cached (%s)", error)
    return curve


def _cpu_model() -> str:
    """The CPU as the kernel names it: a VM may call two generations "AMD EPYC", so its
    family, model and a digest of its flags (AVX-512 and the like) are part of it."""
    try:
        first = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        return platform.processor() or platform.machine()
    fields = dict(line.split(":", 1) for line in first.splitlines() if ":" in line)
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    flags = hashlib.sha256(fields.get("flags", "").encode()).hexdigest()[:12]
    name, family, model = (fields.get(key, "?") for key in ("model name", "cpu family", "model"))
    return f"{name} family {family} model {model} {flags}"


def with_measured_batch(config: dict, repository: Path, threads: int) -> dict:
    """A classifier step's `config` with the preferred batch its cost curve chooses;
    unchanged where the build set none (a GPU's, `--classifier-batch 0`) or the ONNX
    file is not in `repository`."""
    batching = config.get("dynamic_batching", {})
    preferred = [int(size) for size in batching.get("preferred_batch_size", [])]
    max_batch = int(config.get("max_batch_size", 0))
    model_dir = repository / config["name"]
    if not preferred or max_batch <= 1 or not model_dir.is_dir():
        return config
    onnx_path = latest_version_dir(model_dir) / config.get("default_model_filename", "model.onnx")
    if not onnx_path.is_file():
        return config
    try:
        curve = cached_curve(onnx_path, threads)
    except (ValueError, RuntimeError, ort.capi.onnxruntime_pybind11_state.Fail) as error:
        # Not one batched FP32 input (an audio step's frames and state): the build's batch stays.
        LOGGER.info("%s: no batch cost curve (%s): preferred batch %s", config["name"], error, preferred)
        return config
    batch = min(chosen_batch({size: ms for size, ms in curve.items() if size <= max_batch}), max_batch)
    sizes = preferred_sizes(batch, preferred)
    LOGGER.info(
        "%s: %s ms an image at batch %s on %d thread(s): preferred batches %s",
        config["name"],
        " / ".join(f"{ms:.1f}" for ms in curve.values()),
        " / ".join(map(str, curve)),
        threads,
        sizes,
    )
    return config | {"dynamic_batching": batching | {"preferred_batch_size": sizes}}


def preferred_sizes(measured: int, built: list[int]) -> list[int]:
    """The measured batch, and the build's largest beside it. Triton forms the largest
    preferred batch its queue holds: the measured one while a few requests wait, the
    build's under a backlog. With the measured batch alone, a backlog too was served 2
    at a time, the paced first step ran between the classifier's short batches, and the
    classifier's queue refused what the first step had computed (docs/reliability.md#overload)."""
    return sorted({measured, max(built)})


def measured_batches(loaded: list[dict], changes: list[dict], repository: Path, threads: int) -> list[dict]:
    """`changes` (the layout's overrides of the `loaded` configs) with each classifier
    step's preferred batch from its cost curve, where that differs from what it serves."""
    changed = {change["name"]: change for change in changes}
    steps = ensemble_steps(loaded)
    for current in loaded:
        if current["name"] not in steps or current.get("backend") != CLASSIFIER_BACKEND or not sizable(current):
            continue
        batched = with_measured_batch(changed.get(current["name"], current), repository, threads)
        if differs(batched, current):
            changed[current["name"]] = batched
    return list(changed.values())
