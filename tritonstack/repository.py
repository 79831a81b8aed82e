"""Write a Triton model repository: per classifier, a DALI preprocessing model, the
ONNX classifier and the ensemble that chains them.

    client ──INPUT (encoded bytes)──▶ ensemble_dali_<classifier>
                                        ├─ preprocess_dali_<classifier>  (backend "dali")
                                        └─ <classifier>                  (backend "onnxruntime")
           ◀──OUTPUT (probabilities, labels)──┘

Every file is written only when its content changes, and the ONNX export is
skipped while the classifier's fingerprint is unchanged, so a rebuild is cheap and
leaves the committed files untouched.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tritonstack import classifiers, pipelines
from tritonstack.classifiers import Classifier
from tritonstack.model_config import (
    CONFIG_FILENAME,
    DynamicBatching,
    EnsembleStep,
    InstanceGroup,
    ModelConfig,
    Tensor,
)

ENSEMBLE_INPUT = "INPUT"
ENSEMBLE_OUTPUT = "OUTPUT"
LABELS_FILENAME = "labels.txt"
VERSION = "1"


@dataclass(frozen=True)
class BuildOptions:
    max_batch_size: int = 32
    num_threads: int = 2  # DALI CPU threads; raise to the serving machine's cores
    instances: int = 1
    max_queue_delay_us: int = 0


def preprocessing_name(classifier: Classifier) -> str:
    return f"preprocess_dali_{classifier.name}"


def ensemble_name(classifier: Classifier) -> str:
    return f"ensemble_dali_{classifier.name}"


def preprocessing_config(classifier: Classifier, options: BuildOptions) -> ModelConfig:
    crop = classifier.preprocessing.crop
    return ModelConfig(
        name=preprocessing_name(classifier),
        backend="dali",
        max_batch_size=options.max_batch_size,
        inputs=(Tensor(pipelines.INPUT_NAME, "UINT8", (-1,), allow_ragged_batch=True),),
        outputs=(Tensor(pipelines.OUTPUT_NAME, "FP32", (3, crop, crop)),),
        dynamic_batching=DynamicBatching(max_queue_delay_us=options.max_queue_delay_us),
        instance_groups=(InstanceGroup(count=options.instances, kind="KIND_CPU"),),
        parameters={"num_threads": str(options.num_threads)},
    )


def classifier_config(classifier: Classifier, options: BuildOptions) -> ModelConfig:
    crop = classifier.preprocessing.crop
    return ModelConfig(
        name=classifier.name,
        backend="onnxruntime",
        max_batch_size=options.max_batch_size,
        inputs=(Tensor(classifiers.INPUT_NAME, "FP32", (3, crop, crop)),),
        outputs=(
            Tensor(
                classifiers.OUTPUT_NAME,
                "FP32",
                (classifiers.NUM_CLASSES,),
                label_filename=LABELS_FILENAME,
            ),
        ),
        dynamic_batching=DynamicBatching(max_queue_delay_us=options.max_queue_delay_us),
        # No kind: Triton picks KIND_GPU where there is a GPU, KIND_CPU elsewhere.
        instance_groups=(InstanceGroup(count=options.instances, kind="KIND_AUTO"),),
    )


def ensemble_config(classifier: Classifier, options: BuildOptions) -> ModelConfig:
    preprocessed = "preprocessed_image"
    return ModelConfig(
        name=ensemble_name(classifier),
        platform="ensemble",
        max_batch_size=options.max_batch_size,
        inputs=(Tensor(ENSEMBLE_INPUT, "UINT8", (-1,)),),
        outputs=(
            Tensor(
                ENSEMBLE_OUTPUT,
                "FP32",
                (classifiers.NUM_CLASSES,),
                label_filename=LABELS_FILENAME,
            ),
        ),
        steps=(
            EnsembleStep(
                model_name=preprocessing_name(classifier),
                input_map={pipelines.INPUT_NAME: ENSEMBLE_INPUT},
                output_map={pipelines.OUTPUT_NAME: preprocessed},
            ),
            EnsembleStep(
                model_name=classifier.name,
                input_map={classifiers.INPUT_NAME: preprocessed},
                output_map={classifiers.OUTPUT_NAME: ENSEMBLE_OUTPUT},
            ),
        ),
    )


def write_repository(
    repository: Path,
    classifier_list: tuple[Classifier, ...] = (classifiers.EFFICIENTNET_LITE0,),
    options: BuildOptions = BuildOptions(),
) -> list[Path]:
    """Write every model of every classifier; return the files that changed."""
    changed: list[Path] = []
    labels = "\n".join(classifiers.imagenet_labels()) + "\n"
    for classifier in classifier_list:
        serialized = pipelines.serialize_pipeline(
            classifier.preprocessing, options.max_batch_size, options.num_threads
        )
        preprocessing_dir = repository / preprocessing_name(classifier)
        changed += _write_model(preprocessing_dir, preprocessing_config(classifier, options))
        changed += _write_if_changed(preprocessing_dir / VERSION / "model.dali", serialized)

        classifier_dir = repository / classifier.name
        changed += _write_model(classifier_dir, classifier_config(classifier, options))
        changed += _write_if_changed(classifier_dir / LABELS_FILENAME, labels.encode())
        changed += _export_if_stale(classifier, classifier_dir / VERSION / "model.onnx")

        ensemble_dir = repository / ensemble_name(classifier)
        changed += _write_model(ensemble_dir, ensemble_config(classifier, options))
        changed += _write_if_changed(ensemble_dir / LABELS_FILENAME, labels.encode())
        (ensemble_dir / VERSION).mkdir(exist_ok=True)  # ensembles have an empty version
    return changed


def _write_model(model_dir: Path, config: ModelConfig) -> list[Path]:
    return _write_if_changed(model_dir / CONFIG_FILENAME, config.to_pbtxt().encode())


def _write_if_changed(path: Path, content: bytes) -> list[Path]:
    if path.exists() and path.read_bytes() == content:
        return []
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return [path]


def _export_if_stale(classifier: Classifier, onnx_path: Path) -> list[Path]:
    stamp = onnx_path.with_name(f".{onnx_path.name}.fingerprint")
    fingerprint = classifier.fingerprint()
    if onnx_path.exists() and stamp.exists() and stamp.read_text() == fingerprint:
        return []
    classifiers.export_onnx(classifier, onnx_path)
    stamp.write_text(fingerprint)
    return [onnx_path]
