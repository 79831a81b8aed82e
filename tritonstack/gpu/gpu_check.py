"""The GPU variant's DALI pipelines run beside the CPU variant's on the same inputs.

    python -m tritonstack.gpu.gpu_check inputs --out .gpu/inputs            # here
    python3 -m tritonstack.gpu.gpu_check run --gpu-repository GPU_REPO \\
        --cpu-repository model_repository --inputs .gpu/inputs --out check.json  # there

`run` takes every DALI step of a repository built with `tritonstack build --device
gpu`, and its namesake in the CPU repository, and on the project's real photos (as
JPEG: nvJPEG's path), its clip, its collage with boxes and its tone writes, per
pipeline:
- the largest, the 99.9th percentile and the mean difference of the GPU variant's
  tensor from the CPU variant's, in 0..255 levels (the tensor times the classifier's
  std), and the input that holds the largest;
- each image's (frame's, box's) top-1 from the classifier's model.onnx (ONNX Runtime
  on the CPU) on both tensors, with each one's margin over its second class;
- images per second of preprocessing alone: the GPU pipeline, and the CPU pipeline
  with 2 threads on 2 cores and with one thread per core of the machine; one batch
  after another, as the DALI backend runs them.
Without a CUDA device the GPU side is recorded as absent, the rest is measured: that is
the path `make test` runs. Needs only DALI, NumPy and ONNX Runtime.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from tritonstack import cli
from tritonstack.build.classifiers import CLEAR_MARGIN
from tritonstack.contract import (
    AUDIO_PREPROCESSOR,
    PREPROCESS_BOXES,
    PREPROCESS_INPUT,
    REGIONS_PREPROCESSOR,
    VIDEO_PREPROCESSOR,
    pad_batch,
    preprocessing_name,
)
from tritonstack.repository_files import DALI_MODEL_FILENAME, ONNX_MODEL_FILENAME, VERSION

# What a GPU decoder may change (docs/performance.md, "On a GPU"): nvJPEG and NVDEC
# round differently from libjpeg-turbo and libavcodec, by a fraction of a level on
# average and by tens of levels on a few values; a top-1 that is no near-tie stays.
MEAN_LEVELS_TOLERANCE = 1.0
P999_LEVELS_TOLERANCE = 16.0
TIMING_BATCH = 32
LARGE_BATCH = 128  # a GPU gains from large batches: its figure there too
CLIP_NAME = "clip.mp4"
TONE_NAME = "tone.wav"
REGIONS_NAME = "regions.json"  # {"image": file name, "boxes": [[x0, y0, x1, y1], ...]}
KINDS = {REGIONS_PREPROCESSOR: "regions", VIDEO_PREPROCESSOR: "video", AUDIO_PREPROCESSOR: "audio"}  # else image
UNITS = {"image": "images", "regions": "boxes", "video": "frames", "audio": "clips"}
STD_NAME = "std.json"  # {preprocessing step: its classifier's std per channel}


@dataclass
class PipelineCheck:
    model: str
    kind: str  # image, regions, video, audio
    unit: str = "images"  # what images_per_s counts: images, boxes, frames or clips
    samples: int = 0
    max_levels: float | None = None
    p999_levels: float | None = None  # 99.9 % of values differ by at most this
    mean_levels: float | None = None
    worst_input: str | None = None  # the input that holds max_levels
    top1_cpu: list[int] = field(default_factory=list)
    top1_gpu: list[int] = field(default_factory=list)
    top1_margin_cpu: list[float] = field(default_factory=list)
    top1_margin_gpu: list[float] = field(default_factory=list)
    images_per_s: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    @property
    def top1_equal(self) -> bool | None:
        return self.top1_cpu == self.top1_gpu if self.top1_gpu else None

    @property
    def top1_equal_where_clear(self) -> bool | None:
        """Equal wherever the CPU's top-1 leads by CLEAR_MARGIN: near-ties left out."""
        if not self.top1_gpu:
            return None
        pairs = zip(self.top1_cpu, self.top1_gpu, self.top1_margin_cpu)
        return all(cpu == gpu for cpu, gpu, margin in pairs if margin >= CLEAR_MARGIN)

    @property
    def within_tolerance(self) -> bool | None:
        if self.p999_levels is None:
            return None
        return self.mean_levels <= MEAN_LEVELS_TOLERANCE and self.p999_levels <= P999_LEVELS_TOLERANCE


def write_inputs(out: Path) -> list[Path]:
    """The load test's photos (JPEG at three sizes), the sample clip, the collage with its boxes
    and the audio step's tone: the inputs `run` reads, written where they can travel."""
    from tritonstack.build.presets import PRESETS
    from tritonstack.contract import preprocessing_name
    from tritonstack.samples.corpus import build_corpus
    from tritonstack.samples.photos import collage, sample_clip
    from tritonstack.samples.speech import tone_wav

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for image in build_corpus():
        written.append(out / image.name)
        written[-1].write_bytes(image.data)
    regions = collage()
    (out / "collage.jpg").write_bytes(regions.jpeg)
    (out / REGIONS_NAME).write_text(json.dumps({"image": "collage.jpg", "boxes": regions.boxes}))
    (out / CLIP_NAME).write_bytes(sample_clip())
    (out / TONE_NAME).write_bytes(tone_wav())
    std = {preprocessing_name(preset.name): preset.classifier.preprocessing.std for preset in PRESETS}
    (out / STD_NAME).write_text(json.dumps(std, indent=2))
    return written + [out / name for name in ("collage.jpg", REGIONS_NAME, CLIP_NAME, TONE_NAME, STD_NAME)]


def dali_steps(repository: Path) -> dict[str, str]:
    """Each serialized DALI step of a repository and its kind, from its name."""
    steps = {}
    for model_file in sorted(repository.glob(f"*/{VERSION}/{DALI_MODEL_FILENAME}")):
        preprocessor, _ = _preset_parts(model_file.parent.parent.name)
        steps[model_file.parent.parent.name] = KINDS.get(preprocessor, "image")
    return steps


def classifier_of(step: str) -> str | None:
    """The classifier a preprocessing step feeds; an audio step feeds a detector."""
    preprocessor, classifier = _preset_parts(step)
    return None if preprocessor == AUDIO_PREPROCESSOR else classifier


def _preset_parts(step: str) -> tuple[str, str]:
    """preprocess_<preprocessor>_<classifier> (contract.preprocessing_name) split in two."""
    preprocessor, _, classifier = step.removeprefix(preprocessing_name("")).partition("_")
    return preprocessor, classifier


def _pipeline(model_file: Path, batch_size: int, num_threads: int, device_id: int | None):
    from nvidia.dali import Pipeline

    pipeline = Pipeline.deserialize(
        serialized_pipeline=model_file.read_bytes(),
        batch_size=batch_size,
        num_threads=num_threads,
        device_id=device_id,
        prefetch_queue_depth=1,
    )
    pipeline.build()
    return pipeline


def _run(pipeline, feed: dict[str, list[np.ndarray]]) -> list[np.ndarray]:
    for name, batch in feed.items():
        pipeline.feed_input(name, batch)
    (output,) = pipeline.run()
    if hasattr(output, "as_cpu"):
        output = output.as_cpu()
    return [np.asarray(output[i]) for i in range(len(output))]


def _feed(kind: str, inputs: Path, repeat: int = 1) -> dict[str, list[np.ndarray]]:
    """One batch of the kind's inputs (images repeated `repeat` times)."""
    if kind == "regions":
        regions = json.loads((inputs / REGIONS_NAME).read_text())
        encoded = [(inputs / regions["image"]).read_bytes()] * repeat
        boxes = [np.asarray(regions["boxes"], dtype=np.float32)] * repeat
        return {PREPROCESS_INPUT: list(pad_batch(encoded)), PREPROCESS_BOXES: boxes}
    encoded = [(inputs / name).read_bytes() for name in _input_names(kind, inputs)] * repeat
    return {PREPROCESS_INPUT: list(pad_batch(encoded))}


def _input_names(kind: str, inputs: Path) -> list[str]:
    """The file of each sample of _feed's batch."""
    if kind == "regions":
        return [json.loads((inputs / REGIONS_NAME).read_text())["image"]]
    if kind in ("video", "audio"):
        return [CLIP_NAME if kind == "video" else TONE_NAME]
    return image_inputs(inputs)


def image_inputs(inputs: Path) -> list[str]:
    """The photos among the inputs (JPEG at three sizes), by file name."""
    return [path.name for path in sorted(inputs.glob("*.jpg")) if path.name != "collage.jpg"]


def _images(kind: str, outputs: list[np.ndarray]) -> int:
    """Images preprocessed: a frame or a box is one image, a clip of audio is one."""
    return sum(len(output) for output in outputs) if kind in ("video", "regions") else len(outputs)


def _levels(cpu: list[np.ndarray], gpu: list[np.ndarray], std: np.ndarray | None):
    """max, 99.9th percentile and mean |CPU - GPU| in levels, and the sample holding the max."""
    differences = [np.abs(c.astype(np.float64) - g.astype(np.float64)) for c, g in zip(cpu, gpu)]
    if std is not None:  # normalized tensors: back to pixel levels, channel by channel
        differences = [d * std.reshape(-1, 1, 1) for d in differences]  # CHW or FCHW
    flat = np.concatenate([d.ravel() for d in differences])
    worst = int(np.argmax([d.max() for d in differences]))
    return float(flat.max()), float(np.percentile(flat, 99.9)), float(flat.mean()), worst


def _classifier_inputs(outputs: list[np.ndarray]) -> np.ndarray:
    """The classifier's batch: an image's CHW tensor, or each frame or box of FCHW."""
    return np.concatenate([o if o.ndim == 4 else o[None] for o in outputs]).astype(np.float32)


def _ranked(session, batch: np.ndarray) -> tuple[list[int], list[float]]:
    (scores,) = session.run(None, {session.get_inputs()[0].name: batch})
    return top1_and_margin(scores)


def top1_and_margin(scores: np.ndarray) -> tuple[list[int], list[float]]:
    """Each row's top-1 class and its lead over the second."""
    ordered = np.sort(scores, axis=1)
    return scores.argmax(axis=1).tolist(), (ordered[:, -1] - ordered[:, -2]).tolist()


def _images_per_s(model_file, kind, inputs, threads, device_id, seconds, batch=None):
    """Images per second of one batch after another (TIMING_BATCH inputs, or `batch`)."""
    repeat = max(1, (batch or TIMING_BATCH) // len(_input_names(kind, inputs)))
    feed = _feed(kind, inputs, repeat=repeat)
    pipeline = _pipeline(model_file, len(feed[PREPROCESS_INPUT]), threads, device_id)
    images = _images(kind, _run(pipeline, feed))  # warm-up: allocations, decoder setup
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        _run(pipeline, feed)
        done += images
    return round(done / (time.perf_counter() - start), 1)


def _on_cores(cores: set[int], measure):
    """`measure()` with this process (and the DALI threads it starts) on `cores`."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        return measure()
    finally:
        os.sched_setaffinity(0, before)


def cuda_devices() -> int:
    from nvidia.dali.backend import GetCUDADeviceCount

    try:
        return GetCUDADeviceCount()
    except RuntimeError:
        return 0


def check_pipeline(model: str, kind: str, gpu_repo: Path, cpu_repo: Path, inputs: Path, seconds: float, gpu: bool):
    result = PipelineCheck(model, kind, UNITS[kind])
    cpu_file = cpu_repo / model / VERSION / DALI_MODEL_FILENAME
    gpu_file = gpu_repo / model / VERSION / DALI_MODEL_FILENAME
    feed = _feed(kind, inputs)
    batch = len(feed[PREPROCESS_INPUT])
    cpu_out = _run(_pipeline(cpu_file, batch, 2, None), feed)
    result.samples = _images(kind, cpu_out)
    classifier = classifier_of(model)
    session = None
    if classifier is not None and (cpu_repo / classifier / VERSION / ONNX_MODEL_FILENAME).exists():
        import onnxruntime

        session = onnxruntime.InferenceSession(
            str(cpu_repo / classifier / VERSION / ONNX_MODEL_FILENAME), providers=["CPUExecutionProvider"]
        )
        result.top1_cpu, result.top1_margin_cpu = _ranked(session, _classifier_inputs(cpu_out))
    all_cores = os.sched_getaffinity(0)
    two = set(sorted(all_cores)[:2])
    result.images_per_s["cpu_2_threads_2_cores"] = _on_cores(
        two, lambda: _images_per_s(cpu_file, kind, inputs, 2, None, seconds)
    )
    if len(all_cores) > 2:
        result.images_per_s[f"cpu_{len(all_cores)}_threads_{len(all_cores)}_cores"] = _images_per_s(
            cpu_file, kind, inputs, len(all_cores), None, seconds
        )
    if not gpu:
        result.error = "no CUDA device: the GPU variant was not run"
        return result
    try:
        gpu_out = _run(_pipeline(gpu_file, batch, 2, 0), feed)
        std = _std(inputs, model)
        result.max_levels, result.p999_levels, result.mean_levels, worst = _levels(cpu_out, gpu_out, std)
        result.worst_input = _input_names(kind, inputs)[worst]
        if session is not None:
            result.top1_gpu, result.top1_margin_gpu = _ranked(session, _classifier_inputs(gpu_out))
        result.images_per_s["gpu"] = _images_per_s(gpu_file, kind, inputs, 4, 0, seconds)
        result.images_per_s[f"gpu_batch_{LARGE_BATCH}"] = _images_per_s(
            gpu_file, kind, inputs, 4, 0, seconds, LARGE_BATCH
        )
    except Exception as error:  # one pipeline's failure (a decoder the card lacks) is its row's
        result.error = f"{type(error).__name__}: {error}"
    return result


def _std(inputs: Path, model: str) -> np.ndarray | None:
    """The std the step divides by, per channel: levels = tensor difference x std."""
    std = json.loads((inputs / STD_NAME).read_text()).get(model)
    return None if std is None else np.asarray(std, dtype=np.float64)


def run_checks(gpu_repo: Path, cpu_repo: Path, inputs: Path, seconds: float) -> dict:
    gpu = cuda_devices() > 0
    steps = dali_steps(gpu_repo)
    missing = sorted(set(steps) - set(dali_steps(cpu_repo)))
    if missing:
        raise SystemExit(f"{cpu_repo} has no CPU variant of {', '.join(missing)}")
    checks = [check_pipeline(model, kind, gpu_repo, cpu_repo, inputs, seconds, gpu) for model, kind in steps.items()]
    return {
        "machine": machine(gpu),
        "tolerance_levels": {"mean": MEAN_LEVELS_TOLERANCE, "p99.9": P999_LEVELS_TOLERANCE},
        "clear_margin": CLEAR_MARGIN,
        "pipelines": [
            asdict(check)
            | {
                "top1_equal": check.top1_equal,
                "top1_equal_where_clear": check.top1_equal_where_clear,
                "within_tolerance": check.within_tolerance,
            }
            for check in checks
        ],
    }


def machine(gpu: bool) -> dict:
    import nvidia.dali

    facts = {"cpu": platform.processor() or platform.machine(), "cores": len(os.sched_getaffinity(0))}
    facts["dali"] = nvidia.dali.__version__
    if gpu:
        facts["gpu"] = _gpu_name()
    return facts


def _gpu_name() -> str:
    import subprocess

    query = ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]
    try:
        return subprocess.run(query, capture_output=True, text=True, timeout=30).stdout.strip()
    except OSError:
        return "unknown (no nvidia-smi)"


SUMMARY = ("model", "max_levels", "p999_levels", "mean_levels", "top1_equal", "top1_equal_where_clear", "images_per_s")


@dataclass(frozen=True)
class InputsOptions:
    out: Path = cli.out_option(cli.REQUIRED, help="the folder the inputs go to")


@dataclass(frozen=True)
class Variants:
    """What the GPU machine's checks (this one and gpu_serve) compare, and where they write."""

    gpu_repository: Path = cli.option(None, "--gpu-repository", type=Path, required=True, help="the GPU variant")
    cpu_repository: Path = cli.option(None, "--cpu-repository", type=Path, required=True, help="the CPU variant")
    inputs: Path = cli.option(None, "--inputs", type=Path, required=True, help="the folder `gpu_check inputs` wrote")
    out: Path = cli.out_option(cli.REQUIRED, help="the report")


@dataclass(frozen=True)
class CheckOptions(Variants):
    seconds: float = cli.option(3.0, "--seconds", type=cli.positive_float, help="timing per pipeline and variant")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tritonstack.gpu.gpu_check", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    cli.add_options(
        commands.add_parser("inputs", help="write the photos, clip, collage and tone the check reads"), InputsOptions
    )
    cli.add_options(
        commands.add_parser(
            "run", help="run the GPU and CPU variants' pipelines and write the JSON", formatter_class=cli.HelpFormatter
        ),
        CheckOptions,
    )
    args = parser.parse_args(argv)
    if args.command == "inputs":
        for path in write_inputs(cli.from_args(InputsOptions, args).out):
            print(path)
        return
    options = cli.from_args(CheckOptions, args)
    report = run_checks(options.gpu_repository, options.cpu_repository, options.inputs, options.seconds)
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps(report, indent=2) + "\n")
    for row in report["pipelines"]:
        print(json.dumps({key: row[key] for key in SUMMARY}))


if __name__ == "__main__":
    main()
