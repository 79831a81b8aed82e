"""What each library costs per image, alone in this process, and the ensemble ratios
those costs allow: the ceiling a served ratio can reach on this CPU.

A server whose cores are busy serves cores / (CPU seconds per image) images per
second. The INT8 and FP32 ensembles share the DALI step, so INT8's served speed-up
is at most (dali + fp32) / (dali + int8), reached only if serving cost nothing; the
DALI and Pillow ensembles share the classifier, so DALI's is at most
(pil + fp32) / (dali + fp32). Serving adds the same cost to both sides of each ratio
(stubs, Triton, transport) and pulls the served ratio below its ceiling.

`pil` is the Pillow baseline the parity check holds DALI to (float resize, exact);
`pil_8bit` is the peer's (Pillow's own 8-bit resize), what a user writes.

The served cost beside those floors (`serving_cost`): each model's stubs' and
tritonserver's CPU per image in the benchmark's HTTP rounds (the ones measured against
the peer), what each step adds to its library alone, the whole served cost over the
floor (DALI + the FP32 classifier), and the DALI step served over the peer's Pillow
preprocessing in process.

Each library runs on one thread over batches of 8 of the benchmark's images, its
CPU time read with time.process_time (every thread of this process), the measures
interleaved round by round. The FP32 classifier once more on two threads
(`fp32_two_threads`): what one instance of two threads would cost beside two instances
of one, the layout's choice (`classifier_two_threads_vs_one_cpu`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from tritonstack.benchmark import peer
from tritonstack.benchmark.inprocess import dali_preprocessing
from tritonstack.build.model_files import VERSION
from tritonstack.build.pillow_model import preprocess
from tritonstack.build.presets import preset_named
from tritonstack.contract import PREPROCESS_INPUT, pad_batch
from tritonstack.measure.figures import Median
from tritonstack.measure.measured_models import CLASSIFIER, DALI_PREPROCESS, DALI_PRESET, INT8_PRESET
from tritonstack.measure.rounds import interleaved, ratios
from tritonstack.repository_files import ONNX_MODEL_FILENAME
from tritonstack.serve import process_tree

BATCH = 8
IMAGES = 64  # 8 batches a measure: short enough to interleave every library each round
PREPROCESSING = preset_named(DALI_PRESET).classifier.preprocessing


class CpuCost:
    """CPU milliseconds per image of one measure; `images` fixed, every call the same work."""

    def __init__(self, run_batch: Callable[[list[bytes]], object], images: list[bytes]):
        self._run_batch, self._batches = run_batch, [images[i : i + BATCH] for i in range(0, len(images), BATCH)]
        self._run_batch(self._batches[0])  # warm-up: first-run allocations and kernel selection

    def __call__(self) -> float:
        started = time.process_time()
        for batch in self._batches:
            self._run_batch(batch)
        return (time.process_time() - started) * 1000 / sum(len(batch) for batch in self._batches)


def _dali(repository: Path) -> Callable[[list[bytes]], object]:
    pipeline = dali_preprocessing(repository, BATCH, threads=1)

    def run_batch(batch: list[bytes]):
        pipeline.feed_input(PREPROCESS_INPUT, list(pad_batch(batch)))
        return pipeline.run()

    return run_batch


def _pillow(batch: list[bytes]) -> np.ndarray:
    """The Pillow preprocessing the python_* presets serve, with the DALI preset's parameters."""
    p = PREPROCESSING
    return np.stack([preprocess(data, p.resize_shorter, p.crop, p.mean, p.std) for data in batch])


def _pillow_8bit() -> Callable[[list[bytes]], np.ndarray] | None:
    """The peer's preprocessing (tritonstack.benchmark.peer_service): Pillow's own 8-bit
    resize, what a user writes; None without the peer extra."""
    if not peer.available():
        return None
    from tritonstack.benchmark.peer_service import preprocess as preprocess_8bit

    p = PREPROCESSING
    return lambda batch: np.stack([preprocess_8bit(data, p.resize_shorter, p.crop, p.mean, p.std) for data in batch])


def _classifier(
    repository: Path, preset_name: str, tensors: np.ndarray, threads: int = 1
) -> Callable[[list[bytes]], object]:
    classifier = preset_named(preset_name).classifier
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # as the served models
    session = ort.InferenceSession(
        str(repository / classifier.name / VERSION / ONNX_MODEL_FILENAME), options, providers=["CPUExecutionProvider"]
    )
    return lambda batch: session.run(None, {classifier.input_name: tensors[: len(batch)]})


@dataclass(frozen=True)
class CostFigures:
    cpu_ms_per_image: dict[str, float]  # per library: the median of the rounds
    cpu_ms_per_image_spread: dict[str, list[float]]
    cpu_ms_per_image_rounds: dict[str, list[float]]  # per library, round by round: the floors' rounds
    int8_vs_fp32_ensemble_ceiling: Median
    dali_vs_pil_ensemble_ceiling: Median
    classifier_two_threads_vs_one_cpu: Median


def cost_figures(repository: Path, images: list[bytes], repeats: int, log=print) -> CostFigures:
    """Each library's CPU per image, interleaved, and the ceilings they set."""
    images = images[:IMAGES]
    tensors = _pillow(images[:BATCH])  # a classifier's cost does not depend on its pixels
    measures = {
        "dali": CpuCost(_dali(repository), images),
        "pil": CpuCost(_pillow, images),
        "fp32": CpuCost(_classifier(repository, DALI_PRESET, tensors), images),
        "int8": CpuCost(_classifier(repository, INT8_PRESET, tensors), images),
        "fp32_two_threads": CpuCost(_classifier(repository, DALI_PRESET, tensors, threads=2), images),
    }
    if _pillow_8bit():
        measures["pil_8bit"] = CpuCost(_pillow_8bit(), images)
    log("CPU per image of each library alone, one thread (in process)...")
    rounds = interleaved(measures, repeats, log)
    return figures_of_costs(rounds)


def figures_of_costs(rounds: dict[str, list[float]]) -> CostFigures:
    """From each measure's CPU ms per image, round by round: the medians, and each ratio
    taken within a round (both sides measured seconds apart) before its median."""
    costs = {name: np.asarray(values) for name, values in rounds.items()}
    return CostFigures(
        cpu_ms_per_image={name: round(float(np.median(values)), 3) for name, values in costs.items()},
        cpu_ms_per_image_spread={
            name: [round(float(values.min()), 3), round(float(values.max()), 3)] for name, values in costs.items()
        },
        cpu_ms_per_image_rounds={name: [round(float(value), 3) for value in values] for name, values in costs.items()},
        int8_vs_fp32_ensemble_ceiling=Median.of(
            ratios(list(costs["dali"] + costs["fp32"]), list(costs["dali"] + costs["int8"]))
        ),
        dali_vs_pil_ensemble_ceiling=Median.of(
            ratios(list(costs["pil"] + costs["fp32"]), list(costs["dali"] + costs["fp32"]))
        ),
        classifier_two_threads_vs_one_cpu=Median.of(ratios(list(costs["fp32_two_threads"]), list(costs["fp32"]))),
    )


# The stubs of models the rounds did not call still tick (their memory accounting):
# below this they are left out of served_cpu_ms_per_image.
IDLE_MS_PER_IMAGE = 0.05


@dataclass(frozen=True)
class ServingCost:
    served_cpu_ms_per_image: dict[str, float]  # tritonserver and each model's stubs (medians of the rounds)
    served_overhead_ms_per_image: dict[str, float]  # each step over its library alone
    served_vs_floor: Median  # the whole served cost / (dali + fp32) in process, round by round
    served_dali_vs_peer_preprocess: Median  # the DALI step served / pil_8bit in process, round by round


STEP_LIBRARIES = {DALI_PREPROCESS: "dali", CLASSIFIER: "fp32"}


def serving_cost(served_rounds: list[dict[str, float]], floor_rounds: dict[str, list[float]]) -> ServingCost:
    """`served_rounds`: CPU ms per image by process role ("tritonserver", model names),
    one dict per served round; `floor_rounds`: each library's CPU ms per image alone, one
    value per in-process round (cost_figures' cpu_ms_per_image_rounds). What serving
    adds to each step (tritonserver adds all of its own), on the medians; and two
    ratios, round i served over round i in process, with their interval: the whole
    served cost over the libraries' (dali + fp32), the DALI step served over the peer's
    Pillow (pil_8bit). A round missing either side gives no ratio."""
    served = _medians(served_rounds)
    floors = {library: float(np.median(values)) for library, values in floor_rounds.items() if values}
    overhead = {
        name: served[name] - floors[library]
        for name, library in STEP_LIBRARIES.items()
        if name in served and library in floors
    }
    if "tritonserver" in served:
        overhead["tritonserver"] = served["tritonserver"]
    floor_totals = [sum(pair) for pair in zip(*(floor_rounds.get(library, []) for library in STEP_LIBRARIES.values()))]
    return ServingCost(
        served_cpu_ms_per_image={name: round(value, 3) for name, value in served.items()},
        served_overhead_ms_per_image={name: round(value, 3) for name, value in overhead.items()},
        served_vs_floor=Median.of(ratios([_whole(roles) for roles in served_rounds], floor_totals)),
        served_dali_vs_peer_preprocess=Median.of(
            ratios([roles.get(DALI_PREPROCESS) for roles in served_rounds], floor_rounds.get("pil_8bit", []))
        ),
    )


def _medians(served_rounds: list[dict[str, float]]) -> dict[str, float]:
    """Each role's median over the rounds that measured it; a model the rounds did not
    call (its stubs still tick: memory accounting) left out."""
    by_role: dict[str, list[float]] = {}
    for roles in served_rounds:
        for name, value in roles.items():
            by_role.setdefault(name, []).append(value)
    medians = {name: float(np.median(values)) for name, values in by_role.items()}
    return {name: value for name, value in medians.items() if value >= IDLE_MS_PER_IMAGE}


def _whole(roles: dict[str, float]) -> float | None:
    """One round's whole served cost per image: tritonserver, both steps and the rest
    (a stub that exited within the round: process_tree); None where a step was not
    measured."""
    if not all(roles.get(name, 0.0) >= IDLE_MS_PER_IMAGE for name in STEP_LIBRARIES):
        return None
    return sum(roles.get(name, 0.0) for name in ("tritonserver", *STEP_LIBRARIES, process_tree.REST))
