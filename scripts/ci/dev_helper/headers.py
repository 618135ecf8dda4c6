"""The shim and the estimator's C++ against a torch's headers, taken from its wheel: nothing links,
so no tch release need build against it (`shim-check`, `headers`)."""

from __future__ import annotations

import argparse
import glob
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

from .checkout import DEV_PY, ROOT
from .pairs import tch_for
from .shell import now, run, tail
from .wheel_folder import ensure_wheels, wheels_dir


def shim_check(version: str) -> int:
    """Compiles the shim (syntax only, as build.rs would: C++ standard from the headers, CUDA
    history with the CUDA headers of torch's CUDA release) against torch `version`'s headers, taken
    from its wheel (no virtualenv: nothing links), for a torch no tch release can build against
    yet. Prints one result line, with the reason tch cannot build when it still holds."""
    started, rc, std = now(), 0, "c++17"
    wheels, out = wheels_dir(), ROOT / f"target/compat/headers-{version}"
    wheels.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    aten = out / "torch/include/ATen/ATen.h"

    def unzip(wheel: str, prefix: str) -> None:
        with zipfile.ZipFile(wheel) as z:
            z.extractall(out, [n for n in z.namelist() if n.startswith(prefix)])

    if not aten.exists():
        if ensure_wheels(["--no-deps", f"torch=={version}"]) != 0:
            print(f"compat: torch {version}: cannot download its wheel")
            return 1
        wheel = min(glob.glob(f"{wheels}/torch-{version}-*.whl"))
        unzip(wheel, "torch/include/")
        # Its CUDA runtime and compiler headers, of the release the wheel's metadata pins: CUDA 13
        # (cuda-toolkit[...]==13.0.2) in two small packages, CUDA 12 (nvidia-cuda-runtime-cu12==12.8.90)
        # in the runtime's and nvcc's.
        with zipfile.ZipFile(wheel) as z:
            meta = z.read(f"torch-{version}.dist-info/METADATA").decode()
        m = re.search(r"^Requires-Dist: cuda-toolkit\[.*\]==([0-9]*\.[0-9]*)", meta, re.MULTILINE)
        packages = ["nvidia-cuda-runtime", "nvidia-cuda-crt"]
        if m is None:
            m = re.search(r"^Requires-Dist: nvidia-cuda-runtime-cu12==([0-9]*\.[0-9]*)", meta, re.MULTILINE)
            packages = ["nvidia-cuda-runtime-cu12", "nvidia-cuda-nvcc-cu12"]
        for package in packages if m else []:
            ensure_wheels(["--no-deps", f"{package}=={m.group(1)}.*"])
            for f in sorted(glob.glob(f"{wheels}/{package.replace('-', '_')}-{m.group(1)}.*.whl")):
                unzip(f, "nvidia/")
    if "C++20 or later" in aten.read_text(errors="replace"):
        std = "c++20"
    # -I flags for the runtime's and the compiler's headers (one folder for CUDA 13, two for 12).
    runtime = crt = None
    for f in sorted(glob.glob(f"{out}/nvidia/*/include")):
        runtime = f if os.path.exists(f"{f}/cuda_runtime_api.h") else runtime
        crt = f if os.path.exists(f"{f}/crt/host_config.h") else crt
    cuda = ["-DGMT_HAVE_CUDA_HEADERS", f"-I{runtime}", f"-I{crt}"] if runtime and crt else []
    # The tracker's shim, then the estimator's native code on the tracker's headers.
    sources = sorted(glob.glob(f"{ROOT}/gpu-mem-track-sys/csrc/*.cpp"))
    sources += sorted(glob.glob(f"{ROOT}/gpu-mem-track-estimate-sys/csrc/*.cpp"))
    for f in sources:
        gxx = ["g++", "-fsyntax-only", "-w", f"-std={std}", "-D_GLIBCXX_USE_CXX11_ABI=1", "-DGLOG_USE_GLOG_EXPORT"]
        gxx += ["-DGMT_HAVE_TORCH_CUDA", *cuda, f"-I{ROOT}/gpu-mem-track-sys/csrc", f"-I{out}/torch/include"]
        gxx += [f"-I{out}/torch/include/torch/csrc/api/include", f]
        rc = 1 if run(gxx).returncode != 0 else rc
    why = f"tch {(tch_for(version) or '').split(' ')[0]} builds against it (scripts/dev matrix runs that pair's pair tests)"
    if re.match(r"2\.[678]\.", version):
        why = "for the Python package only: the tch releases of this torch are older than the Rust crate accepts"
    cargo_home = os.environ.get("CARGO_HOME") or f"{os.environ.get('HOME', '')}/.cargo"
    generated = sorted(glob.glob(f"{cargo_home}/registry/src/*/torch-sys-0.26.0/libtch/torch_api_generated.cpp"))
    if (
        not (out / "torch/include/ATen/ops/cholesky.h").exists()
        and generated
        and "torch::cholesky(" in Path(generated[0]).read_text(errors="replace")
    ):
        why = "no tch builds against it: torch-sys 0.26 calls torch::cholesky and torch::qr, which torch 2.14 removed"
    print(
        f"compat: torch {version}: the shim compiles against its headers ({std}{', CUDA history' if cuda else ''}):"
        f" {'ok' if rc == 0 else 'FAILED'}; {why} ({now() - started} s)"
    )
    return rc


def cmd_shim_check(args: argparse.Namespace) -> int:
    return shim_check(args.version)


def cmd_headers(args: argparse.Namespace) -> int:
    """The shim and the estimator's C++ against each of these torch versions' headers, all at once
    (each check is one compiler process), each into target/compat/headers-V.log."""
    logs = ROOT / "target/compat"
    logs.mkdir(parents=True, exist_ok=True)
    running = []
    for v in args.versions:
        with open(logs / f"headers-{v}.log", "w") as f:
            cmd = [sys.executable, DEV_PY, "shim-check", v]
            running.append((v, subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)))
    rc = 0
    for v, p in running:
        rc = 1 if p.wait() != 0 else rc
        print(tail((logs / f"headers-{v}.log").read_text(errors="replace"), 30), end="", flush=True)
    return rc
