"""What can be built: the presets (a preprocessing model chained to a classifier,
served as one ensemble) and the options every model of a build shares."""

from __future__ import annotations

from dataclasses import dataclass

from tritonstack import contract
from tritonstack.build import classifiers
from tritonstack.build.classifiers import Classifier
from tritonstack.objective import DEFAULT_OBJECTIVE_MS, check_objective
from tritonstack.repository_files import DALI_MODEL_FILENAME, DALI_SCRIPT_FILENAME

DEVICES = ("cpu", "gpu")
FORMATS = (DALI_MODEL_FILENAME, DALI_SCRIPT_FILENAME)
PREPROCESSORS = ("dali", "python", contract.VIDEO_PREPROCESSOR, contract.REGIONS_PREPROCESSOR)


@dataclass(frozen=True)
class FrameSampling:
    """Which frames of a clip a video preset classifies: `frames`, `stride` apart."""

    frames: int
    stride: int


@dataclass(frozen=True)
class BuildOptions:
    max_batch_size: int = 32
    num_threads: int = 2  # DALI CPU threads; raise to the serving machine's cores
    # ONNX Runtime threads per classifier instance, and instances of each classifier
    # (0: `instances`); fixed like num_threads so the committed repository is the same
    # everywhere. On a CPU, two instances of one thread each spend less CPU per image
    # than one instance of two threads (no synchronization between the threads of one
    # run), for a classifier stub's memory more, and a lone request computes on one
    # core: measured side by side in docs/performance.md#thread-layout.
    intra_op_threads: int = 1
    instances: int = 1
    classifier_instances: int = 2
    max_queue_delay_us: int = 0
    # The batch the classifier's dynamic batcher forms from queued requests on the
    # CPU (`preferred_batch_size`; 0: none, batches up to max_batch_size). ONNX
    # Runtime's CPU rate per image is highest at batches of 4-8 and its arena keeps
    # the memory of the largest batch it ran: measured in docs/performance.md.
    # A request of more images still runs whole, up to max_batch_size.
    classifier_batch: int = 8
    # Admission under overload (docs/reliability.md#overload). A bound on the queue
    # before each ensemble's first step: a request that finds this many waiting is
    # refused at once (HTTP 503, gRPC UNAVAILABLE). 0 (no bound) by default: on Triton
    # 2.51, the CPU stack's server, such refusals inside an ensemble later crashed
    # tritonserver (SIGSEGV, reproduced in this project's suite; the ensemble fixes of
    # triton-inference-server/core#466 came after 2.51). For releases with them.
    max_queue_size: int = 0
    # Every step's queue ceiling derives from it (tritonstack.objective); 0: no ceiling.
    latency_objective_ms: int = DEFAULT_OBJECTIVE_MS
    device: str = "cpu"  # "gpu": nvJPEG decoding, GPU resize/normalize, KIND_GPU
    format: str = "model.dali"  # or "dali.py": serialized by the DALI backend at load
    # Video presets: each clip is decoded to `clip_frames` frames, `frame_stride` apart
    # (the last one repeated when the clip is shorter), every one classified.
    clip_frames: int = 8
    frame_stride: int = 4
    # `response_cache { enable: true }` on the ensembles: a request whose input bytes
    # equal an earlier one's is answered from the server's cache (`tritonstack serve
    # --response-cache-mb`), without running the steps. Off: load tests and the
    # benchmark repeat their images, and would measure the cache (docs/operations.md).
    response_cache: bool = False
    # Regions presets: the most boxes one image may come with, the pipeline's slots (DALI
    # has no operator that cuts a varying number of regions). Each slot past an image's
    # boxes still costs a 1-pixel region's resize to the crop (docs/building.md, Regions).
    max_boxes: int = 16

    def __post_init__(self):
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, not {self.device!r}")
        if self.format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, not {self.format!r}")
        for name in (
            "max_batch_size",
            "num_threads",
            "intra_op_threads",
            "instances",
            "clip_frames",
            "frame_stride",
            "max_boxes",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if self.classifier_instances < 0:
            raise ValueError(f"classifier_instances must be >= 0, not {self.classifier_instances}")
        if self.classifier_batch < 0:
            raise ValueError(f"classifier_batch must be >= 0, not {self.classifier_batch}")
        if self.max_queue_size < 0:
            raise ValueError(f"max_queue_size must be >= 0, not {self.max_queue_size}")
        check_objective(self.latency_objective_ms)
        if self.max_queue_delay_us < 0:
            raise ValueError(f"max_queue_delay_us must be >= 0, not {self.max_queue_delay_us}")

    @property
    def classifier_instance_count(self) -> int:
        return self.classifier_instances or self.instances

    @property
    def frame_sampling(self) -> FrameSampling:
        return FrameSampling(self.clip_frames, self.frame_stride)

    @property
    def clips_per_request(self) -> int:
        """A video model's max_batch_size: as many clips as the classifier's batch holds frames of."""
        if self.clip_frames > self.max_batch_size:
            raise ValueError(
                f"clip_frames {self.clip_frames} exceeds max_batch_size {self.max_batch_size}: "
                "the classifier takes a clip's frames in one batch"
            )
        return self.max_batch_size // self.clip_frames

    @property
    def images_per_regions_request(self) -> int:
        """A regions model's max_batch_size: as many images as the classifier's batch holds
        boxes of (a request's crops reach the classifier as one request)."""
        if self.max_boxes > self.max_batch_size:
            raise ValueError(
                f"max_boxes {self.max_boxes} exceeds max_batch_size {self.max_batch_size}: "
                "the classifier takes an image's crops in one batch"
            )
        return self.max_batch_size // self.max_boxes

    @property
    def classifier_preferred_batches(self) -> tuple[int, ...]:
        """Only on the CPU (a GPU gains from large batches), and only below max_batch_size."""
        return self._preferred_below_max(self.classifier_batch)

    @property
    def first_step_preferred_batches(self) -> tuple[int, ...]:
        """The classifier's batch, but never below the default's: one DALI run per image
        or two, at the first step's lower CPU priority, falls behind at 70 % load (its
        queue grew to seconds) where a classifier batch of one keeps up
        (docs/performance.md#a-classifier-batch-of-one-the-tail-for-8--of-the-throughput)."""
        if not self.classifier_batch:
            return ()
        return self._preferred_below_max(max(self.classifier_batch, BuildOptions.classifier_batch))

    def _preferred_below_max(self, batch: int) -> tuple[int, ...]:
        if self.device != "cpu" or not 0 < batch < self.max_batch_size:
            return ()
        return (batch,)

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
        """A classifier derived from another (INT8 from FP32) shares its preprocessing model."""
        source = self.classifier.derived_from or self.classifier.name
        return contract.preprocessing_name(f"{self.preprocessor}_{source}")

    @property
    def ensemble_name(self) -> str:
        return contract.ensemble_name(self.name)

    @property
    def video(self) -> bool:
        """Takes clips: DALI's video decoder, each frame classified (tritonstack.contract)."""
        return self.preprocessor == contract.VIDEO_PREPROCESSOR

    @property
    def regions(self) -> bool:
        """Takes an image and its boxes: a row of probabilities per box (tritonstack.contract)."""
        return self.preprocessor == contract.REGIONS_PREPROCESSOR


PRESETS = (
    Preset(classifiers.EFFICIENTNET_LITE0, "dali"),
    Preset(classifiers.EFFICIENTNET_LITE0, "python"),
    Preset(classifiers.EFFICIENTNET_LITE2, "dali"),
    Preset(classifiers.EFFICIENTNET_LITE0_INT8, "dali"),
    Preset(classifiers.EFFICIENTNET_LITE0, contract.VIDEO_PREPROCESSOR),
    Preset(classifiers.EFFICIENTNET_LITE0, contract.REGIONS_PREPROCESSOR),
    Preset(classifiers.EFFICIENTNET_LITE2, contract.REGIONS_PREPROCESSOR),
    Preset(classifiers.EFFICIENTNET_LITE0_INT8, contract.REGIONS_PREPROCESSOR),
)


def preset_named(name: str) -> Preset:
    for preset in PRESETS:
        if name in (preset.name, preset.ensemble_name):
            return preset
    raise KeyError(f"no preset {name!r}; presets: {', '.join(p.name for p in PRESETS)}")
