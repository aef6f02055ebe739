"""`python -m recursa ...`: the same command line as `recursa ...` (for a venv whose scripts
directory is not on PATH)."""

import sys

from recursa.cli import main

if __name__ == "__main__":   # importing the module (every-module import checks) runs nothing
    sys.exit(main())
