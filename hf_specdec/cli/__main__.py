"""``python -m hf_specdec.cli``: the ``hf-specdec`` command (what ``torchrun`` / ``accelerate launch`` start)."""

import sys

from hf_specdec.cli import main

if __name__ == "__main__":
    sys.exit(main())
