"""Serve image classifiers with Triton and DALI preprocessing.

The package is sorted by when its code runs (docs/architecture.md lists every module):

- `build/`: write and check model repositories (presets, classifiers, DALI
  pipelines, typed configs, the repository writer, the offline checker, parity);
- `serve/`: run tritonserver on a repository (the launcher, the backend
  directory, stub supervision, the server's process tree); `tritonstack serve`;
- `client/`: classify images against a running server (sync and asyncio clients
  over one protocol module, retry, shared memory, the folder runner).

Those three never import each other. What they share:

- `contract` (the wire: tensor names, presets' model names, the admin header, type
  maps), `address` (the one address parser), `repository_files` (a repository's
  file names), `objective` (the latency objective's queue ceilings) and `cli` (what
  every command line does alike);
- `media/`: what an encoded input is, from its bytes (headers, budgets, boxes);
- `rules/`: the backends' load-time rules, also run offline by `tritonstack check`,
  and how they read model.dali and DALI's errors;
- `samples/`: real photos and the load test's corpus, without a download;
- `backends/`: our Python-based `dali` and `onnxruntime` backends and the settings
  the launcher hands them.

The tools run the whole stack: `benchmark/` (its scenarios), `experiments/` (the
engines of compare, overload, tune and plan), `gpu/` (scripts for a GPU machine),
`diagnostics/` and `loadtests/` (Locust); the measuring tools share the engine in
`measure/` (load loops, rounds, LoadGen, CPU accounting, the figures' registry);
`commands/` holds one
command line per sub-command of `tritonstack` (`__main__`).
"""
