"""Write a Triton model repository: per preset, a preprocessing model, the ONNX
classifier and the ensemble that chains them.

    client ──INPUT (encoded bytes)──▶ ensemble_<preprocessor>_<classifier>
                                        ├─ preprocess_<preprocessor>_<classifier>
                                        │     "dali": DALI pipeline (model.dali or dali.py)
                                        │     "python": Pillow + NumPy (the baseline)
                                        └─ <classifier>                  (backend "onnxruntime")
           ◀──OUTPUT (probabilities, labels)──┘

Every file is written only when its content changes, and the ONNX export is
skipped while the classifier's fingerprint is unchanged, so a rebuild is cheap and
leaves the committed files untouched.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path

from tritonstack import classifiers, pillow_model, pipelines
from tritonstack.classifiers import Classifier
from tritonstack.model_config import (
    CONFIG_FILENAME,
    DynamicBatching,
    EnsembleStep,
    InstanceGroup,
    ModelConfig,
    Tensor,
    Warmup,
    WarmupInput,
)
from tritonstack.samples import photo_path

ENSEMBLE_INPUT = "INPUT"
ENSEMBLE_OUTPUT = "OUTPUT"
LABELS_FILENAME = "labels.txt"
VERSION = "1"
PREPROCESSORS = ("dali", "python")
FORMATS = ("model.dali", "dali.py")
DALI_VERSION_SUFFIX = ".version"  # model.dali.version: the DALI that serialized it
WARMUP_DIR = "warmup"
WARMUP_SAMPLE = "sample.jpg"


@dataclass(frozen=True)
class BuildOptions:
    max_batch_size: int = 32
    num_threads: int = 2  # DALI CPU threads; raise to the serving machine's cores
    # ONNX Runtime threads per classifier instance; fixed like num_threads so the
    # committed repository is the same everywhere (README, Performance).
    intra_op_threads: int = 2
    instances: int = 1
    max_queue_delay_us: int = 0
    device: str = "cpu"  # "gpu": nvJPEG decoding, GPU resize/normalize, KIND_GPU
    format: str = "model.dali"  # or "dali.py": serialized by the DALI backend at load

    def __post_init__(self):
        if self.device not in pipelines.DEVICES:
            raise ValueError(f"device must be one of {pipelines.DEVICES}, not {self.device!r}")
        if self.format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, not {self.format!r}")
        for name in ("max_batch_size", "num_threads", "intra_op_threads", "instances"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if self.max_queue_delay_us < 0:
            raise ValueError(f"max_queue_delay_us must be >= 0, not {self.max_queue_delay_us}")

    @property
    def instance_kind(self) -> str:
        return "KIND_GPU" if self.device == "gpu" else "KIND_CPU"


@dataclass(frozen=True)
class Preset:
    """One ensemble: a preprocessing model chained to a classifier."""

    classifier: Classifier
    preprocessor: str = "dali"

    @property
    def name(self) -> str:
        return f"{self.preprocessor}_{self.classifier.name}"

    @property
    def preprocessing_name(self) -> str:
        return f"preprocess_{self.name}"

    @property
    def ensemble_name(self) -> str:
        return f"ensemble_{self.name}"


PRESETS = (
    Preset(classifiers.EFFICIENTNET_LITE0, "dali"),
    Preset(classifiers.EFFICIENTNET_LITE0, "python"),
    Preset(classifiers.EFFICIENTNET_LITE2, "dali"),
)


def preset_named(name: str) -> Preset:
    for preset in PRESETS:
        if name in (preset.name, preset.ensemble_name):
            return preset
    raise KeyError(f"no preset {name!r}; presets: {', '.join(p.name for p in PRESETS)}")


def _batching(options: BuildOptions) -> DynamicBatching:
    return DynamicBatching(max_queue_delay_us=options.max_queue_delay_us)


def _preprocessed(classifier: Classifier) -> Tensor:
    crop = classifier.preprocessing.crop
    return Tensor(pipelines.OUTPUT_NAME, "FP32", (3, crop, crop))


def _sample_warmup(sample: bytes) -> tuple[Warmup, ...]:
    """A real JPEG: random bytes cannot be decoded, and would fail the model's load."""
    tensor = WarmupInput(pipelines.INPUT_NAME, "UINT8", (len(sample),), data_file=WARMUP_SAMPLE)
    return (Warmup(name="sample_jpeg", batch_size=1, inputs=(tensor,)),)


def dali_config(preset: Preset, options: BuildOptions, sample: bytes) -> ModelConfig:
    return ModelConfig(
        name=preset.preprocessing_name,
        backend="dali",
        max_batch_size=options.max_batch_size,
        inputs=(Tensor(pipelines.INPUT_NAME, "UINT8", (-1,), allow_ragged_batch=True),),
        outputs=(_preprocessed(preset.classifier),),
        dynamic_batching=_batching(options),
        instance_groups=(InstanceGroup(count=options.instances, kind=options.instance_kind),),
        parameters={"num_threads": str(options.num_threads)},
        warmup=_sample_warmup(sample),
    )


def python_config(preset: Preset, options: BuildOptions, sample: bytes) -> ModelConfig:
    preprocessing = preset.classifier.preprocessing
    return ModelConfig(
        name=preset.preprocessing_name,
        backend="python",
        max_batch_size=options.max_batch_size,
        inputs=(Tensor(pillow_model.INPUT_NAME, "UINT8", (-1,), allow_ragged_batch=True),),
        outputs=(_preprocessed(preset.classifier),),
        dynamic_batching=_batching(options),
        # Pillow runs on the CPU whatever the device of the rest.
        instance_groups=(InstanceGroup(count=options.instances, kind="KIND_CPU"),),
        parameters={
            "resize_shorter": str(preprocessing.resize_shorter),
            "crop": str(preprocessing.crop),
            "mean": ",".join(f"{value:g}" for value in preprocessing.mean),
            "std": ",".join(f"{value:g}" for value in preprocessing.std),
        },
        warmup=_sample_warmup(sample),
    )


def classifier_config(classifier: Classifier, options: BuildOptions) -> ModelConfig:
    crop = classifier.preprocessing.crop
    image = (3, crop, crop)
    return ModelConfig(
        name=classifier.name,
        backend="onnxruntime",
        max_batch_size=options.max_batch_size,
        inputs=(Tensor(classifier.input_name, "FP32", image),),
        outputs=(
            Tensor(classifier.output_name, "FP32", (classifier.num_classes,), label_filename=LABELS_FILENAME),
        ),
        dynamic_batching=_batching(options),
        instance_groups=(InstanceGroup(count=options.instances, kind=options.instance_kind),),
        parameters={"intra_op_thread_count": str(options.intra_op_threads)},
        warmup=(Warmup(name="zeros", batch_size=1,
                       inputs=(WarmupInput(classifier.input_name, "FP32", image, zero_data=True),)),),
    )


def ensemble_config(preset: Preset, options: BuildOptions) -> ModelConfig:
    classifier = preset.classifier
    preprocessed = "preprocessed_image"
    return ModelConfig(
        name=preset.ensemble_name,
        platform="ensemble",
        max_batch_size=options.max_batch_size,
        inputs=(Tensor(ENSEMBLE_INPUT, "UINT8", (-1,)),),
        outputs=(
            Tensor(ENSEMBLE_OUTPUT, "FP32", (classifier.num_classes,), label_filename=LABELS_FILENAME),
        ),
        steps=(
            EnsembleStep(
                model_name=preset.preprocessing_name,
                input_map={pipelines.INPUT_NAME: ENSEMBLE_INPUT},
                output_map={pipelines.OUTPUT_NAME: preprocessed},
            ),
            EnsembleStep(
                model_name=classifier.name,
                input_map={classifier.input_name: preprocessed},
                output_map={classifier.output_name: ENSEMBLE_OUTPUT},
            ),
        ),
    )


def warmup_sample() -> bytes:
    """A real photo (scikit-image's chelsea) as JPEG: the same bytes on every
    machine with the pinned Pillow, so the committed file does not drift."""
    from PIL import Image

    encoded = io.BytesIO()
    with Image.open(photo_path("chelsea.png")) as photo:
        photo.convert("RGB").save(encoded, format="JPEG", quality=90)
    return encoded.getvalue()


def write_repository(
    repository: Path,
    presets: tuple[Preset, ...] = PRESETS,
    options: BuildOptions = BuildOptions(),
) -> list[Path]:
    """Write every model of every preset; return the files that changed."""
    repository = Path(repository)
    changed: list[Path] = []
    sample = warmup_sample()
    written_classifiers = set()
    for preset in presets:
        changed += _write_preprocessing(repository / preset.preprocessing_name, preset, options, sample)
        if preset.classifier.name not in written_classifiers:
            written_classifiers.add(preset.classifier.name)
            changed += _write_classifier(repository / preset.classifier.name, preset.classifier, options)
        ensemble_dir = repository / preset.ensemble_name
        changed += _write_model(ensemble_dir, ensemble_config(preset, options))
        changed += _write_labels(ensemble_dir, preset.classifier)
        (ensemble_dir / VERSION).mkdir(exist_ok=True)  # ensembles have an empty version
    return changed


def _write_preprocessing(model_dir: Path, preset: Preset, options: BuildOptions, sample: bytes) -> list[Path]:
    preprocessing = preset.classifier.preprocessing
    changed = _write_if_changed(model_dir / WARMUP_DIR / WARMUP_SAMPLE, sample)
    version_dir = model_dir / VERSION
    if preset.preprocessor == "python":
        changed += _write_model(model_dir, python_config(preset, options, sample))
        return changed + _write_if_changed(version_dir / "model.py", Path(pillow_model.__file__).read_bytes())
    changed += _write_model(model_dir, dali_config(preset, options, sample))
    if options.format == "dali.py":
        files = pipelines.dali_py_files(preprocessing, options.max_batch_size, options.num_threads, options.device)
        stale = ("model.dali", "model.dali" + DALI_VERSION_SUFFIX)
    else:
        serialized = pipelines.serialize_pipeline(
            preprocessing, options.max_batch_size, options.num_threads, options.device
        )
        files = {"model.dali": serialized, "model.dali" + DALI_VERSION_SUFFIX: f"{pipelines.DALI_VERSION}\n".encode()}
        stale = tuple(pipelines.dali_py_files(preprocessing, 1, 1))
    for name in stale:  # the other format's files, from an earlier build
        (version_dir / name).unlink(missing_ok=True)
    for name, content in files.items():
        changed += _write_if_changed(version_dir / name, content)
    return changed


def _write_classifier(model_dir: Path, classifier: Classifier, options: BuildOptions) -> list[Path]:
    changed = _write_model(model_dir, classifier_config(classifier, options))
    changed += _write_labels(model_dir, classifier)
    return changed + _export_if_stale(classifier, model_dir / VERSION / "model.onnx")


def _write_labels(model_dir: Path, classifier: Classifier) -> list[Path]:
    return _write_if_changed(model_dir / LABELS_FILENAME, ("\n".join(classifier.labels()) + "\n").encode())


def _write_model(model_dir: Path, config: ModelConfig) -> list[Path]:
    return _write_if_changed(model_dir / CONFIG_FILENAME, config.to_pbtxt().encode())


def _write_if_changed(path: Path, content: bytes) -> list[Path]:
    if path.exists() and path.read_bytes() == content:
        return []
    path.parent.mkdir(parents=True, exist_ok=True)
    _replace_atomically(path, lambda partial: partial.write_bytes(content))
    return [path]


def _replace_atomically(path: Path, write) -> None:
    """Write next to `path` then rename: a server loading the repository meanwhile
    sees the old file or the new one, never half of one."""
    partial = path.with_name(f".{path.name}.partial")
    write(partial)
    os.replace(partial, path)


def _export_if_stale(classifier: Classifier, onnx_path: Path) -> list[Path]:
    stamp = onnx_path.with_name(f".{onnx_path.name}.fingerprint")
    fingerprint = classifier.fingerprint()
    if onnx_path.exists() and stamp.exists() and stamp.read_text() == fingerprint:
        return []
    onnx_path.parent.mkdir(parents=True, exist_ok=True)
    _replace_atomically(onnx_path, lambda partial: classifiers.export_onnx(classifier, partial))
    stamp.write_text(fingerprint)
    return [onnx_path]
