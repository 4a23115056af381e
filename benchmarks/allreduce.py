"""`python benchmarks/allreduce.py [--json] [--repeats N]`: the same as `dtlab bench allreduce`."""

import sys

from dtlab.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "allreduce", *sys.argv[1:]]))
