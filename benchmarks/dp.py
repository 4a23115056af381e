"""`python benchmarks/dp.py [--json] [--repeats N]`: the same as `dtlab bench dp`."""

import sys

from dtlab.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "dp", *sys.argv[1:]]))
