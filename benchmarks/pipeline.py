"""`python benchmarks/pipeline.py [--json] [--repeats N]`: the same as `dtlab bench pipeline`."""

import sys

from dtlab.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "pipeline", *sys.argv[1:]]))
