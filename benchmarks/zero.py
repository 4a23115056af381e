"""`python benchmarks/zero.py [--json] [--repeats N]`: the same as `dtlab bench zero`."""

import sys

from dtlab.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "zero", *sys.argv[1:]]))
