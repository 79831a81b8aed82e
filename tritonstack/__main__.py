"""`tritonstack`: one command for the whole project, installed by the package.

    tritonstack build [PRESET...] --out model_repository   # write a model repository
    tritonstack check model_repository                     # validate it offline
    tritonstack serve --model-repository model_repository  # run tritonserver until Ctrl-C
    tritonstack classify photo.jpg clips/ --url grpc://127.0.0.1:8001
    tritonstack demo | evaluate | loadtest | benchmark | soak | ...

Each sub-command is a module with its own `main(argv)` and `--help`; it is imported
only when it runs, so a client-only install (`pip install "tritonstack[client]"`)
never loads DALI, ONNX Runtime or the server wheel.
"""

from __future__ import annotations

import importlib
import sys

# name -> (module with main(argv), leading arguments, one-line help)
COMMANDS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "build": ("tritonstack.commands.build", ("build",), "write a model repository (presets or your own ONNX)"),
    "list": ("tritonstack.commands.build", ("list",), "list the presets"),
    "check": ("tritonstack.commands.build", ("check",), "validate a repository offline, as the backends will"),
    "parity": ("tritonstack.commands.build", ("parity",), "DALI vs Pillow preprocessing on real photos"),
    "serve": ("tritonstack.commands.serve", (), "run tritonserver on a model repository until Ctrl-C"),
    "demo": ("tritonstack.commands.demo", (), "start a server, classify real photos over HTTP and gRPC, stop it"),
    "classify": ("tritonstack.commands.classify", (), "classify image files and folders with a server"),
    "evaluate": ("tritonstack.commands.evaluate", (), "accuracy on a labelled folder of images"),
    "loadtest": ("tritonstack.commands.loadtest", (), "Locust load test (bounded, loopback) with a report folder"),
    "benchmark": ("tritonstack.commands.benchmark", (), "the serving stack's figures, as ratios measured side by side"),
    "overload": ("tritonstack.commands.overload", (), "beyond capacity: goodput, refusals and waste under deadlines"),
    "compare": ("tritonstack.commands.compare", (), "before/after: two servers, interleaved rounds"),
    "tune": ("tritonstack.commands.tune", (), "measure layouts on this machine; write the best as a new repository"),
    "plan": ("tritonstack.commands.plan", (), "replicas and autoscaling target from a benchmark's figures"),
    "soak": ("tritonstack.commands.soak", (), "mixed good and bad load for a duration; memory growth judged"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {help_}" for name, (_, _, help_) in COMMANDS.items()]
    return f"{__doc__}\nusage: tritonstack COMMAND [--help] [ARGS...]\n\ncommands:\n" + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"tritonstack: error: unknown command {name!r} (choose from {', '.join(COMMANDS)})", file=sys.stderr)
        return 2
    module, leading, _ = COMMANDS[name]
    # What the command's --help and errors call it (the build commands name themselves).
    sys.argv[0] = "tritonstack" if leading else f"tritonstack {name}"
    return importlib.import_module(module).main([*leading, *rest])


if __name__ == "__main__":
    sys.exit(main())
