"""`python benchmarks/tracer.py [--json] [--repeats N]`: the same as `dtlab bench tracer`."""

import sys

from dtlab.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "tracer", *sys.argv[1:]]))
