"""The reference limit of this machine: the same serialized DALI pipeline and ONNX session
run in one process without a server, preprocessing and classification overlapped."""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from nvidia.dali import Pipeline

from tritonstack.contract import pad_batch
from tritonstack.measure.load_loops import Phase
from tritonstack.measure.load_settings import Settings
from tritonstack.measure.measured_models import CLASSIFIER, DALI_PREPROCESS
from tritonstack.serve import process_tree


def inprocess_best_setting(repository: Path, images: list[bytes], settings: Settings) -> dict:
    """The thread/batch setting of the grid with the best in-process rate (a grid of one
    is its own best: nothing is measured to choose it)."""

    def rate(setting: tuple[int, int, int]) -> float:
        return _inprocess_run(repository, images, *setting, settings).images_per_s

    grid = settings.inprocess_grid
    batch, dali_threads, ort_threads = grid[0] if len(grid) == 1 else max(grid, key=rate)
    return {"batch": batch, "dali_threads": dali_threads, "ort_threads": ort_threads}


def inprocess_phase(repository: Path, images: list[bytes], setting: dict, settings: Settings) -> Phase:
    """The same model.dali and model.onnx in this process, DALI and ONNX Runtime in
    two threads (both release the GIL), as the server overlaps its two models."""
    return _inprocess_run(
        repository, images, setting["batch"], setting["dali_threads"], setting["ort_threads"], settings
    )


def dali_preprocessing(repository: Path, batch: int, threads: int) -> Pipeline:
    """The served DALI preprocessing model's pipeline, built here on the CPU."""
    pipeline = Pipeline.deserialize(
        serialized_pipeline=(repository / DALI_PREPROCESS / "1" / "model.dali").read_bytes(),
        batch_size=batch,
        num_threads=threads,
        device_id=None,
        prefetch_queue_depth=1,
    )
    pipeline.build()
    return pipeline


def _inprocess_run(repository, images, batch, dali_threads, ort_threads, settings) -> Phase:
    # The threads already running (the server's supervisor and restarter, gRPC's): not
    # the reference's; this thread and those DALI and ONNX Runtime start below are.
    others = set(process_tree.thread_cpu_seconds()) - {threading.get_native_id()}
    pipeline = dali_preprocessing(repository, batch, dali_threads)
    options = ort.SessionOptions()
    options.intra_op_num_threads = ort_threads
    session = ort.InferenceSession(
        str(repository / CLASSIFIER / "1" / "model.onnx"), options, providers=ort.get_available_providers()
    )  # CUDA first where installed
    batches = [
        pad_batch([images[(start + i) % len(images)] for i in range(batch)]) for start in range(0, len(images), batch)
    ]
    handoff: queue.Queue = queue.Queue(maxsize=2)
    stop = threading.Event()

    def preprocess():
        index = 0
        while not stop.is_set():
            pipeline.feed_input("DALI_INPUT_0", list(batches[index % len(batches)]))
            (output,) = pipeline.run()
            handoff.put(np.asarray(output.as_tensor()))
            index += 1
        handoff.put(None)

    producer = threading.Thread(target=preprocess, daemon=True)
    producer.start()
    done, started, cpu_started, threads_started = 0, None, None, None
    deadline = time.perf_counter() + settings.warmup_s + settings.seconds
    # Past the deadline still until two batches were timed: a loaded machine must
    # not leave the phase empty (a rate of 0 and a ratio that divides by it).
    while time.perf_counter() < deadline or done < 2 * batch:
        session.run(None, {"input": handoff.get()})
        if started is None and time.perf_counter() > deadline - settings.seconds:
            started = time.perf_counter()  # warm-up over: count from here
            cpu_started, threads_started = process_tree.own_cpu_seconds(), process_tree.thread_cpu_seconds()
        elif started is not None:
            done += batch
    seconds, process_s = time.perf_counter() - started, process_tree.own_cpu_seconds() - cpu_started
    cpu_s = process_tree.cpu_seconds_without(process_s, threads_started, process_tree.thread_cpu_seconds(), others)
    stop.set()
    while handoff.get() is not None:
        pass
    producer.join()
    # CPU over the counted window only (warm-up 0): images per CPU-second of the two libraries.
    return Phase(images=done, seconds=seconds, server_cpu_s=cpu_s, warmup_s=0.0)
