"""`python benchmarks/warm_pool.py [--json] [--repeats N]`: the same as `dtlab bench pool`."""

import sys

from dtlab.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "pool", *sys.argv[1:]]))
