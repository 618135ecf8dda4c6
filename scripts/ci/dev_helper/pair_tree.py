"""The tree a (tch, torch) pair builds in: a copy of the work tree with its own lockfile and target
folder, whose dependent fixture asks for that pair's tch (`pair-tree`)."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
from pathlib import Path

from .checkout import ROOT
from .pairs import tch_for
from .shell import ERR, run


def copy_tree(dest: Path) -> None:
    """A copy of the work tree (tracked and untracked, not ignored files) at `dest`, whose own
    Cargo.lock and target folder a (tch, torch) pair can change without touching this checkout's.
    The pair's own lockfile stays (rewriting it would rebuild the shim every time); mtimes are
    kept, so cargo rebuilds only what changed."""
    dest.mkdir(parents=True, exist_ok=True)
    for child in dest.iterdir():
        if child.name in ("target", "Cargo.lock"):
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    listed = run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, stdout=subprocess.PIPE)
    for name in listed.stdout.decode().split("\0"):
        src, dst = ROOT / name, dest / name
        # Tracked files deleted from the work tree are left out.
        if not name or name == "Cargo.lock" or not os.path.lexists(src):
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            dst.unlink(missing_ok=True)
            os.symlink(os.readlink(src), dst)
        elif src.is_file():
            shutil.copy2(src, dst)
    if not (dest / "Cargo.lock").exists():
        shutil.copy2(ROOT / "Cargo.lock", dest / "Cargo.lock")


def pair_tree(version: str, env: dict) -> Path:
    """The folder where torch `version`'s pair builds: a copy of the tree whose dependent fixture
    asks for exactly the matching tch (as a user's crate does) and whose lockfile picks it."""
    tch = (tch_for(version) or "").split(" ")[0]
    d = ROOT / f"target/compat/torch-{version}"
    copy_tree(d)
    dependent = d / "tests/fixtures/dependent/Cargo.toml"
    dependent.write_text(re.sub(r"(?m)^tch = .*$", f'tch = "={tch}"', dependent.read_text()))
    # Dependencies unoptimised: the pair tests are small, and libtorch's C++ bindings compile in
    # half the time at -O0. In the tree's config, so that scripts/gpu-bundle reuses the build.
    (d / ".cargo").mkdir(exist_ok=True)
    (d / ".cargo/config.toml").write_text('[profile.dev.package."*"]\nopt-level = 0\n')
    update = ["cargo", "update", "--quiet", "-p", "tch"]
    if run([*update, "--precise", tch], cwd=d, env=env, stdout=ERR, stderr=subprocess.DEVNULL).returncode:
        run(update, cwd=d, env=env, stdout=ERR)
    return d


def cmd_pair_tree(args: argparse.Namespace) -> int:
    """For scripts/gpu-bundle and `--torch V` commands: prepares the pair's tree, prints it."""
    print(pair_tree(args.torch, dict(os.environ)))
    return 0
