import sys

from tritonstack.benchmark.run import main

if __name__ == "__main__":
    sys.exit(main())
