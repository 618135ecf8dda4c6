"""The subcommands (`python3 scripts/ci/dev.py --help`), each the function of the module of its job."""

from __future__ import annotations

import argparse
import os

from . import __doc__ as helper_doc
from .bench_package import cmd_bench_package
from .bundle_check import cmd_bundle_check
from .ccache import cmd_ccache
from .ci_disk import cmd_free_in_ci
from .compat import cmd_compat, cmd_compat_run
from .headers import cmd_headers, cmd_shim_check
from .libtorch import cmd_setup_libtorch
from .pair_tree import cmd_pair_tree
from .pairs import cmd_pairs_doc, cmd_tch
from .pins import cmd_vars
from .python_tests import cmd_python, cmd_python_env
from .resolve import cmd_resolve
from .steps import cmd_steps
from .usage import cmd_usage
from .wheel import cmd_wheel, cmd_wheels
from .wheel_folder import cmd_pip


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scripts/ci/dev.py", description=helper_doc.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    def add(name: str, fn, help: str) -> argparse.ArgumentParser:
        s = sub.add_parser(name, help=help)
        s.set_defaults(fn=fn)
        return s

    add("usage", cmd_usage, "scripts/dev's usage")
    add("tch", cmd_tch, "the tch of a torch version").add_argument("version")
    add("vars", cmd_vars, "the torch versions of each role, as shell assignments")
    add("pairs-doc", cmd_pairs_doc, "check (or --write) docs/compatibility.md's table").add_argument(
        "--write", action="store_true"
    )
    s = add("pip", cmd_pip, "pip install/download from the wheel folder")
    s.add_argument("python")
    s.add_argument("action", choices=["install", "download"])
    s.add_argument("args", nargs=argparse.REMAINDER)
    add("setup-libtorch", cmd_setup_libtorch, "the environment for a torch, as shell commands").add_argument("torch")
    add("free-in-ci", cmd_free_in_ci, "remove what has served, in CI").add_argument("paths", nargs="*")
    add("pair-tree", cmd_pair_tree, "prepare a pair's tree, print it").add_argument("torch")
    add("compat", cmd_compat, "the pair tests against pairs").add_argument("versions", nargs="+")
    add("compat-run", cmd_compat_run, "one pair's pair tests (compat's child)").add_argument("version")
    add("wheel", cmd_wheel, "the Python package's wheel for a torch").add_argument("version")
    add("wheels", cmd_wheels, "wheels for several torches").add_argument("versions", nargs="+")
    s = add("python-env", cmd_python_env, "a virtualenv holding torch, pytest and the built wheel")
    s.add_argument("version")
    s.add_argument("packages", nargs="*")
    add("python", cmd_python, "the Python package's tests against torches").add_argument("versions", nargs="+")
    s = add("steps", cmd_steps, "print the step table")
    s.add_argument("what")
    s.add_argument("started", type=int)
    s.add_argument("note")
    s.add_argument("rows", nargs="*")
    add("ccache-summary", cmd_ccache, "ccache's hits and misses (CCACHE_STATSLOG)")
    add("shim-check", cmd_shim_check, "the shim against a torch's headers").add_argument("version")
    add("headers", cmd_headers, "shim-check for several torches at once").add_argument("versions", nargs="+")
    add("resolve", cmd_resolve, "tch resolution beside a user's crate")
    add("bundle-check", cmd_bundle_check, "build the GPU bundle, run it without cargo")
    add("bench-package", cmd_bench_package, "the package of a benchmark").add_argument("name")
    return p


def main(argv: list[str] | None = None) -> int:
    # scripts/dev's PATH, which a python3 that is a pyenv shim has changed on the way here.
    if "GMT_DEV_PATH" in os.environ:
        os.environ["PATH"] = os.environ.pop("GMT_DEV_PATH")
    args = parser().parse_args(argv)
    return args.fn(args)
