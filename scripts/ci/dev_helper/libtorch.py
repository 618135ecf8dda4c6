"""The libtorch a build of ours uses: LIBTORCH's, the active Python's, or a torch's own virtualenv
(installed unless there, with the CUDA compiler headers its wheels leave out), with ccache and
the test cfgs found in it; `setup-libtorch` prints it for scripts/dev to eval."""

from __future__ import annotations

import argparse
import glob
import os
import shlex
import subprocess
from pathlib import Path

from .ccache import ccache_env
from .checkout import ROOT
from .pairs import pairs, role, tch_for
from .pins import PINS
from .shell import ERR, log, run
from .wheel_folder import has_module, pip, wheels_dir

# What a pair's own setup must not inherit from the calling shell (`--torch` unsets the same).
FOREIGN = ("LIBTORCH", "LIBTORCH_USE_PYTORCH", "VIRTUAL_ENV")


def venv_for(torch: str) -> str:
    return f"{ROOT}/.venv" if torch == role("main")[0] else f"{ROOT}/.venvs/torch-{torch}"


def install_torch(venv: str, version: str, packages: list[str], env: dict) -> int:
    """torch==`version` (and `packages`) into the virtualenv `venv` unless it has them."""
    python = f"{venv}/bin/python"
    modules = ", ".join(["torch", *(pkg.split("==")[0] for pkg in packages)])
    check = f"import {modules}, sys; sys.exit(torch.__version__.split('+')[0] != '{version}')"
    if os.path.exists(python) and run([python, "-c", check], stdout=ERR, stderr=subprocess.DEVNULL).returncode == 0:
        return 0
    log(f"installing torch=={' '.join([version, *packages])} into {venv} (wheels kept in {wheels_dir()})")
    run(["python3", "-m", "venv", venv], stdout=ERR, env=env)
    return pip(python, "install", [f"torch=={version}", *packages], stdout=ERR)


def install_cuda_crt(venv: str) -> int:
    """The CUDA runtime headers the wheels ship include crt/host_config.h, which comes from its own
    small package (CUDA 13: nvidia-cuda-crt, 0.1 MB; CUDA 12: nvidia-cuda-nvcc-cu12, 40 MB): with it
    the shim can hook the CUDA caching allocator (memory history on GPUs)."""
    python = f"{venv}/bin/python"
    r = run([python, "-c", "import torch; print(torch.version.cuda or '')"], stdout=subprocess.PIPE, text=True)
    cuda = r.stdout.rstrip("\n")
    if r.returncode != 0 or not cuda:
        return r.returncode
    package = "nvidia-cuda-nvcc-cu12" if cuda.startswith("12.") else "nvidia-cuda-crt"
    if not has_module(python, package):
        log(f"installing the CUDA {cuda} compiler headers ({package})")
        if pip(python, "install", ["--no-deps", f"{package}=={cuda}.*"], stdout=ERR) != 0:
            log(f"no {package} for CUDA {cuda}: CUDA memory history is left out of this build")
    return 0


def test_cfgs(env: dict) -> str:
    """What this machine offers the tests (`gmt_python_torch,...`), as gpu-mem-track-testkit's
    probe finds it in `env`: the build scripts read it from GMT_TEST_CFGS and run nothing."""
    probe = run(
        ["cargo", "run", "-q", "--manifest-path", f"{ROOT}/Cargo.toml", "-p", "gpu-mem-track-testkit",
         "--bin", "gmt-test-env"],
        env=env, stdout=subprocess.PIPE, text=True,
    )
    if probe.returncode != 0:
        raise SystemExit(probe.returncode)
    cfgs = probe.stdout.strip()
    log(f"test environment: {cfgs or 'no GPU, Python with torch or browser'}")
    return cfgs


def setup_libtorch(torch: str, env: dict) -> dict:
    """What the environment `env` needs to build against torch `torch` (None: unset): the libtorch
    of LIBTORCH, or of the active Python (LIBTORCH_USE_PYTORCH), else that torch's virtualenv,
    installed unless there; ccache either way; and the test cfgs found in it (GMT_TEST_CFGS)."""
    changes = libtorch_env(torch, env)
    merged = {**env, **{k: v for k, v in changes.items() if v is not None}}
    for k, v in changes.items():
        if v is None:
            merged.pop(k, None)
    changes["GMT_TEST_CFGS"] = test_cfgs(merged)
    return changes


def libtorch_env(torch: str, env: dict) -> dict:
    """setup_libtorch's libtorch and ccache."""
    if env.get("LIBTORCH"):
        log(f"using the libtorch in LIBTORCH={env['LIBTORCH']}")
        return ccache_env("", env)
    if env.get("LIBTORCH_USE_PYTORCH"):
        log("using the torch of the active Python (LIBTORCH_USE_PYTORCH is set)")
        return ccache_env("", env)
    venv, tch = venv_for(torch), tch_for(torch)
    if tch is None:
        log(f"torch {torch} is not supported ({pairs()[0]['torch']} and later are)")
        raise SystemExit(1)
    extra = [f"torchvision=={PINS['MAIN_TORCHVISION']}"] if torch == role("main")[0] else []
    rc = install_torch(venv, torch, [*extra, "numpy"], env) or install_cuda_crt(venv)
    if rc != 0:
        raise SystemExit(rc)
    changes: dict = {"VIRTUAL_ENV": venv, "PATH": f"{venv}/bin:{env.get('PATH', '')}"}
    changes.update(ccache_env(venv, {**env, **changes}))
    changes["LIBTORCH_USE_PYTORCH"] = "1"
    changes["LIBTORCH_BYPASS_VERSION_CHECK"] = "1" if tch.endswith("bypass") or tch == "none" else None
    # torch 2.15's headers need C++20; torch-sys 0.26 compiles its wrapper with -std=c++17, and cc
    # puts CXXFLAGS last, so this overrides it (the shim picks its standard from the headers itself).
    for aten in glob.glob(f"{venv}/lib/python3*/site-packages/torch/include/ATen/ATen.h"):
        if "C++20 or later" in Path(aten).read_text(errors="replace"):
            changes["CXXFLAGS"] = "-std=c++20" + (f" {env['CXXFLAGS']}" if env.get("CXXFLAGS") else "")
            break
    return changes


def pair_env(torch: str) -> dict:
    """This process's environment set up for torch `torch`'s pair, whatever the caller set up."""
    env = {k: v for k, v in os.environ.items() if k not in FOREIGN}
    for k, v in setup_libtorch(torch, env).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def cmd_setup_libtorch(args: argparse.Namespace) -> int:
    """setup_libtorch's changes as shell commands, for scripts/dev to eval."""
    for k, v in setup_libtorch(args.torch, dict(os.environ)).items():
        print(f"unset {k}" if v is None else f"export {k}={shlex.quote(v)}")
    return 0
