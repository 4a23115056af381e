"""``python -m dtlab ...``: the ``dtlab`` command, for an environment whose scripts are not on PATH."""

import sys

from dtlab.cli import main

if __name__ == "__main__":
    sys.exit(main())
