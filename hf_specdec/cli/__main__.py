"""``python -m hf_specdec.cli``: the ``hf-specdec`` command, as torchrun launches it (``tests/test_distributed_training``)."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
