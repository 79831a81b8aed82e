#!/usr/bin/env python3
"""`tritonstack evaluate` from a checkout (see `python clients/evaluate.py --help`)."""

import sys

from tritonstack.commands.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
