"""Triton backend "dali", Python-based: serves a DALI pipeline on the CPU.

It keeps the contract of the C++ DALI backend (triton-inference-server/dali_backend)
so that one model repository serves with either:
- the pipeline is `<version>/model.dali` (or `default_model_filename`), else
  `<version>/dali.py` whose single `@autoserialize` pipeline is serialized at load;
- config inputs match the pipeline's external sources by name (checked both ways),
  outputs match by position; a data type, rank or count mismatch fails the load
  with a message naming the tensor, the config value and the pipeline value;
- a partial config, or none at all (a `<name>.dali` folder), is auto-completed
  from the pipeline as the C++ backend merges it (tritonstack.rules.dali.dali_autocomplete:
  names, types, dims, allow_ragged_batch, max_batch_size, dynamic_batching);
- a dali.py written for a GPU machine (`device_id=0`) with only CPU operators is
  serialized with `device_id=None` for KIND_CPU instances, as it runs on them in
  the NGC container;
- `max_batch_size` from the config overrides the serialized batch size, and
  `parameters { key: "num_threads" }` overrides the serialized thread count;
- a pipeline error answers TRITONSERVER_ERROR_UNKNOWN (HTTP 400, gRPC UNKNOWN)
  naming the failing operator, and the pipeline is rebuilt for the next request;
- GPU or mixed operators on a KIND_CPU instance fail the load.
Beyond the C++ backend: an encoded image the decoder is certain to refuse (no image,
a format it does not read, a truncated JPEG or PNG: tritonstack.media.decodable) gets the
decoder's status before the pipeline runs, so it costs no rebuild; when several
requests merged into one batch fail together,
each is run again alone, so only the bad request gets the error; and encoded images
and requests are held to a decode budget read from the images' headers before the
decoder allocates anything (tritonstack.media.decode_budget: pixels per image, per
request, per decoder run; a merged batch above the per-run budget runs in parts,
and, with DALI's host pool off, after a run above `release_above_pixels` the
decoder's buffers are returned);
an input tensor larger than `max_input_bytes` (parameter, else
$TRITONSTACK_MAX_INPUT_BYTES from the launcher, else 64 MiB) is refused before its
data is read; and `host_pool_reserve_bytes` (parameter) reserves that much of
DALI's host pool at load (docs/memory.md).

Modules, as a request meets them: `model` (Triton's entry points: load, execute),
`source` (where the pipeline comes from: model.dali or dali.py), `requests` (a
request's samples, refused early when too large or undecodable), `pipeline` (the DALI
pipeline: run, split per request, rebuild after a failure), `memory_policy` (how the
stub keeps its memory), `allocator` (glibc's heap, DALI's pool), `memory_trace` (only
for the memory probe, imported when switched on); and
`tritonstack.backends.residency` (DALI's pool counted as it fills).
"""

from __future__ import annotations
