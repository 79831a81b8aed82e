#!/usr/bin/env python3
"""`tritonstack classify` from a checkout (see `python clients/classify.py --help`)."""

import sys

from tritonstack.commands.classify import main

if __name__ == "__main__":
    sys.exit(main())
