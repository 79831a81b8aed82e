#!/usr/bin/env python3
"""Build the Triton model repository: DALI preprocessing, classifiers, ensembles.

    python build_pipelines.py build                 # writes ./model_repository
    python build_pipelines.py build --out /tmp/repo

Only files whose content changes are rewritten; the ONNX export is skipped while
its inputs (weights, export code, torch version) are unchanged.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tritonstack.repository import BuildOptions, write_repository

DEFAULT_REPOSITORY = Path(__file__).resolve().parent / "model_repository"


def build(args: argparse.Namespace) -> int:
    options = BuildOptions(
        max_batch_size=args.max_batch_size,
        num_threads=args.num_threads,
        instances=args.instances,
        max_queue_delay_us=args.max_queue_delay_us,
    )
    changed = write_repository(args.out, options=options)
    for path in changed:
        print(f"wrote {path.relative_to(args.out)}")
    print(f"{args.out}: {len(changed)} file(s) changed")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    build_parser = commands.add_parser("build", help="write the model repository")
    defaults = BuildOptions()
    build_parser.add_argument("--out", type=Path, default=DEFAULT_REPOSITORY, help="repository folder")
    build_parser.add_argument("--max-batch-size", type=int, default=defaults.max_batch_size)
    build_parser.add_argument("--num-threads", type=int, default=defaults.num_threads,
                              help="DALI CPU worker threads per instance")
    build_parser.add_argument("--instances", type=int, default=defaults.instances,
                              help="instances of each model")
    build_parser.add_argument("--max-queue-delay-us", type=int, default=defaults.max_queue_delay_us,
                              help="how long the dynamic batcher waits to fill a batch")
    build_parser.set_defaults(run=build)

    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
