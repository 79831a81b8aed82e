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

import contextlib
import io
import logging
import warnings
from pathlib import Path

from tritonstack.build import classifiers, pillow_model, pipelines, quantization
from tritonstack.build.audio import SpeechPreset, write_speech_preset
from tritonstack.build.classifiers import Classifier
from tritonstack.build.model_config import (
    TENSORRT_FP16,
    EnsembleStep,
    ModelConfig,
    Tensor,
    Warmup,
    WarmupInput,
)
from tritonstack.build.model_files import VERSION, replace_atomically, write_config, write_if_changed
from tritonstack.build.onnx_graph import servable_onnx
from tritonstack.build.presets import PRESETS, BuildOptions, Preset
from tritonstack.build.scheduling import ensemble_parameters, step_batching, step_instances
from tritonstack.contract import (
    BOX_WIDTH,
    BOXES_INPUT_PARAMETER,
    ENSEMBLE_BOXES,
    ENSEMBLE_INPUT,
    ENSEMBLE_OUTPUT,
    MAX_BOXES_PARAMETER,
    PREPROCESS_BOXES,
    PREPROCESS_INPUT,
    PREPROCESS_OUTPUT,
    boxes_array,
)
from tritonstack.media import decode_budget
from tritonstack.repository_files import (
    LABELS_FILENAME,
    ONNX_MODEL_FILENAME,
    PYTHON_MODEL_FILENAME,
    WARMUP_DIR,
)
from tritonstack.samples.photos import sample_clip, sample_jpeg

LOGGER = logging.getLogger(__name__)  # a line per step; build_pipelines.py shows them
# About how long one EfficientNet-Lite export takes on 2 cores, told before it starts.
EXPORT_SECONDS = 15
WARMUP_SAMPLE = "sample.jpg"
WARMUP_CLIP = "sample_clip.mp4"
WARMUP_BOXES = "sample_boxes.fp32"
# The regions models' warmup: two boxes of the warmup JPEG (chelsea, 451x300): the cat's
# head and the whole image.
WARMUP_SAMPLE_BOXES = ((140.0, 40.0, 330.0, 230.0), (0.0, 0.0, 451.0, 300.0))


def _preprocessed(classifier: Classifier) -> Tensor:
    p = classifier.preprocessing
    return Tensor(PREPROCESS_OUTPUT, p.triton_type, p.image_dims)


def _sample_warmup(sample: bytes, filename: str = WARMUP_SAMPLE, name: str = "sample_jpeg") -> tuple[Warmup, ...]:
    """A real JPEG (or clip): random bytes cannot be decoded, and would fail the model's load."""
    tensor = WarmupInput(PREPROCESS_INPUT, "UINT8", (len(sample),), data_file=filename)
    return (Warmup(name=name, batch_size=1, inputs=(tensor,)),)


def _preprocessing_config(
    preset: Preset, options: BuildOptions, sample: bytes, backend: str, kind: str, parameters: dict[str, str]
) -> ModelConfig:
    return ModelConfig(
        name=preset.preprocessing_name,
        backend=backend,
        max_batch_size=options.max_batch_size,
        inputs=(Tensor(PREPROCESS_INPUT, "UINT8", (-1,), allow_ragged_batch=True),),
        outputs=(_preprocessed(preset.classifier),),
        # In the classifier's batches on the CPU (of the default's at least): under overload
        # the first step hands on one classifier batch at a time, not all it holds
        # (docs/reliability.md#overload).
        dynamic_batching=step_batching(options, options.first_step_preferred_batches, first_step=True),
        instance_groups=(step_instances(options.instances, kind, first_step=True),),
        parameters=parameters,
        warmup=_sample_warmup(sample),
    )


def dali_config(preset: Preset, options: BuildOptions, sample: bytes) -> ModelConfig:
    return _preprocessing_config(
        preset, options, sample, "dali", options.instance_kind, {"num_threads": str(options.num_threads)}
    )


def video_config(preset: Preset, options: BuildOptions) -> ModelConfig:
    """A clip per sample in, its frames out as samples of their own
    (`split_along_outer_axis`), so the classifier takes them as a batch."""
    return ModelConfig(
        name=preset.preprocessing_name,
        backend="dali",
        max_batch_size=options.clips_per_request,
        inputs=(Tensor(PREPROCESS_INPUT, "UINT8", (-1,), allow_ragged_batch=True),),
        outputs=(_preprocessed(preset.classifier),),
        dynamic_batching=step_batching(options, first_step=True),
        instance_groups=(step_instances(options.instances, options.instance_kind, first_step=True),),
        parameters={"num_threads": str(options.num_threads), "split_along_outer_axis": PREPROCESS_OUTPUT},
        warmup=_sample_warmup(sample_clip(), WARMUP_CLIP, "sample_clip"),
    )


def regions_config(preset: Preset, options: BuildOptions, sample: bytes) -> ModelConfig:
    """An image and its boxes per sample in, a crop per box out as samples of their own
    (`split_along_outer_axis`), so the classifier takes them as a batch."""
    boxes = WarmupInput(PREPROCESS_BOXES, "FP32", (len(WARMUP_SAMPLE_BOXES), BOX_WIDTH), data_file=WARMUP_BOXES)
    image = WarmupInput(PREPROCESS_INPUT, "UINT8", (len(sample),), data_file=WARMUP_SAMPLE)
    return ModelConfig(
        name=preset.preprocessing_name,
        backend="dali",
        max_batch_size=options.images_per_regions_request,
        inputs=(
            Tensor(PREPROCESS_INPUT, "UINT8", (-1,), allow_ragged_batch=True),
            Tensor(PREPROCESS_BOXES, "FP32", (-1, BOX_WIDTH), allow_ragged_batch=True),
        ),
        outputs=(_preprocessed(preset.classifier),),
        dynamic_batching=step_batching(options, first_step=True),
        instance_groups=(step_instances(options.instances, options.instance_kind, first_step=True),),
        parameters={
            "num_threads": str(options.num_threads),
            "split_along_outer_axis": PREPROCESS_OUTPUT,
            BOXES_INPUT_PARAMETER: PREPROCESS_BOXES,
            MAX_BOXES_PARAMETER: str(options.max_boxes),
        },
        warmup=(Warmup(name="sample_jpeg_boxes", batch_size=1, inputs=(image, boxes)),),
    )


def python_config(preset: Preset, options: BuildOptions, sample: bytes) -> ModelConfig:
    preprocessing = preset.classifier.preprocessing
    # Pillow runs on the CPU whatever the device of the rest.
    return _preprocessing_config(
        preset,
        options,
        sample,
        "python",
        "KIND_CPU",
        {
            "resize_shorter": str(preprocessing.resize_shorter),
            "crop": str(preprocessing.crop),
            "mean": ",".join(f"{value:g}" for value in preprocessing.mean),
            "std": ",".join(f"{value:g}" for value in preprocessing.std),
        },
    )


def classifier_config(classifier: Classifier, options: BuildOptions) -> ModelConfig:
    p = classifier.preprocessing
    image, image_type = p.image_dims, p.triton_type
    return ModelConfig(
        name=classifier.name,
        backend="onnxruntime",
        max_batch_size=options.max_batch_size,
        inputs=(Tensor(classifier.input_name, image_type, image, format=f"FORMAT_{p.layout}"),),
        outputs=(Tensor(classifier.output_name, "FP32", (classifier.num_classes,), label_filename=LABELS_FILENAME),),
        dynamic_batching=step_batching(options, options.classifier_preferred_batches),
        instance_groups=(
            step_instances(options.classifier_instance_count, options.instance_kind, threads=options.intra_op_threads),
        ),
        parameters={"intra_op_thread_count": str(options.intra_op_threads)},
        # Only the GPU variant: the C++ backend builds TensorRT engines from it on
        # KIND_GPU; our CPU backend ignores it (untested on a GPU here).
        gpu_accelerators=(TENSORRT_FP16,) if options.device == "gpu" else (),
        warmup=(
            Warmup(
                name="zeros",
                batch_size=1,
                inputs=(WarmupInput(classifier.input_name, image_type, image, zero_data=True),),
            ),
        ),
    )


def ensemble_config(preset: Preset, options: BuildOptions) -> ModelConfig:
    classifier = preset.classifier
    preprocessed = "preprocessed_image"
    inputs, input_map = (Tensor(ENSEMBLE_INPUT, "UINT8", (-1,)),), {PREPROCESS_INPUT: ENSEMBLE_INPUT}
    # A video ensemble answers with clip_frames rows per clip; a regions one with a row per box.
    max_batch_size = options.max_batch_size
    if preset.video:
        max_batch_size = options.clips_per_request
    elif preset.regions:
        max_batch_size = options.images_per_regions_request
        inputs += (Tensor(ENSEMBLE_BOXES, "FP32", (-1, BOX_WIDTH)),)
        input_map = {**input_map, PREPROCESS_BOXES: ENSEMBLE_BOXES}
    return ModelConfig(
        name=preset.ensemble_name,
        platform="ensemble",
        max_batch_size=max_batch_size,
        inputs=inputs,
        outputs=(Tensor(ENSEMBLE_OUTPUT, "FP32", (classifier.num_classes,), label_filename=LABELS_FILENAME),),
        response_cache=options.response_cache,
        parameters=ensemble_parameters(options),
        steps=(
            EnsembleStep(
                model_name=preset.preprocessing_name,
                input_map=input_map,
                output_map={PREPROCESS_OUTPUT: preprocessed},
            ),
            EnsembleStep(
                model_name=classifier.name,
                input_map={classifier.input_name: preprocessed},
                output_map={classifier.output_name: ENSEMBLE_OUTPUT},
            ),
        ),
    )


def write_repository(
    repository: Path,
    presets: tuple[Preset, ...] = PRESETS,
    options: BuildOptions = BuildOptions(),
    audio_presets: tuple[SpeechPreset, ...] = (),
) -> list[Path]:
    """Write every model of every preset (the image presets, then the audio ones);
    return the files that changed."""
    repository = Path(repository)
    changed: list[Path] = []
    sample = sample_jpeg()
    written_classifiers, written_preprocessing = set(), set()
    for preset in presets:
        if preset.preprocessing_name not in written_preprocessing:  # shared by derived classifiers
            written_preprocessing.add(preset.preprocessing_name)
            LOGGER.info("%s: %s preprocessing", preset.name, preset.preprocessor)
            changed += _write_preprocessing(repository / preset.preprocessing_name, preset, options, sample)
        if preset.classifier.name not in written_classifiers:
            written_classifiers.add(preset.classifier.name)
            changed += _write_classifier(repository / preset.classifier.name, preset.classifier, options)
        ensemble_dir = repository / preset.ensemble_name
        changed += write_config(ensemble_dir, ensemble_config(preset, options))
        changed += _write_labels(ensemble_dir, preset.classifier)
        (ensemble_dir / VERSION).mkdir(exist_ok=True)  # ensembles have an empty version
    for audio in audio_presets:
        changed += write_speech_preset(repository, audio, options)
    return changed


def _write_preprocessing(model_dir: Path, preset: Preset, options: BuildOptions, sample: bytes) -> list[Path]:
    preprocessing = preset.classifier.preprocessing
    warmup = (WARMUP_CLIP, sample_clip()) if preset.video else (WARMUP_SAMPLE, sample)
    changed = write_if_changed(model_dir / WARMUP_DIR / warmup[0], warmup[1])
    version_dir = model_dir / VERSION
    if preset.regions:
        changed += write_if_changed(model_dir / WARMUP_DIR / WARMUP_BOXES, boxes_array(WARMUP_SAMPLE_BOXES).tobytes())
    if preset.preprocessor == "python":
        changed += write_config(model_dir, python_config(preset, options, sample))
        changed += write_if_changed(version_dir / PYTHON_MODEL_FILENAME, Path(pillow_model.__file__).read_bytes())
        # model.py imports nothing of this project (it serves in the NGC container
        # too): its decode budget travels beside it.
        return changed + write_if_changed(
            version_dir / decode_budget.MODULE_FILENAME, Path(decode_budget.__file__).read_bytes()
        )
    clips = options.frame_sampling if preset.video else None
    max_boxes = options.max_boxes if preset.regions else None
    if preset.video:
        config = video_config(preset, options)
    elif preset.regions:
        config = regions_config(preset, options, sample)
    else:
        config = dali_config(preset, options, sample)
    changed += write_config(model_dir, config)
    pipeline = (preprocessing, config.max_batch_size, options.num_threads, options.device, clips, max_boxes)
    files, stale = pipelines.model_files(
        options.format, lambda: pipelines.serialize_pipeline(*pipeline), lambda: pipelines.dali_py_files(*pipeline)
    )
    for name in stale:  # the other format's files, from an earlier build
        (version_dir / name).unlink(missing_ok=True)
    for name, content in files.items():
        changed += write_if_changed(version_dir / name, content)
    return changed


def _write_classifier(model_dir: Path, classifier: Classifier, options: BuildOptions) -> list[Path]:
    changed = write_config(model_dir, classifier_config(classifier, options))
    changed += _write_labels(model_dir, classifier)
    return changed + _export_if_stale(classifier, model_dir / VERSION / ONNX_MODEL_FILENAME)


def _write_labels(model_dir: Path, classifier: Classifier) -> list[Path]:
    return write_if_changed(model_dir / LABELS_FILENAME, ("\n".join(classifier.labels()) + "\n").encode())


def _write_servable(classifier: Classifier, path: Path) -> None:
    path.write_bytes(
        servable_onnx(classifier.onnx_file, classifier.softmax, classifier.dynamic_batch, classifier.dequantize)
    )


def _export_if_stale(classifier: Classifier, onnx_path: Path) -> list[Path]:
    stamp = onnx_path.with_name(f".{onnx_path.name}.fingerprint")
    fingerprint = quantization.fingerprint(classifier) if classifier.int8 else classifier.fingerprint()
    if onnx_path.exists() and stamp.exists() and stamp.read_text() == fingerprint:
        LOGGER.info("%s: model.onnx is up to date", classifier.name)
        return []
    onnx_path.parent.mkdir(parents=True, exist_ok=True)
    if classifier.onnx_file is None:
        LOGGER.info("exporting %s to ONNX (about %d s)", classifier.name, EXPORT_SECONDS)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        # torch's exporter warns about constant folding and tracing for any model,
        # the weights package prints "Loaded pretrained weights": nothing a user
        # of this build can act on.
        warnings.simplefilter("ignore")
        export = quantization.export_int8 if classifier.int8 else classifiers.export_onnx
        if classifier.onnx_file is not None:  # a user's graph, with the edits it needs
            export = _write_servable
        replace_atomically(onnx_path, lambda partial: export(classifier, partial))
    stamp.write_text(fingerprint)
    return [onnx_path]
