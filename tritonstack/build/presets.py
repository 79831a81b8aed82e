"""What can be built: the presets (a preprocessing model chained to a classifier,
served as one ensemble) and the options every model of a build shares."""

from __future__ import annotations

from dataclasses import dataclass

from tritonstack import cli, contract
from tritonstack.build import classifiers
from tritonstack.build.classifiers import Classifier
from tritonstack.objective import DEFAULT_OBJECTIVE_MS, MIN_QUEUED_STEP_INSTANCES, check_objective
from tritonstack.repository_files import DALI_MODEL_FILENAME, DALI_SCRIPT_FILENAME

DEVICES = ("cpu", "gpu")
FORMATS = (DALI_MODEL_FILENAME, DALI_SCRIPT_FILENAME)
PREPROCESSORS = ("dali", "python", contract.VIDEO_PREPROCESSOR, contract.REGIONS_PREPROCESSOR)
# The batch every ensemble's first step forms on the CPU (first_step_preferred_batches says why).
FIRST_STEP_BATCH = 4


@dataclass(frozen=True)
class FrameSampling:
    """Which frames of a clip a video preset classifies: `frames`, `stride` apart."""

    frames: int
    stride: int


# The option groups of `tritonstack build --help`.
ADMISSION = cli.Group("admission under overload (docs/reliability.md#overload)")
VIDEO = cli.Group(
    "video presets",
    "A clip per sample, decoded by DALI (VP8, VP9, MJPEG on the CPU; H.264, H.265, AV1 too with --device gpu); "
    "every frame kept is classified and answered, a row each, in order.",
)
REGIONS = cli.Group(
    "regions presets",
    "An image and its boxes (FP32 [N, 4]: x0, y0, x1, y1 in the image's pixels) per sample, decoded once; each "
    "box is cut, resized and center-cropped as a whole image would be, and answered with a row of probabilities, "
    "in order.",
)
AUDIO = cli.Group(
    "audio presets",
    "A clip per request (WAV, FLAC, OGG Vorbis or Opus; any rate and channels), decoded, downmixed and resampled "
    "to 16 kHz by DALI; Silero VAD scores each 32 ms frame and the answer is the clip's speech segments, as "
    "silero-vad's get_speech_timestamps gives them (docs/audio.md).",
)


@dataclass(frozen=True)
class BuildOptions:
    """What every model of a build shares; each field is a `tritonstack build` option.
    Thread and instance counts are fixed, not this machine's, so that the committed
    repository is the same everywhere."""

    device: str = cli.option(
        "cpu",
        "--device",
        choices=DEVICES,
        help="gpu: nvJPEG decoding (device=mixed, hw_decoder_load), resize and normalize on "
        "the GPU, KIND_GPU instances; serializes on a machine without a GPU",
    )
    format: str = cli.option(
        DALI_MODEL_FILENAME,
        "--format",
        choices=FORMATS,
        help="model.dali: the pipeline serialized now (the DALI version is recorded next to it); "
        "dali.py: the pipeline's source, serialized by the DALI backend at load",
    )
    max_batch_size: int = cli.option(
        32,
        "--max-batch-size",
        type=cli.positive_int,
        help="every model's max_batch_size, and the DALI pipeline's batch",
    )
    # Two (tritonstack.objective says why one is not enough under a latency objective);
    # each is a process of its own, a stub's memory.
    instances: int = cli.option(
        MIN_QUEUED_STEP_INSTANCES,
        "--instances",
        type=cli.positive_int,
        help="instances of each preprocessing model (and of the audio segments step), and of "
        "each classifier with --classifier-instances 0 (each one is a process on CPU machines; "
        "default %(default)s: docs/performance.md#thread-layout)",
    )
    # Two instances of one thread each spend less CPU per image than one of two threads
    # (no synchronization between the threads of one run), for a stub's memory more.
    classifier_instances: int = cli.option(
        2,
        "--classifier-instances",
        type=cli.non_negative_int,
        metavar="N",
        help="instances of each classifier (0: --instances; default 2, of one ONNX Runtime "
        "thread each: a CPU's cores split between instances, docs/performance.md#thread-layout)",
    )
    num_threads: int = cli.option(
        2,
        "--num-threads",
        type=cli.positive_int,
        help="DALI CPU worker threads per instance (default fixed, not this machine's cores, "
        "so the committed repository is the same everywhere)",
    )
    intra_op_threads: int = cli.option(
        1,
        "--intra-op-threads",
        type=cli.positive_int,
        help="ONNX Runtime threads per classifier instance, the intra_op_thread_count "
        "parameter, fixed like --num-threads",
    )
    max_queue_delay_us: int = cli.option(
        0, "--max-queue-delay-us", type=int, help="how long the dynamic batcher waits to fill a batch"
    )
    # ONNX Runtime's CPU rate per image is highest at batches of 4-8, and its arena keeps
    # the memory of the largest batch it ran (docs/performance.md).
    classifier_batch: int = cli.option(
        8,
        "--classifier-batch",
        type=cli.non_negative_int,
        metavar="N",
        help="on the CPU, the batch the classifier's dynamic batcher forms from queued "
        "requests (preferred_batch_size; 0: none): ONNX Runtime's best rate per image "
        "and a bounded arena. Requests of more images still run whole",
    )
    # No bound by default: on Triton 2.51, the CPU stack's server, refusals inside an
    # ensemble crash tritonserver (docs/reliability.md#overload); for releases with
    # the ensemble fixes of triton-inference-server/core#466.
    max_queue_size: int = cli.option(
        0,
        "--max-queue-size",
        type=cli.non_negative_int,
        metavar="N",
        group=ADMISSION,
        help="requests queued before an ensemble's first step beyond which a new one is refused at once "
        "(HTTP 503, gRPC UNAVAILABLE); 0: no bound",
    )
    latency_objective_ms: int = cli.option(
        DEFAULT_OBJECTIVE_MS,
        "--latency-objective-ms",
        type=cli.non_negative_int,
        metavar="MS",
        group=ADMISSION,
        help="answer within MS or refuse: each step refuses an interactive request that waited past its share of "
        "it (HTTP 503, gRPC UNAVAILABLE; a request's own shorter timeout wins; batch-priority requests wait up to "
        "30 s; default: %(default)s; 0: no ceiling; docs/reliability.md#latency-objective)",
    )
    # Off by default: load tests and the benchmark repeat their images, and would
    # measure the cache (docs/operations.md).
    response_cache: bool = cli.option(
        False,
        "--response-cache",
        help="enable Triton's response cache on the ensembles: a repeated upload is answered from the cache of "
        "a server started with `tritonstack serve --response-cache-mb N` (off by default; docs/operations.md)",
    )
    clip_frames: int = cli.option(
        8,
        "--clip-frames",
        type=cli.positive_int,
        metavar="N",
        group=VIDEO,
        help="frames kept per clip (the last one repeated when a clip is shorter); a request "
        "holds max_batch_size // N clips",
    )
    frame_stride: int = cli.option(
        4, "--frame-stride", type=cli.positive_int, metavar="N", group=VIDEO, help="distance between kept frames"
    )
    # DALI has no operator that cuts a varying number of regions: the pipeline has this
    # many slots (docs/building.md, Regions).
    max_boxes: int = cli.option(
        16,
        "--max-boxes",
        type=cli.positive_int,
        metavar="N",
        group=REGIONS,
        help="the most boxes an image may have (the pipeline's slots; each unused one costs a small "
        "resize); a request holds max_batch_size // N images",
    )
    max_audio_seconds: int = cli.option(
        300,
        "--max-audio-seconds",
        type=cli.positive_int,
        metavar="S",
        group=AUDIO,
        help="the longest clip a request may hold, read from its header before decoding (the VAD model's "
        "memory grows with the clip: about 1 MB a second)",
    )
    vad_threshold: float = cli.option(
        0.5, "--vad-threshold", type=float, metavar="P", group=AUDIO, help="speech probability a segment starts at"
    )
    min_speech_ms: int = cli.option(
        250, "--min-speech-ms", type=cli.non_negative_int, metavar="MS", group=AUDIO, help="shorter speech is dropped"
    )
    min_silence_ms: int = cli.option(
        100,
        "--min-silence-ms",
        type=cli.non_negative_int,
        metavar="MS",
        group=AUDIO,
        help="silence that ends a segment; shorter pauses stay inside it",
    )
    speech_pad_ms: int = cli.option(
        30, "--speech-pad-ms", type=cli.non_negative_int, metavar="MS", group=AUDIO, help="padding on each side"
    )
    max_speech_s: float = cli.option(
        0.0,
        "--max-speech-s",
        type=float,
        metavar="S",
        group=AUDIO,
        help="longer segments are cut at their longest silence (0: no limit)",
    )

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
            "max_audio_seconds",
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
        if not 0 < self.vad_threshold < 1:
            raise ValueError(f"vad_threshold must be between 0 and 1, not {self.vad_threshold}")
        for name in ("min_speech_ms", "min_silence_ms", "speech_pad_ms", "max_speech_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, not {getattr(self, name)}")
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
        """FIRST_STEP_BATCH whatever the classifier's batch (none where it has none).
        Under overload a step refuses what expired only when it forms its next batch, so
        smaller batches at the first step refuse sooner: 4 against 8, Triton's stock gRPC
        clients at 3x capacity, refusals at p99 518-557 against 599-612 ms and a lower
        answered p99 (2-core AMD EPYC); the capacity held. Fewer than 4 fall behind: one
        DALI run per image or two, at the first step's lower CPU priority, let its queue
        grow to seconds at 70 % load
        (docs/performance.md#a-classifier-batch-of-one-no-tail-shown-for-18--of-the-throughput)."""
        if not self.classifier_batch:
            return ()
        return self._preferred_below_max(FIRST_STEP_BATCH)

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

    def __post_init__(self):
        p = self.classifier.preprocessing
        if self.preprocessor == "python" and (p.layout, p.channel_order, p.resize, p.input_type) != (
            "NCHW",
            "rgb",
            "crop",
            "fp32",
        ):
            raise ValueError(
                "the python (Pillow) preprocessor serves NCHW RGB FP32 classifiers with a center crop: "
                "build the dali preprocessor for this one"
            )
        if self.preprocessor in (contract.VIDEO_PREPROCESSOR, contract.REGIONS_PREPROCESSOR) and (
            p.input_type != "fp32" or (self.video and p.channel_order != "rgb")
        ):
            raise ValueError(
                f"the {self.preprocessor} preprocessor gives FP32 images (RGB for video): "
                "build the dali preprocessor for this classifier"
            )

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
