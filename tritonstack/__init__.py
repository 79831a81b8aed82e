"""Serve image classifiers with Triton and DALI preprocessing.

The package is sorted by when its code runs:

- `build/`: write and check model repositories (presets, classifiers, DALI
  pipelines, typed configs, the repository writer, the offline checker, parity);
- `serve/`: run tritonserver on a repository (the launcher, the backend
  directory, stub supervision, shared-memory cleanup); `tritonstack serve`;
- `client/`: classify images against a running server (sync and asyncio clients
  over one protocol module, retry, shared memory, the folder runner).

Those three never import each other. What they share: `contract` (names, files,
headers, type maps both sides of Triton agree on), `dali_proto` (reading
model.dali) and `rules` (the backends' load-time rules, also run offline by
`build_pipelines.py check`), and `samples` (real photos for tests and demos).
"""
