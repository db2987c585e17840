#!/usr/bin/env python3
"""The judge's command line in a checkout; everything lives in harness/cli.py, which the installed `kernel-judge`
command runs too (`run_eval.py --help` lists the commands)."""
import sys

from harness.cli import main

if __name__ == "__main__":
    sys.exit(main())
