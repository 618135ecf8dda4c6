"""scripts/dev's helper, standard library only: `python3 scripts/ci/dev.py SUBCOMMAND ...`
(`--help` lists them). The entry point only: the package dev_helper/ beside it holds the
subcommands, one module a job (its docstring lists them)."""

import os
import sys

# No bytecode beside the sources: the work tree stays as git sees it (the pairs' trees copy every
# file git does not ignore).
sys.dont_write_bytecode = True
# This folder as scripts/dev spells it (not resolved, unlike sys.path[0]): the checkout's path
# (dev_helper.checkout.ROOT) is taken from the package's.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from dev_helper.cli import main

if __name__ == "__main__":
    sys.exit(main())
