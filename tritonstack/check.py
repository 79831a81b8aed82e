"""Validate a Triton model repository offline, with the rules the backends apply
when the server loads it, so that a repository that would fail there fails here.

Each problem is one line: the model, the config field, the tensor, what is wrong
and what to do.

- every model folder has a config.pbtxt that parses, a version folder and the
  files its backend needs (model.dali or dali.py, model.onnx, model.py);
- labels: one line per class of the output they label;
- warmup: data files exist, have the declared size, and images decode;
- DALI: config inputs are the pipeline's external sources and outputs as many as
  the pipeline's; GPU operators are not on KIND_CPU instances; CPU pipelines are
  run on a real JPEG and their output types and ranks compared with the config;
- ONNX: config tensors are the graph's inputs and outputs, with the same types
  and ranks;
- ensembles: every step's model exists; input_map/output_map keys are tensors of
  the step's model; types and dims agree along the chain; every ensemble output is
  produced; max_batch_size is not above a step's.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from tritonstack.model_config import CONFIG_FILENAME

DEFAULT_FILES = {"dali": ("model.dali", "dali.py"), "onnxruntime": ("model.onnx",), "python": ("model.py",)}
_NUMPY_TYPES = {"BOOL": np.bool_, "UINT8": np.uint8, "INT8": np.int8, "INT16": np.int16,
                "INT32": np.int32, "INT64": np.int64, "UINT16": np.uint16, "UINT32": np.uint32,
                "UINT64": np.uint64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64}
# DALI's DALIDataType values for the types a pipeline output can have here.
_DALI_TYPES = {"UINT8": "UINT8", "INT16": "INT16", "INT32": "INT32", "INT64": "INT64",
               "FLOAT": "FP32", "FLOAT16": "FP16", "FLOAT64": "FP64", "BOOL": "BOOL"}
_ONNX_TYPES = {1: "FP32", 2: "UINT8", 3: "INT8", 5: "INT16", 6: "INT32", 7: "INT64", 9: "BOOL",
               10: "FP16", 11: "FP64"}


@dataclass(frozen=True)
class Problem:
    model: str
    field: str
    tensor: str
    message: str
    fix: str

    def __str__(self) -> str:
        where = f"{self.field} {self.tensor!r}" if self.tensor else self.field
        return f"{self.model}: {where}: {self.message}; {self.fix}"


def type_name(data_type: int) -> str:
    return pb.DataType.Name(data_type).removeprefix("TYPE_")


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
        if config.backend == "dali":
            problems += _check_dali(model_dir, config)
        elif config.backend == "onnxruntime":
            problems += _check_onnx(model_dir, config)
        elif config.platform == "ensemble":
            problems += _check_ensemble(config, configs)
    return problems


def _read_config(model_dir: Path) -> tuple[pb.ModelConfig | None, list[Problem]]:
    path = model_dir / CONFIG_FILENAME
    if not path.exists():
        return None, [Problem(model_dir.name, CONFIG_FILENAME, "", "missing (the server refuses to start "
                              "with a model folder without one)", "build the model or remove the folder")]
    try:
        config = text_format.Parse(path.read_text(), pb.ModelConfig())
    except text_format.ParseError as error:
        return None, [Problem(model_dir.name, CONFIG_FILENAME, "", f"does not parse: {error}",
                              "fix the protobuf text (or rebuild it with build_pipelines.py)")]
    if config.name and config.name != model_dir.name:
        return config, [Problem(model_dir.name, "name", config.name, "differs from the folder name",
                                f"rename the folder or set name: \"{model_dir.name}\"")]
    return config, []


def _version_dirs(model_dir: Path) -> list[Path]:
    return sorted(p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())


def _check_files(model_dir: Path, config: pb.ModelConfig) -> list[Problem]:
    versions = _version_dirs(model_dir)
    if not versions:
        return [Problem(model_dir.name, "version folder", "", "no numeric version folder (e.g. 1/)",
                        "create <model>/1/ with the model file in it")]
    kind = "ensemble" if config.platform == "ensemble" else config.backend
    expected = (config.default_model_filename,) if config.default_model_filename else DEFAULT_FILES.get(kind, ())
    if not expected:
        return []
    return [
        Problem(model_dir.name, "model file", version.name, f"none of {', '.join(expected)} in {version.name}/",
                "run build_pipelines.py build (model.onnx is a build output)")
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
            problems.append(Problem(model_dir.name, "output.label_filename", output.name,
                                    f"{output.label_filename} is missing", "add the label file next to config.pbtxt"))
            continue
        lines = len(path.read_text().splitlines())
        classes = output.dims[-1] if output.dims else 0
        if lines != classes:
            problems.append(Problem(model_dir.name, "output.label_filename", output.name,
                                    f"{output.label_filename} has {lines} lines but the output has {classes} classes",
                                    "give exactly one label a line, in class index order"))
    return problems


def _check_warmup(model_dir: Path, config: pb.ModelConfig) -> list[Problem]:
    problems = []
    for warmup in config.model_warmup:
        for name, tensor in warmup.inputs.items():
            if not tensor.input_data_file:
                continue
            path = model_dir / "warmup" / tensor.input_data_file
            field = f"model_warmup[{warmup.name}].inputs"
            if not path.exists():
                problems.append(Problem(model_dir.name, field, name, f"warmup/{tensor.input_data_file} is missing",
                                        "add the file, or rebuild"))
                continue
            size = int(np.prod(tensor.dims)) * np.dtype(_NUMPY_TYPES[type_name(tensor.data_type)]).itemsize
            if path.stat().st_size != size:
                problems.append(Problem(model_dir.name, field, name,
                                        f"warmup/{tensor.input_data_file} has {path.stat().st_size} bytes, dims "
                                        f"{list(tensor.dims)} need {size}", "set dims to the file's size"))
            elif config.backend in ("dali", "python") and tensor.data_type == pb.TYPE_UINT8 and not _decodes(path):
                problems.append(Problem(model_dir.name, field, name,
                                        f"warmup/{tensor.input_data_file} is not a decodable image: the model "
                                        "would fail its warmup and not load", "use a real encoded JPEG or PNG"))
    return problems


def _decodes(path: Path) -> bool:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(path.read_bytes())) as image:
            image.load()
        return True
    except Exception:  # Pillow raises many types for undecodable data
        return False


def _check_dali(model_dir: Path, config: pb.ModelConfig) -> list[Problem]:
    from tritonstack import dali_proto

    versions = _version_dirs(model_dir)
    serialized_path = next((v / "model.dali" for v in versions if (v / "model.dali").exists()), None)
    if serialized_path is None:
        return []  # dali.py: serialized by the backend at load; missing files reported already
    name = model_dir.name
    try:
        pipeline = dali_proto.parse_pipeline(serialized_path.read_bytes())
    except ValueError as error:
        return [Problem(name, "model.dali", "", f"is not a serialized DALI pipeline ({error})",
                        "rebuild it with build_pipelines.py build")]
    problems = []
    config_inputs = [tensor.name for tensor in config.input]
    for missing in sorted(set(pipeline.input_names) - set(config_inputs)):
        problems.append(Problem(name, "input", missing, "the pipeline's external source has no config input",
                                f"add an input named {missing!r} (config inputs: {', '.join(config_inputs)})"))
    for unknown in sorted(set(config_inputs) - set(pipeline.input_names)):
        problems.append(Problem(name, "input", unknown, "no external source of the pipeline has this name",
                                f"rename it to one of {', '.join(pipeline.input_names) or 'none'}"))
    if len(pipeline.outputs) != len(config.output):
        problems.append(Problem(name, "output", ",".join(t.name for t in config.output),
                                f"config has {len(config.output)} outputs, the pipeline {len(pipeline.outputs)}",
                                "declare one config output per pipeline output, in order"))
    gpu_kinds = {pb.ModelInstanceGroup.KIND_GPU, pb.ModelInstanceGroup.KIND_AUTO}
    on_cpu = any(group.kind == pb.ModelInstanceGroup.KIND_CPU for group in config.instance_group)
    if pipeline.gpu_operators and on_cpu:
        problems.append(Problem(name, "instance_group", "",
                                f"KIND_CPU instances cannot run GPU operators {', '.join(pipeline.gpu_operators)}",
                                "use KIND_GPU, or build with --device cpu"))
    if not problems and not pipeline.gpu_operators and not any(g.kind in gpu_kinds for g in config.instance_group):
        problems += _check_dali_outputs(name, config, serialized_path.read_bytes())
    return problems


def _check_dali_outputs(name: str, config: pb.ModelConfig, serialized: bytes) -> list[Problem]:
    """Run the CPU pipeline on one real JPEG per input: output types and ranks."""
    from nvidia.dali import Pipeline

    from tritonstack.repository import warmup_sample

    try:
        pipeline = Pipeline.deserialize(serialized_pipeline=serialized, batch_size=1, num_threads=1,
                                        device_id=None, prefetch_queue_depth=1)
        pipeline.build()
        for tensor in config.input:
            pipeline.feed_input(tensor.name, [np.frombuffer(warmup_sample(), np.uint8)])
        outputs = pipeline.run()
    except RuntimeError as error:
        return [Problem(name, "model.dali", "", f"fails on a real JPEG: {str(error).splitlines()[0]}",
                        "fix the pipeline and rebuild")]
    problems = []
    for tensor, output in zip(config.output, outputs):
        produced = _DALI_TYPES.get(str(output.dtype).rsplit(".", 1)[-1], str(output.dtype))
        if produced != type_name(tensor.data_type):
            problems.append(Problem(name, "output.data_type", tensor.name,
                                    f"config says {type_name(tensor.data_type)}, the pipeline gives {produced}",
                                    f"set data_type: TYPE_{produced}"))
        rank = len(output.as_array().shape) - 1
        if rank != len(tensor.dims):
            problems.append(Problem(name, "output.dims", tensor.name,
                                    f"config has rank {len(tensor.dims)} {list(tensor.dims)}, the pipeline "
                                    f"gives rank {rank}", f"give dims {rank} values (-1 where they vary)"))
    return problems


def _check_onnx(model_dir: Path, config: pb.ModelConfig) -> list[Problem]:
    import onnx

    versions = _version_dirs(model_dir)
    filename = config.default_model_filename or "model.onnx"
    path = next((v / filename for v in versions if (v / filename).exists()), None)
    if path is None:
        return []
    graph = onnx.load(str(path), load_external_data=False).graph
    initializers = {t.name for t in graph.initializer}
    batch_dims = 1 if config.max_batch_size > 0 else 0
    problems = []
    for field, tensors, graph_tensors in (
        ("input", config.input, [t for t in graph.input if t.name not in initializers]),
        ("output", config.output, list(graph.output)),
    ):
        by_name = {t.name: t for t in graph_tensors}
        for tensor in tensors:
            found = by_name.get(tensor.name)
            if found is None:
                problems.append(Problem(model_dir.name, field, tensor.name, f"not an {field} of {filename}",
                                        f"use one of {', '.join(by_name)}"))
                continue
            onnx_type = _ONNX_TYPES.get(found.type.tensor_type.elem_type, str(found.type.tensor_type.elem_type))
            if onnx_type != type_name(tensor.data_type):
                problems.append(Problem(model_dir.name, f"{field}.data_type", tensor.name,
                                        f"config says {type_name(tensor.data_type)}, the graph {onnx_type}",
                                        f"set data_type: TYPE_{onnx_type}"))
            rank = len(found.type.tensor_type.shape.dim) - batch_dims
            if rank != len(tensor.dims):
                problems.append(Problem(model_dir.name, f"{field}.dims", tensor.name,
                                        f"config has rank {len(tensor.dims)}, the graph {rank} (batch excluded)",
                                        "make dims match the graph's shape without its batch axis"))
    return problems


def _dims_agree(a, b) -> bool:
    return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b))


def _check_ensemble(config: pb.ModelConfig, configs: dict[str, pb.ModelConfig]) -> list[Problem]:
    name = config.name
    # ensemble tensor -> (data_type, dims) as known so far
    known = {t.name: (t.data_type, list(t.dims)) for t in config.input}
    produced: dict[str, tuple[int, list[int]]] = {}
    problems = []
    steps = list(config.ensemble_scheduling.step)
    for index, step in enumerate(steps):
        field = f"ensemble_scheduling.step[{index}]"
        model = configs.get(step.model_name)
        if model is None:
            problems.append(Problem(name, f"{field}.model_name", step.model_name, "no such model in the repository",
                                    f"build it or use one of {', '.join(sorted(configs))}"))
            continue
        if config.max_batch_size > model.max_batch_size or (config.max_batch_size > 0) != (model.max_batch_size > 0):
            problems.append(Problem(name, "max_batch_size", step.model_name,
                                    f"ensemble has {config.max_batch_size}, step model {model.max_batch_size}",
                                    "make the ensemble's max_batch_size at most every step's, both > 0 or both 0"))
        model_inputs = {t.name: t for t in model.input}
        model_outputs = {t.name: t for t in model.output}
        for model_tensor, ensemble_tensor in step.input_map.items():
            target = model_inputs.get(model_tensor)
            if target is None:
                problems.append(Problem(name, f"{field}.input_map", model_tensor,
                                        f"not an input of {step.model_name}",
                                        f"map one of its inputs: {', '.join(model_inputs)}"))
                continue
            source = known.get(ensemble_tensor) or _produced_later(ensemble_tensor, steps, configs)
            if source is None:
                problems.append(Problem(name, f"{field}.input_map", ensemble_tensor,
                                        "no ensemble input or step output has this name",
                                        "map an ensemble input or another step's output to it"))
            elif source[0] != target.data_type or not _dims_agree(source[1], list(target.dims)):
                problems.append(Problem(name, f"{field}.input_map", ensemble_tensor,
                                        f"is {type_name(source[0])} {source[1]} but {step.model_name} input "
                                        f"{model_tensor!r} takes {type_name(target.data_type)} {list(target.dims)}",
                                        "make the types and dims agree along the chain"))
        for model_tensor, ensemble_tensor in step.output_map.items():
            origin = model_outputs.get(model_tensor)
            if origin is None:
                problems.append(Problem(name, f"{field}.output_map", model_tensor,
                                        f"not an output of {step.model_name}",
                                        f"map one of its outputs: {', '.join(model_outputs)}"))
                continue
            known[ensemble_tensor] = produced[ensemble_tensor] = (origin.data_type, list(origin.dims))
    if any(step.model_name not in configs for step in steps):
        return problems  # its outputs are unknown: do not report them as unproduced too
    for output in config.output:
        source = produced.get(output.name)
        if source is None:
            problems.append(Problem(name, "output", output.name, "no step's output_map produces it",
                                    "map a step output to it"))
        elif source[0] != output.data_type or not _dims_agree(source[1], list(output.dims)):
            problems.append(Problem(name, "output", output.name,
                                    f"declared {type_name(output.data_type)} {list(output.dims)}, the step gives "
                                    f"{type_name(source[0])} {source[1]}", "make them agree"))
    return problems


def _produced_later(tensor: str, steps, configs) -> tuple[int, list[int]] | None:
    """Steps may be listed in any order: a tensor an earlier-listed step consumes
    may come from a later-listed one."""
    for step in steps:
        model = configs.get(step.model_name)
        for model_tensor, ensemble_tensor in step.output_map.items():
            if ensemble_tensor == tensor and model is not None:
                for output in model.output:
                    if output.name == model_tensor:
                        return output.data_type, list(output.dims)
    return None
