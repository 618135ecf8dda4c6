"""Pins a built gpu-mem-track wheel to the torch minor version it was compiled against.

The compiled part links libtorch, which has no stable ABI across minor versions, so the wheel's
metadata says ``Requires-Dist: torch>=2.13,<2.14`` (for torch 2.13.x) instead of the source
tree's wide range, and its file name carries the minor version as a build tag
(``gpu_mem_track-0.1.0-213-cp39-abi3-...whl``), replacing one it already has. The RECORD's hashes
are rewritten to match.

Beside the wheel it writes ``torch-2.13.999.tar.gz``, the guard: an sdist that is not torch and
refuses to build, so that ``pip install gpu-mem-track --find-links dist/torch-2.13`` in an
environment with another torch stops with what to run instead of fetching torch 2.13 from the
package index over the user's torch (gpu-mem-track-py/build_backend/torch_guard.py says how).

    python scripts/ci/pin_wheel.py WHEEL TORCH_VERSION OUT_DIR
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import sys
import tarfile
import zipfile

GUARD_BACKEND = os.path.join(os.path.dirname(__file__), "../../gpu-mem-track-py/build_backend/torch_guard.py")


def record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def write_guard(major: int, minor: int, out_dir: str) -> str:
    """``torch-MAJOR.MINOR.999.tar.gz`` in ``out_dir``: torch_guard.py as its own build backend."""
    base = f"torch-{major}.{minor}.999"
    with open(GUARD_BACKEND, "rb") as f:
        backend = f.read()
    summary = "Not torch: stops pip from replacing your torch with one for gpu-mem-track's pinned wheel"
    files = {
        "PKG-INFO": f"Metadata-Version: 2.1\nName: torch\nVersion: {major}.{minor}.999\nSummary: {summary}\n",
        "pyproject.toml": (
            "# Not torch (see torch_guard.py): every build hook refuses, with what to run.\n"
            "[build-system]\nrequires = []\nbuild-backend = \"torch_guard\"\nbackend-path = [\".\"]\n\n"
            f'[project]\nname = "torch"\nversion = "{major}.{minor}.999"\ndescription = "{summary}"\n'
        ),
    }
    out = os.path.join(out_dir, f"{base}.tar.gz")
    with tarfile.open(out, "w:gz") as tar:
        for name, data in [*((n, d.encode()) for n, d in files.items()), ("torch_guard.py", backend)]:
            info = tarfile.TarInfo(f"{base}/{name}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return out


def pin(wheel: str, torch_version: str, out_dir: str) -> str:
    major, minor = (int(p) for p in torch_version.split("+")[0].split(".")[:2])
    requirement = f"Requires-Dist: torch>={major}.{minor},<{major}.{minor + 1}"
    build_tag = f"{major}{minor}"
    name = os.path.basename(wheel)
    parts = name[: -len(".whl")].split("-")
    if len(parts) == 6:  # pinned before: its build tag is replaced
        parts = [*parts[:2], *parts[3:]]
    if len(parts) != 5:
        raise SystemExit(f"{name}: expected name-version[-build]-python-abi-platform.whl")
    out_name = "-".join([*parts[:2], build_tag, *parts[2:]]) + ".whl"
    files: dict[str, bytes] = {}
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            files[info.filename] = z.read(info)
    dist_info = next(n.split("/")[0] for n in files if n.endswith(".dist-info/METADATA"))
    metadata = files[f"{dist_info}/METADATA"].decode()
    pinned, n = re.subn(r"^Requires-Dist: torch\b.*$", requirement, metadata, flags=re.MULTILINE)
    if n != 1:
        raise SystemExit(f"{name}: expected one Requires-Dist on torch in METADATA, found {n}")
    files[f"{dist_info}/METADATA"] = pinned.encode()
    wheel_info = files[f"{dist_info}/WHEEL"].decode()
    wheel_info = re.sub(r"^Build: .*\n", "", wheel_info, flags=re.MULTILINE).rstrip("\n") + f"\nBuild: {build_tag}\n"
    files[f"{dist_info}/WHEEL"] = wheel_info.encode()
    record_name = f"{dist_info}/RECORD"
    lines = [f"{n},{record_hash(data)},{len(data)}" for n, data in files.items() if n != record_name]
    files[record_name] = ("\n".join([*lines, f"{record_name},,"]) + "\n").encode()
    os.makedirs(out_dir, exist_ok=True)
    out = os.path.join(out_dir, out_name)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for n, data in files.items():
            z.writestr(n, data)
    write_guard(major, minor, out_dir)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    print(pin(*sys.argv[1:]))
