"""Typed Triton model configurations: the one generator and the one parser of
config.pbtxt.

A config is built from the small dataclasses below, converted to Triton's own
`ModelConfig` protobuf message (shipped with tritonclient) and printed with
protobuf's text format. Nothing here is a string template: a misspelt field fails
when the message is built, not when the server loads the model. `read_config`
parses a config.pbtxt back into that message, and `repository_files.config_dict` gives
the JSON form Triton hands a backend, which the shared load rules (tritonstack.rules) take.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from tritonstack.pacing import CPU_SLOTS
from tritonstack.repository_files import CONFIG_FILENAME


@dataclass(frozen=True)
class Tensor:
    """One input or output. `dims` excludes the batch dimension when batching."""

    name: str
    dtype: str  # Triton's type name without the prefix: "UINT8", "FP32", ...
    dims: tuple[int, ...]
    allow_ragged_batch: bool = False
    label_filename: str | None = None
    # An image input's layout ("FORMAT_NCHW"): what Triton's example image clients
    # read to lay out the pixels they send.
    format: str | None = None

    def to_input(self) -> pb.ModelInput:
        message = pb.ModelInput(name=self.name, data_type=_data_type(self.dtype), dims=self.dims)
        message.allow_ragged_batch = self.allow_ragged_batch
        if self.format:
            message.format = pb.ModelInput.Format.Value(self.format)
        return message

    def to_output(self) -> pb.ModelOutput:
        message = pb.ModelOutput(name=self.name, data_type=_data_type(self.dtype), dims=self.dims)
        if self.label_filename:
            message.label_filename = self.label_filename
        return message


@dataclass(frozen=True)
class QueuePolicy:
    """Triton's default_queue_policy with timeout_action REJECT: a request that finds
    `max_queue_size` requests queued is refused at once (0: no bound), and one still
    queued after `timeout_us` (0: never) is refused then. With
    `allow_timeout_override`, a request's own `timeout` parameter applies when shorter
    (Triton ignores it while the default is 0)."""

    max_queue_size: int = 0
    timeout_us: int = 0
    allow_timeout_override: bool = True

    def to_proto(self) -> pb.ModelQueuePolicy:
        return pb.ModelQueuePolicy(
            timeout_action=pb.ModelQueuePolicy.REJECT,
            default_timeout_microseconds=self.timeout_us,
            allow_timeout_override=self.allow_timeout_override,
            max_queue_size=self.max_queue_size,
        )


@dataclass(frozen=True)
class DynamicBatching:
    max_queue_delay_us: int = 0
    preferred_batch_sizes: tuple[int, ...] = ()
    queue_policy: QueuePolicy | None = None
    # Triton's priority levels (0: none); a request naming no priority gets the default
    # level, and `queue_policy`, unless its level has a policy of its own.
    priority_levels: int = 0
    default_priority_level: int = 0
    level_policies: tuple[tuple[int, QueuePolicy], ...] = ()

    def to_proto(self) -> pb.ModelDynamicBatching:
        message = pb.ModelDynamicBatching(
            max_queue_delay_microseconds=self.max_queue_delay_us,
            preferred_batch_size=self.preferred_batch_sizes,
            priority_levels=self.priority_levels,
            default_priority_level=self.default_priority_level,
        )
        if self.queue_policy is not None:
            message.default_queue_policy.CopyFrom(self.queue_policy.to_proto())
        for level, policy in self.level_policies:
            message.priority_queue_policy[level].CopyFrom(policy.to_proto())
        return message


@dataclass(frozen=True)
class InstanceGroup:
    count: int = 1
    kind: str = "KIND_CPU"  # or "KIND_GPU"
    gpus: tuple[int, ...] = ()
    # The rate limiter's slots an instance holds while it runs (tritonstack.pacing); 0: none.
    cpu_slots: int = 0

    def to_proto(self) -> pb.ModelInstanceGroup:
        group = pb.ModelInstanceGroup(
            count=self.count,
            kind=pb.ModelInstanceGroup.Kind.Value(self.kind),
            gpus=self.gpus,
        )
        if self.cpu_slots:
            group.rate_limiter.resources.add(name=CPU_SLOTS, count=self.cpu_slots, **{"global": True})
        return group


@dataclass(frozen=True)
class EnsembleStep:
    """One model in an ensemble. Maps are {step model tensor: ensemble tensor}."""

    model_name: str
    input_map: dict[str, str]
    output_map: dict[str, str]
    model_version: int = -1

    def to_proto(self) -> pb.ModelEnsembling.Step:
        return pb.ModelEnsembling.Step(
            model_name=self.model_name,
            model_version=self.model_version,
            input_map=self.input_map,
            output_map=self.output_map,
        )


@dataclass(frozen=True)
class WarmupInput:
    """A warmup tensor read from a file in the model's `warmup/` folder, or zeros
    (`zero_data=True`, no file) where any value is valid input."""

    name: str
    dtype: str
    dims: tuple[int, ...]
    data_file: str = ""
    zero_data: bool = False

    def to_proto(self) -> pb.ModelWarmup.Input:
        message = pb.ModelWarmup.Input(data_type=_data_type(self.dtype), dims=self.dims)
        if self.zero_data:
            message.zero_data = True
        else:
            message.input_data_file = self.data_file
        return message


@dataclass(frozen=True)
class Warmup:
    name: str
    batch_size: int
    inputs: tuple[WarmupInput, ...]

    def to_proto(self) -> pb.ModelWarmup:
        return pb.ModelWarmup(
            name=self.name,
            batch_size=self.batch_size,
            inputs={tensor.name: tensor.to_proto() for tensor in self.inputs},
        )


@dataclass(frozen=True)
class Accelerator:
    """An execution accelerator of the ONNX Runtime backend, e.g. TensorRT on a GPU."""

    name: str  # "tensorrt", "openvino", ...
    parameters: dict[str, str] = field(default_factory=dict)

    def to_proto(self) -> pb.ModelOptimizationPolicy.ExecutionAccelerators.Accelerator:
        return pb.ModelOptimizationPolicy.ExecutionAccelerators.Accelerator(name=self.name, parameters=self.parameters)


# TensorRT through ONNX Runtime in FP16, the documented starting point for the
# onnxruntime backend on NVIDIA GPUs (engines are built at load, then cached).
TENSORRT_FP16 = Accelerator("tensorrt", {"precision_mode": "FP16", "max_workspace_size_bytes": str(1 << 30)})


@dataclass(frozen=True)
class ModelConfig:
    """A model's config.pbtxt. Give `backend` for a model, `platform="ensemble"`
    with `steps` for an ensemble."""

    name: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    backend: str | None = None
    platform: str | None = None
    # 0: unbatched, written out (backends that auto-complete, like the C++ DALI
    # backend, read an absent max_batch_size as "fill it in"); None: not stated.
    max_batch_size: int | None = 0
    dynamic_batching: DynamicBatching | None = None
    instance_groups: tuple[InstanceGroup, ...] = ()
    parameters: dict[str, str] = field(default_factory=dict)
    steps: tuple[EnsembleStep, ...] = ()
    warmup: tuple[Warmup, ...] = ()
    default_model_filename: str | None = None
    gpu_accelerators: tuple[Accelerator, ...] = ()
    # Triton's response cache for this model (served only with a cache: `serve --response-cache-mb`).
    response_cache: bool = False

    def to_proto(self) -> pb.ModelConfig:
        message = pb.ModelConfig(
            name=self.name,
            max_batch_size=self.max_batch_size or 0,
            input=[tensor.to_input() for tensor in self.inputs],
            output=[tensor.to_output() for tensor in self.outputs],
            instance_group=[group.to_proto() for group in self.instance_groups],
            model_warmup=[warmup.to_proto() for warmup in self.warmup],
        )
        if self.backend:
            message.backend = self.backend
        if self.default_model_filename:
            message.default_model_filename = self.default_model_filename
        if self.platform:
            message.platform = self.platform
        if self.dynamic_batching:
            message.dynamic_batching.CopyFrom(self.dynamic_batching.to_proto())
        for key, value in self.parameters.items():
            message.parameters[key].string_value = value
        if self.steps:
            message.ensemble_scheduling.step.extend(step.to_proto() for step in self.steps)
        if self.response_cache:
            message.response_cache.enable = True
        if self.gpu_accelerators:
            message.optimization.execution_accelerators.gpu_execution_accelerator.extend(
                accelerator.to_proto() for accelerator in self.gpu_accelerators
            )
        return message

    def to_pbtxt(self) -> str:
        text = text_format.MessageToString(self.to_proto())
        if self.max_batch_size == 0:  # protobuf text leaves a zero out
            name, _, rest = text.partition("\n")
            text = f"{name}\nmax_batch_size: 0\n{rest}" if self.name else f"max_batch_size: 0\n{text}"
        return text


def write_config(model_dir: Path, config: pb.ModelConfig) -> None:
    """Write a ModelConfig (one read_config gave, then edited) back as the folder's
    config.pbtxt. Protobuf text leaves fields at zero out, as the parser read them."""
    (Path(model_dir) / CONFIG_FILENAME).write_text(text_format.MessageToString(config))


def _data_type(name: str) -> int:
    return pb.DataType.Value(f"TYPE_{name}")
