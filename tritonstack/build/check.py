"""Validate a Triton model repository offline, with the rules the backends apply
when the server loads it, so that a repository that would fail there fails here.

Each problem is one line: the model, the config field, the tensor, what is wrong
and what to do.

- every model folder has a config.pbtxt that parses, a version folder and the
  files its backend needs (model.dali or dali.py, model.onnx, model.py);
- labels: one line per class of the output they label;
- warmup: data files exist, have the declared size, and images decode;
- DALI and ONNX models: the backends' own load rules (tritonstack.rules), the
  pipeline read from model.dali (tritonstack.rules.dali_proto) or the graph from
  model.onnx; CPU pipelines are also run on a real JPEG, so that output types and
  ranks the pipeline does not declare are checked too;
- ensembles: every step's model exists; input_map/output_map keys are tensors of
  the step's model; types and dims agree along the chain; every ensemble output is
  produced; max_batch_size is not above a step's.
"""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as pb

from tritonstack.build.check_ensemble import check_ensemble
from tritonstack.contract import DALI_TO_TRITON, TRITON_TO_NUMPY
from tritonstack.media import video_header
from tritonstack.media.audio_header import AUDIO_MAGIC, AudioHeaderError, read_audio_header
from tritonstack.media.decode_budget import BudgetError, DecodeBudget
from tritonstack.repository_files import (
    CONFIG_FILENAME,
    DALI_FOLDER_SUFFIX,
    DALI_MODEL_FILENAME,
    MODEL_FILES,
    ONNX_MODEL_FILENAME,
    WARMUP_DIR,
    ConfigError,
    config_dict,
    read_config,
    version_dirs,
)
from tritonstack.rules import dali as dali_rules
from tritonstack.rules import dali_proto
from tritonstack.rules import onnxruntime as onnx_rules
from tritonstack.rules.common import Problem, invalid_filename, stated_max_batch_size
from tritonstack.rules.dali_errors import meaningful_lines
from tritonstack.rules.unbuilt import BUILD_FIX
from tritonstack.samples.photos import sample_jpeg


def check_repository(repository: Path) -> list[Problem]:
    repository = Path(repository)
    if not repository.is_dir():
        return [Problem(str(repository), "repository", "", "is not a folder", "give the model repository's path")]
    configs: dict[str, pb.ModelConfig] = {}
    problems: list[Problem] = []
    for model_dir in sorted(p for p in repository.iterdir() if p.is_dir() and not p.name.startswith(".")):
        config, found = _read_config(model_dir)
        problems += found
        if config is not None:
            configs[model_dir.name] = config
    for name, config in configs.items():
        model_dir = repository / name
        problems += _check_files(model_dir, config)
        problems += _check_labels(model_dir, config)
        problems += _check_warmup(model_dir, config)
        if config.backend in ("dali", "python"):
            problems += _check_decode_budget(model_dir, config)
        if config.backend == "dali":
            problems += _check_dali(model_dir, config)
        elif config.backend == "onnxruntime":
            problems += _check_onnx(model_dir, config)
        elif config.platform == "ensemble":
            problems += check_ensemble(config, configs)
    return problems


def _read_config(model_dir: Path) -> tuple[pb.ModelConfig | None, list[Problem]]:
    if not (model_dir / CONFIG_FILENAME).exists():
        if model_dir.name.endswith(DALI_FOLDER_SUFFIX):  # the dali backend completes it at load
            return None, []
        return None, [
            Problem(
                model_dir.name,
                CONFIG_FILENAME,
                "",
                "missing (the server refuses to start with a model folder without one)",
                "build the model or remove the folder",
            )
        ]
    try:
        config = read_config(model_dir)
    except ConfigError as error:
        return None, [
            Problem(
                model_dir.name,
                CONFIG_FILENAME,
                "",
                f"does not parse: {error}",
                "fix the protobuf text (or rebuild it with build_pipelines.py)",
            )
        ]
    if config.name and config.name != model_dir.name:
        return config, [
            Problem(
                model_dir.name,
                "name",
                config.name,
                "differs from the folder name",
                f'rename the folder or set name: "{model_dir.name}"',
            )
        ]
    return config, []


def _check_files(model_dir: Path, config: pb.ModelConfig) -> list[Problem]:
    versions = version_dirs(model_dir)
    if not versions:
        return [
            Problem(
                model_dir.name,
                "version folder",
                "",
                "no numeric version folder (e.g. 1/)",
                "create <model>/1/ with the model file in it, or " + BUILD_FIX,
            )
        ]
    refusal = invalid_filename(config.default_model_filename) if config.default_model_filename else None
    if refusal:
        return [
            Problem(
                model_dir.name,
                "default_model_filename",
                "",
                refusal.replace("\n", "; "),
                "rename the model file with those characters only",
            )
        ]
    kind = "ensemble" if config.platform == "ensemble" else config.backend
    expected = (config.default_model_filename,) if config.default_model_filename else MODEL_FILES.get(kind, ())
    if not expected:
        return []
    return [
        Problem(
            model_dir.name, "model file", version.name, f"none of {', '.join(expected)} in {version.name}/", BUILD_FIX
        )
        for version in versions
        if not any((version / name).exists() for name in expected)
    ]


def _check_labels(model_dir: Path, config: pb.ModelConfig) -> list[Problem]:
    problems = []
    for output in config.output:
        if not output.label_filename:
            continue
        path = model_dir / output.label_filename
        if not path.exists():
            problems.append(
                Problem(
                    model_dir.name,
                    "output.label_filename",
                    output.name,
                    f"{output.label_filename} is missing",
                    "add the label file next to config.pbtxt",
                )
            )
            continue
        lines = len(path.read_text().splitlines())
        classes = output.dims[-1] if output.dims else 0
        if lines != classes:
            problems.append(
                Problem(
                    model_dir.name,
                    "output.label_filename",
                    output.name,
                    f"{output.label_filename} has {lines} lines but the output has {classes} classes",
                    "give exactly one label a line, in class index order",
                )
            )
    return problems


def _check_warmup(model_dir: Path, config: pb.ModelConfig) -> list[Problem]:
    problems = []
    for warmup in config.model_warmup:
        for name, tensor in warmup.inputs.items():
            if not tensor.input_data_file:
                continue
            path = model_dir / WARMUP_DIR / tensor.input_data_file
            field = f"model_warmup[{warmup.name}].inputs"
            if not path.exists():
                problems.append(
                    Problem(
                        model_dir.name,
                        field,
                        name,
                        f"warmup/{tensor.input_data_file} is missing",
                        "add the file, or rebuild",
                    )
                )
                continue
            size = int(np.prod(tensor.dims)) * np.dtype(TRITON_TO_NUMPY[pb.DataType.Name(tensor.data_type)]).itemsize
            if path.stat().st_size != size:
                problems.append(
                    Problem(
                        model_dir.name,
                        field,
                        name,
                        f"warmup/{tensor.input_data_file} has {path.stat().st_size} bytes, dims "
                        f"{list(tensor.dims)} need {size}",
                        "set dims to the file's size",
                    )
                )
            elif config.backend in ("dali", "python") and tensor.data_type == pb.TYPE_UINT8:
                problems += _check_warmup_sample(model_dir.name, field, name, path, _instance_kinds(config))
    return problems


def _check_warmup_sample(model: str, field: str, name: str, path: Path, kinds: set[str]) -> list[Problem]:
    """A clip the model's video decoder reads (the CPU's codecs unless every instance
    is on a GPU), audio its audio decoder reads, or an image Pillow decodes."""
    data = path.read_bytes()
    if data[:4] in AUDIO_MAGIC:
        try:
            read_audio_header(data)
        except AudioHeaderError as error:
            return [
                Problem(
                    model,
                    field,
                    name,
                    f"warmup/{path.name}: {error}: the model would fail its warmup and not load",
                    "use a clip the decoder reads",
                )
            ]
        return []
    if video_header.read_header(data) is not None:
        codecs = video_header.GPU_CODECS if kinds == {"KIND_GPU"} else video_header.CPU_CODECS
        reason = video_header.unreadable_reason(data, codecs)
        if reason:
            return [
                Problem(
                    model,
                    field,
                    name,
                    f"warmup/{path.name}: {reason}: the model would fail its warmup and not load",
                    "use a clip the decoder reads",
                )
            ]
        return []
    if not _decodes(data):
        return [
            Problem(
                model,
                field,
                name,
                f"warmup/{path.name} is not a decodable image: the model would fail its warmup and not load",
                "use a real encoded JPEG or PNG",
            )
        ]
    return []


def _check_decode_budget(model_dir: Path, config: pb.ModelConfig) -> list[Problem]:
    """The budget the backend will apply (tritonstack.media.decode_budget): valid, and
    not refusing the model's own warmup images."""
    fix = "set max_pixels <= max_request_pixels <= max_batch_pixels, positive integers (or leave them out)"
    try:
        budget = DecodeBudget.from_parameters(config_dict(config).get("parameters", {}))
    except ValueError as error:
        return [Problem(model_dir.name, "parameters", "", f"decode budget: {error}", fix)]
    problems = [
        Problem(model_dir.name, "parameters", "", f"decode budget: {problem}", fix) for problem in budget.problems()
    ]
    for warmup in config.model_warmup:
        for name, tensor in warmup.inputs.items():
            path = model_dir / WARMUP_DIR / tensor.input_data_file
            if tensor.input_data_file and tensor.data_type == pb.TYPE_UINT8 and path.is_file():
                try:
                    budget.request_pixels([path.read_bytes()], name)
                except BudgetError as error:
                    problems.append(
                        Problem(
                            model_dir.name,
                            f"model_warmup[{warmup.name}].inputs",
                            name,
                            str(error),
                            "raise the budget or use a smaller warmup image",
                        )
                    )
    return problems


def _decodes(data: bytes) -> bool:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
        return True
    except Exception:  # Pillow raises many types for undecodable data
        return False


def _instance_kinds(config: pb.ModelConfig) -> set[str]:
    return {pb.ModelInstanceGroup.Kind.Name(group.kind) for group in config.instance_group} or {"KIND_AUTO"}


def _check_dali(model_dir: Path, config: pb.ModelConfig) -> list[Problem]:
    filename = config.default_model_filename or DALI_MODEL_FILENAME
    serialized_path = next((v / filename for v in version_dirs(model_dir) if (v / filename).exists()), None)
    if serialized_path is None:
        return []  # dali.py: serialized by the backend at load; missing files reported already
    try:
        spec = dali_proto.parse_pipeline(serialized_path.read_bytes())
    except ValueError as error:
        return [
            Problem(
                model_dir.name,
                filename,
                "",
                f"is not a serialized DALI pipeline ({error})",
                "rebuild it with build_pipelines.py build",
            )
        ]
    kinds = _instance_kinds(config)
    # A real JPEG is fed only where every input is an encoded image (feeds a decoder):
    # any other pipeline would fail on it for no fault of its own.
    runs_here = not spec.gpu_operators and kinds == {"KIND_CPU"} and set(spec.input_names) <= spec.decoded_inputs
    if runs_here:  # what the pipeline does not declare, learnt from running it
        spec, failure = _observed(model_dir.name, spec, config, serialized_path.read_bytes())
        if failure:
            return [failure]
    # Complete the config as the backend will (the C++ backend's merge), the
    # pipeline's batch size filling a missing max_batch_size.
    stated = stated_max_batch_size((model_dir / CONFIG_FILENAME).read_text())
    as_dict, problems = dali_rules.dali_autocomplete(
        _named_dict(model_dir, config), spec, spec.max_batch_size or 1, stated
    )
    problems += [problem for kind in sorted(kinds) for problem in dali_rules.dali_problems(as_dict, spec, kind)]
    return list(dict.fromkeys(problems))  # one line per problem, whatever the instance groups


def _observed(
    name: str, spec: dali_proto.PipelineSpec, config: pb.ModelConfig, serialized: bytes
) -> tuple[dali_proto.PipelineSpec, Problem | None]:
    """Run the CPU pipeline on one real JPEG per input: its outputs' types and
    ranks, where the serialized pipeline leaves them undeclared."""
    from nvidia.dali import Pipeline

    try:
        pipeline = Pipeline.deserialize(
            serialized_pipeline=serialized, batch_size=1, num_threads=1, device_id=None, prefetch_queue_depth=1
        )
        pipeline.build()
        for port in spec.inputs:
            pipeline.feed_input(port.name, [np.frombuffer(sample_jpeg(), np.uint8)])
        outputs = pipeline.run()
    except RuntimeError as error:
        return spec, Problem(
            name,
            DALI_MODEL_FILENAME,
            "",
            f"fails on a real JPEG: {_first_cause(error)}",
            "fix the pipeline and rebuild",
        )
    ports = tuple(
        replace(
            port,
            dtype=port.dtype or DALI_TO_TRITON.get(int(output.dtype)),
            ndim=port.ndim if port.ndim is not None else len(output.as_array().shape) - 1,
        )
        for port, output in zip(spec.outputs, outputs)
    )
    return replace(spec, outputs=ports), None


def _first_cause(error: RuntimeError) -> str:
    """DALI's first line that says something."""
    lines = meaningful_lines(error)
    return lines[0] if lines else str(error)


def _check_onnx(model_dir: Path, config: pb.ModelConfig) -> list[Problem]:
    filename = config.default_model_filename or ONNX_MODEL_FILENAME
    path = next((v / filename for v in version_dirs(model_dir) if (v / filename).exists()), None)
    if path is None:
        return []
    inputs, outputs = onnx_rules.graph_io(path)
    as_dict, problems = onnx_rules.onnx_autocomplete(
        _named_dict(model_dir, config), inputs, outputs
    )  # as the backend will
    return problems + onnx_rules.onnx_problems(as_dict, inputs, outputs)


def _named_dict(model_dir: Path, config: pb.ModelConfig) -> dict:
    """The config as a backend receives it: Triton names a model after its folder."""
    return {"name": model_dir.name, **config_dict(config)}
