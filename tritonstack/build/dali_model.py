"""The DALI pipelines (images, clips and regions classified; speech samples), and the
`dali.py` model file the DALI backend serializes at load time
(`build_pipelines.py build --format dali.py`).

This file is the one definition of the pipeline: tritonstack.build.pipelines serializes it
to `model.dali`, and the build copies it unchanged to `<model>/1/dali.py` with its
parameters in `preprocessing.json` next to it. It imports only DALI, so it loads in
the NGC container's DALI backend too, which imports the file and serializes the
function marked `@autoserialize`.
"""

import json
import math
from pathlib import Path

import nvidia.dali.math as dmath
from nvidia.dali import fn, pipeline_def, types
from nvidia.dali.plugin.triton import autoserialize

INPUT_NAME = "DALI_INPUT_0"
BOXES_NAME = "DALI_INPUT_1"  # a regions pipeline's boxes: FP32 [N, 4], x0, y0, x1, y1
OUTPUT_NAME = "DALI_OUTPUT_0"
PARAMETERS_FILENAME = "preprocessing.json"
# Share of JPEG decoding given to the GPU's hardware decoder (A100/H100), the
# rest to CUDA: NVIDIA's recommended starting point.
HW_DECODER_LOAD = 0.65


def classification(
    resize_shorter, crop, mean, std, device="cpu", layout="NCHW", channel_order="rgb", resize="crop", input_type="fp32"
):
    """decode -> resize (the shorter side, then a center crop; or squash; or letterbox)
    -> normalize -> FP32 (or UINT8) in the classifier's layout and channel order.

    `device="gpu"` decodes with nvJPEG ("mixed": hardware decoder where there is
    one), and resize and normalize then run on the GPU since their input is there.
    """
    encoded = _encoded()
    images = _decoded(encoded, device, channel_order)
    return _resize_crop_normalize(images, resize_shorter, crop, mean, std, layout[1:], resize, input_type)


def _encoded():
    """The model's input: one encoded file (image, clip or audio) per sample."""
    return fn.external_source(name=INPUT_NAME, dtype=types.UINT8, ndim=1)


def _decoded(encoded, device, channel_order="rgb"):
    """The encoded images decoded to RGB (or BGR) with their EXIF orientation applied
    (the decoder's default)."""
    order = types.BGR if channel_order == "bgr" else types.RGB
    if device == "gpu":
        return fn.decoders.image(encoded, device="mixed", output_type=order, hw_decoder_load=HW_DECODER_LOAD)
    return fn.decoders.image(encoded, device="cpu", output_type=order)


def _resize_crop_normalize(images, resize_shorter, crop, mean, std, layout, resize="crop", input_type="fp32"):
    """Resize to crop x crop as the classifier was trained, normalize in `layout`
    (frames too: FCHW); a UINT8 input is left in pixel units (mean 0, std 1).

    The center crop is fn.resize_crop_mirror: DALI's fused resize and crop, which
    resamples only the region the crop keeps (224 x 224 pixels made from a 640 x 480
    photo, not 341 x 256), the same pixels as fn.resize then fn.crop within one level
    of 255. One operator, not the region's arithmetic: that arithmetic (about twenty
    operators a run) cost more than the resampling at the batches a server forms
    (docs/performance.md#the-dali-step-per-image)."""
    if resize == "squash":
        images = fn.resize(images, size=(crop, crop), antialias=True)
    elif resize == "letterbox":  # the padding is the mean: zero once normalized
        images = fn.resize(images, size=(crop, crop), mode="not_larger", antialias=True)
        images = fn.crop(images, crop=(crop, crop), out_of_bounds_policy="pad", fill_values=list(mean))
    else:
        images = fn.resize_crop_mirror(images, resize_shorter=resize_shorter, crop=(crop, crop), antialias=True)
    return _normalized(images, mean, std, layout, input_type)


def _normalized(images, mean, std, layout, input_type="fp32"):
    """Normalized (a UINT8 input left in pixel units) in `layout`."""
    dtype = types.UINT8 if input_type == "uint8" else types.FLOAT
    return fn.crop_mirror_normalize(images, mean=list(mean), std=list(std), dtype=dtype, output_layout=layout)


classification_pipeline = pipeline_def(classification)


def video_classification(
    resize_shorter,
    crop,
    mean,
    std,
    frames,
    stride,
    device="cpu",
    layout="NCHW",
    channel_order="rgb",
    resize="crop",
    input_type="fp32",
):
    """decode a clip -> `frames` frames, `stride` apart (the last one repeated when
    the clip is shorter) -> the image transform on each -> FP32 FCHW (or the
    classifier's layout). Served with `split_along_outer_axis` on its output, each
    frame leaves as one sample for the classifier. DALI's CPU decoder reads VP8, VP9
    and MJPEG; `device="gpu"` decodes with NVDEC (H.264, H.265, AV1 too).
    RGB and FP32 only (`channel_order`, `input_type`: the build refuses others, presets.Preset):
    DALI's video decoder gives RGB frames, and the pipeline declares FP32."""
    encoded = _encoded()
    sequence = fn.decoders.video(
        encoded, device="mixed" if device == "gpu" else "cpu", sequence_length=frames, stride=stride, pad_mode="edge"
    )
    return _resize_crop_normalize(sequence, resize_shorter, crop, mean, std, "F" + layout[1:], resize)


video_classification_pipeline = pipeline_def(video_classification, output_dtype=types.FLOAT, output_ndim=4)


def regions_classification(
    resize_shorter,
    crop,
    mean,
    std,
    max_boxes,
    device="cpu",
    layout="NCHW",
    channel_order="rgb",
    resize="letterbox",
    input_type="fp32",
):
    """decode an image once -> each of its boxes cut and letterboxed to crop x crop (its
    longer side resized to the crop, the rest filled with the classifier's mean, which
    normalizes to zero) -> FP32 FCHW, one frame per box, in order. Served with
    `split_along_outer_axis` on its output, each box leaves as one sample for the
    classifier. `resize_shorter` is the whole-image transform's and unused: a
    detector's box is already the subject, and letterboxing keeps all of it with its
    aspect ratio (compared with squashing and a center crop in docs/building.md).

    DALI has no operator that cuts a varying number of regions (NVIDIA/DALI#4735): the
    pipeline has `max_boxes` slots, each a resize of the decoded image's region of
    interest at box i; a slot past the image's N boxes resizes a 1-pixel region to one
    pixel (padded like the others, so that all stack), and the stacked crops are sliced
    back to the first N before normalizing. The classifier's layout and channel order are
    kept; `resize` is always this letterbox, `input_type` FP32 (presets.Preset)."""
    images = _decoded(_encoded(), device, channel_order)
    boxes = fn.external_source(name=BOXES_NAME, dtype=types.FLOAT, ndim=2)
    slots = fn.pad(boxes, axes=(0,), shape=(max_boxes,), fill_value=0)
    count = boxes.shape(dtype=types.INT32)[0:1]
    crops = [
        _letterboxed(images, slots[slot], _slot_side(count[0] > slot, crop), crop, mean) for slot in range(max_boxes)
    ]
    stacked = fn.stack(*crops, axis_name="F")
    kept = fn.slice(stacked, fn.zeros_like(count), count, axes=(0,))
    return fn.crop_mirror_normalize(
        kept, mean=list(mean), std=list(std), dtype=types.FLOAT, output_layout="F" + layout[1:]
    )


def _slot_side(used, crop):
    """The resize's bound for a slot: the crop where the slot holds a box, else one pixel."""
    side = fn.cast(used, dtype=types.FLOAT) * (crop - 1) + 1
    return fn.stack(side, side)


def _letterboxed(images, box, side, crop, fill):
    """One box (x0, y0, x1, y1) of each image as one resize of a region of interest, its
    longer side to `side`, then centered on a crop x crop canvas of `fill`."""
    # DALI's region of interest follows the tensor's axes: (y, x).
    start = fn.stack(box[1], box[0])
    end = dmath.max(fn.stack(box[3], box[2]), start + 1)  # a dummy slot's empty box: 1 pixel
    fitted = fn.resize(
        images, roi_start=start, roi_end=end, roi_relative=False, size=side, mode="not_larger", antialias=True
    )
    return fn.crop(fitted, crop=(crop, crop), out_of_bounds_policy="pad", fill_values=list(fill))


regions_classification_pipeline = pipeline_def(regions_classification, output_dtype=types.FLOAT, output_ndim=4)


def speech_samples(sample_rate, device="cpu"):
    """decode a clip (WAV, FLAC, OGG Vorbis or Opus; any rate, any channels) -> mono (the
    channels' mean) -> resampled to `sample_rate` -> FP32 samples in [-1, 1], one
    dimension. DALI decodes and resamples audio on the CPU only; `device="gpu"` hands
    the samples to the GPU for the model after it."""
    encoded = _encoded()
    samples, _ = fn.decoders.audio(encoded, sample_rate=sample_rate, downmix=True, dtype=types.FLOAT)
    return samples.gpu() if device == "gpu" else samples


speech_samples_pipeline = pipeline_def(speech_samples, output_dtype=types.FLOAT, output_ndim=1)


def log_mel_features(
    sample_rate, window_length, window_step, nfft, mel_bins, freq_low, freq_high, mel_formula, log_offset, device="cpu"
):
    """decode a clip -> mono, resampled to `sample_rate` -> magnitude spectrogram (frames
    `window_length` long, `window_step` apart, not centered, a periodic Hann window, FFT
    of `nfft`) -> `mel_bins` mel filters (peak 1) -> log(mel + log_offset): FP32
    [frames, mel_bins], YAMNet's definition by default (build/audio_features.py holds
    its NumPy reference). On the CPU only, as DALI's audio decoder; `device="gpu"`
    hands the features to the GPU."""
    encoded = _encoded()
    samples, _ = fn.decoders.audio(encoded, sample_rate=sample_rate, downmix=True, dtype=types.FLOAT)
    window = [0.5 - 0.5 * math.cos(2 * math.pi * n / window_length) for n in range(window_length)]  # periodic Hann
    spectrum = fn.spectrogram(
        samples,
        nfft=nfft,
        window_length=window_length,
        window_step=window_step,
        window_fn=window,
        power=1,
        center_windows=False,
        layout="tf",
    )
    mel = fn.mel_filter_bank(
        spectrum,
        sample_rate=sample_rate,
        nfilter=mel_bins,
        freq_low=freq_low,
        freq_high=freq_high,
        mel_formula=mel_formula,
        normalize=False,
    )
    features = dmath.log(mel + log_offset)
    return features.gpu() if device == "gpu" else features


log_mel_features_pipeline = pipeline_def(log_mel_features, output_dtype=types.FLOAT, output_ndim=2)

_PARAMETERS_FILE = Path(__file__).with_name(PARAMETERS_FILENAME)
if _PARAMETERS_FILE.exists():  # only as a model's dali.py, never as tritonstack's module
    _parameters = json.loads(_PARAMETERS_FILE.read_text())

    @autoserialize
    @pipeline_def(
        batch_size=_parameters["max_batch_size"],
        num_threads=_parameters["num_threads"],
        device_id=None if _parameters["device"] == "cpu" else 0,
    )
    def preprocessing_pipeline():
        if "audio" in _parameters:  # an audio preset's: {"sample_rate": ...}
            return speech_samples(**_parameters["audio"], device=_parameters["device"])
        if "log_mel" in _parameters:  # an audio classifier's features (build/audio_features.py)
            return log_mel_features(**_parameters["log_mel"], device=_parameters["device"])
        if "clips" in _parameters:  # a video preset's: {"frames": ..., "stride": ...}
            return video_classification(
                **_parameters["preprocessing"], **_parameters["clips"], device=_parameters["device"]
            )
        if "max_boxes" in _parameters:  # a regions preset's
            return regions_classification(
                **_parameters["preprocessing"], max_boxes=_parameters["max_boxes"], device=_parameters["device"]
            )
        return classification(**_parameters["preprocessing"], device=_parameters["device"])
