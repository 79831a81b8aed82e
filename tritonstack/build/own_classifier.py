"""Bring your own classifier: an ONNX file as another framework exported it, served
with the preprocessing it was trained with.

    options = OwnClassifierOptions(onnx=Path("mobilenet.onnx"), labels=Path("labels.txt"), scale=(-1, 1))
    classifier, notes = own_classifier(options)   # or ValueError naming the option to set

The graph tells its input's layout, side, element type and batch axis, and its class
count (build/onnx_graph.py); the options tell the rest (channel order, scale, resize),
each declared once here for `tritonstack build`. Before anything is written, the
classifier runs on real photos through the DALI pipeline it will be served with:
- logits or probabilities (`--softmax auto`): by whether the rows sum to 1;
- a batch axis the exporter fixed at 1, made dynamic: a batch must equal single runs;
- an ImageNet-labelled classifier must rank each photo's class in its top 5, else the
  preprocessing options are wrong and the build refuses, naming them.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from tritonstack import cli
from tritonstack.build.classifiers import CHANNEL_ORDERS, INPUT_TYPES, RESIZES, Classifier, Preprocessing
from tritonstack.build.labels import read_labels
from tritonstack.build.onnx_graph import SERVED_OUTPUT, read_graph
from tritonstack.build.photo_check import check_on_photos

OWN = cli.Group(
    "bring your own classifier (docs/building.md#bring-your-own-classifier)",
    "An ONNX classifier gets its preprocessing model and ensemble; what its graph does not say is set here. "
    "ImageNet-labelled ones are checked on real photos before anything is written.",
)
TORCHVISION_MEAN = (123.675, 116.28, 103.53)
TORCHVISION_STD = (58.395, 57.12, 57.375)
# The share of a shorter side ImageNet's evaluation keeps (224 of 256).
CROP_SHARE = 0.875


def floats(count: int):
    def parse(text: str) -> tuple[float, ...]:
        try:
            values = tuple(float(value) for value in text.split(","))
        except ValueError:
            values = ()
        if len(values) != count:
            raise argparse.ArgumentTypeError(f"need {count} comma-separated numbers, got {text!r}")
        return values

    return parse


@dataclass(frozen=True)
class OwnClassifierOptions:
    onnx: Path | None = cli.option(None, "--classifier-onnx", type=Path, metavar="FILE", group=OWN)
    labels: Path | None = cli.option(
        None,
        "--labels",
        type=Path,
        metavar="FILE",
        group=OWN,
        help="class names: one a line, CSV index,name, a JSON list or index -> name object, or synset lines",
    )
    name: str | None = cli.option(None, "--name", group=OWN, help="Triton model name (default: the file's)")
    input_size: int | None = cli.option(
        None, "--input-size", type=cli.positive_int, metavar="N", group=OWN, help="the side (default: the graph's)"
    )
    layout: str = cli.option(
        "auto", "--layout", choices=("auto", "NCHW", "NHWC"), group=OWN, help="auto: where the graph's 3 channels are"
    )
    channel_order: str = cli.option(
        "rgb", "--channel-order", choices=CHANNEL_ORDERS, group=OWN, help="bgr: OpenCV- and Caffe-lineage models"
    )
    scale: tuple[float, float] | None = cli.option(
        None,
        "--scale",
        type=floats(2),
        metavar="LOW,HIGH",
        group=OWN,
        help="pixels 0..255 mapped linearly onto LOW..HIGH (--scale=-1,1: Keras/TF MobileNet, Inception; "
        "--scale 0,1), instead of --mean/--std",
    )
    mean: tuple[float, float, float] = cli.option(
        TORCHVISION_MEAN,
        "--mean",
        type=floats(3),
        metavar="A,B,C",
        group=OWN,
        help="subtracted, in 0..255 units and the model's channel order (default: torchvision's ImageNet mean)",
    )
    std: tuple[float, float, float] = cli.option(
        TORCHVISION_STD, "--std", type=floats(3), metavar="A,B,C", group=OWN, help="divided by, after the mean"
    )
    resize: str = cli.option(
        "crop",
        "--resize",
        choices=RESIZES,
        group=OWN,
        help="crop: shorter side to --resize-shorter, center crop; squash: the whole image to the input size; "
        "letterbox: longer side to it, padded with the mean",
    )
    resize_shorter: int | None = cli.option(
        None,
        "--resize-shorter",
        type=cli.positive_int,
        metavar="N",
        group=OWN,
        help=f"with --resize crop (default: input size / {CROP_SHARE})",
    )
    input_type: str = cli.option(
        "auto", "--input-type", choices=("auto", *INPUT_TYPES), group=OWN, help="auto: the graph's"
    )
    softmax: str = cli.option(
        "auto",
        "--softmax",
        choices=("auto", "yes", "no"),
        group=OWN,
        help="add a softmax head (auto: when the outputs on a real photo do not sum to 1)",
    )


def own_classifier(options: OwnClassifierOptions) -> tuple[Classifier, list[str]]:
    """The classifier, checked on real photos, and what was read and decided, a line each."""
    graph = read_graph(options.onnx)
    preprocessing = _preprocessing(options, graph)
    labels = read_labels(options.labels)
    if graph.classes and len(labels) != graph.classes:
        hint = " (a background class first, as TF-slim models have?)" if graph.classes == len(labels) + 1 else ""
        raise ValueError(
            f"{options.labels} has {len(labels)} names but output {graph.output_name!r} has {graph.classes} "
            f"classes{hint}: give one name a class"
        )
    classifier = Classifier(
        name=options.name or options.onnx.stem,
        preprocessing=preprocessing,
        onnx_file=options.onnx.resolve(),
        labels_file=options.labels.resolve(),
        input_name=graph.input_name,
        output_name=SERVED_OUTPUT if graph.quantized_output else graph.output_name,
        num_classes=len(labels),
        dynamic_batch=graph.fixed_batch,
        dequantize=graph.quantized_output,
    )
    notes = [
        f"input {graph.input_name!r}: {preprocessing.layout}, {preprocessing.crop} x {preprocessing.crop}, "
        f"{preprocessing.input_type}, {preprocessing.channel_order.upper()}, resize {preprocessing.resize}"
    ]
    if graph.quantized_output:
        notes.append("output: quantized -> scaled back to FP32 with its own scale and zero point")
    return check_on_photos(classifier, labels, options.softmax, notes, probabilities=graph.ends_in_softmax)


def _preprocessing(options: OwnClassifierOptions, graph) -> Preprocessing:
    layout = _agreed("layout", options.layout, graph.layout, "auto", "--layout NCHW or NHWC")
    crop = _agreed("side", options.input_size, graph.size, None, "--input-size")
    input_type = _agreed("input type", options.input_type, graph.input_type, "auto", "--input-type")
    mean, std = _normalization(options, input_type)
    resize_shorter = options.resize_shorter or (round(crop / CROP_SHARE) if options.resize == "crop" else crop)
    return Preprocessing(
        resize_shorter=resize_shorter,
        crop=crop,
        mean=mean,
        std=std,
        layout=layout,
        channel_order=options.channel_order,
        resize=options.resize,
        input_type=input_type,
    )


def _agreed(what: str, given, read, unset, flag: str):
    """The graph's value, or the option's where the graph does not say; both must agree."""
    if given not in (unset, None) and read is not None and given != read:
        raise ValueError(f"the graph's input {what} is {read}, not {given}: leave {flag.split()[0]} out")
    value = read if given in (unset, None) else given
    if value is None:
        raise ValueError(f"the graph does not say its input {what}: give {flag}")
    return value


def _normalization(options: OwnClassifierOptions, input_type: str):
    custom = (options.mean, options.std) != (TORCHVISION_MEAN, TORCHVISION_STD)
    if options.scale and custom:
        raise ValueError("give --scale or --mean/--std, not both")
    if input_type == "uint8":
        if options.scale or custom:
            raise ValueError("a UINT8 input takes pixels as they are (its graph normalizes): leave --scale/--mean out")
        return (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    if options.scale:
        low, high = options.scale
        if high == low:
            raise ValueError(f"--scale {low},{high}: an empty range")
        std = 255.0 / (high - low)
        return (-low * std,) * 3, (std,) * 3
    return tuple(options.mean), tuple(options.std)
