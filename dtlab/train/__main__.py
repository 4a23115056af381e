"""``python -m dtlab.train`` and ``torchrun --nproc-per-node N -m dtlab.train ...`` (see ``command.py``)."""

import sys

from dtlab.train.command import main

if __name__ == "__main__":
    sys.exit(main())
