#!/usr/bin/env python3
"""`tritonstack demo` from a checkout: what `make demo` runs."""

import sys

from tritonstack.commands.demo import main

if __name__ == "__main__":
    sys.exit(main())
