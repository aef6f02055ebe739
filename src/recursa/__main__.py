"""`python -m recursa ...`: the same command line as `recursa ...` (for a venv whose scripts
directory is not on PATH)."""

import sys

from recursa.cli import main

sys.exit(main())
