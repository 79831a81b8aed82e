#!/usr/bin/env python3
"""Build, list and check model repositories: `tritonstack build|list|check|parity`
from a checkout (see `python build_pipelines.py --help`)."""

import sys

from tritonstack.commands.build import main

if __name__ == "__main__":
    sys.exit(main())
