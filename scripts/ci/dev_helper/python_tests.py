"""The Python package's tests, its wheel installed as a user installs it into a fresh virtualenv
(`python-env`, `python`)."""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .checkout import DEV_PY, ROOT, rel
from .install_refusals import install_refusals
from .pairs import role
from .pins import PINS, TRAINERS
from .shell import ERR, log_raw, now, run, tail
from .wheel import build_wheel, wheel_dir
from .wheel_folder import pip


def python_summary(version: str, started: int, log_path: str) -> str:
    """python_tests' result line: the counts of every pytest summary line of its log."""
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for line in Path(log_path).read_text(errors="replace").splitlines():
        if re.match(r"(=+ )?[0-9]+ (passed|failed|skipped)", line):
            for word in counts:
                m = re.search(rf"([0-9]+) {word}", line)
                counts[word] += int(m.group(1)) if m else 0
    wheels = "\n".join(sorted(os.path.basename(w) for w in glob.glob(f"{wheel_dir(version)}/gpu_mem_track-*.whl")))
    return (
        f"python: torch {version}, wheel {wheels}: {counts['passed']} passed, {counts['failed']} failed,"
        f" {counts['skipped']} skipped in {now() - started} s (log: {rel(log_path)})"
    )


def crash_report(output: str) -> str:
    """Where a test process crashed (faulthandler's dump names the innermost frames first): the
    dump's first lines, or "" without one."""
    at = output.find("Fatal Python error")
    if at < 0:
        return ""
    lines = output[at:].splitlines(keepends=True)
    current = next((i for i, line in enumerate(lines) if line.startswith("Current thread")), 0)
    return "".join(lines[:2] + lines[current : current + 25])


def cmd_python_env(args: argparse.Namespace) -> int:
    """The wheel for torch VERSION (built here first) installed as a user installs it: a fresh
    virtualenv with only that torch, pytest and the packages after it, then the wheel
    (`pip install gpu-mem-track --no-index --find-links dist/torch-2.X`). Prints the virtualenv."""
    if build_wheel(args.version) is None:
        return 1
    venv = ROOT / f"target/python/venv-torch-{args.version}"
    shutil.rmtree(venv, ignore_errors=True)
    run(["python3", "-m", "venv", venv])
    if pip(f"{venv}/bin/python", "install", [f"torch=={args.version}", PINS["PYTEST"], *args.packages], stdout=ERR):
        return 1
    # Before the package is there (pip would keep an installed one and refuse nothing).
    if install_refusals(str(venv), args.version) != 0:
        return 1
    install = [f"{venv}/bin/pip", "install", "--quiet", "--disable-pip-version-check", "--no-index"]
    if run([*install, "--find-links", wheel_dir(args.version), "gpu-mem-track"], stdout=ERR).returncode:
        return 1
    print(venv)
    return 0


def python_tests(version: str) -> int:
    """Builds, installs and tests the Python package against torch `version`, one pytest process per
    test file (the registry and the wrapped CPU allocator are process-wide), outside the source tree
    (so `import gpu_mem_track` is the installed wheel); prints one result line."""
    started, log_path, rc = now(), ROOT / f"target/python/torch-{version}.log", 0
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text("")
    # torchvision, transformers and the trainers beside the main torch, for the estimator's ResNet-50
    # and Hugging Face models and the callbacks' tests (another torch's tests skip them).
    main = version == role("main")[0]
    extra = [f"torchvision=={PINS['MAIN_TORCHVISION']}", PINS["TRANSFORMERS"], *TRAINERS] if main else []
    # The estimator binary the main suite built against the main torch: estimate() must agree with it.
    binary = f"{ROOT}/target/debug/gpu-mem-track-estimate"
    binary = binary if main and os.access(binary, os.X_OK) else ""
    with open(log_path, "a") as f:
        r = run([sys.executable, DEV_PY, "python-env", version, *extra], stdout=subprocess.PIPE, stderr=f, text=True)
    venv = (r.stdout.splitlines() or [""])[-1]
    if r.returncode != 0 or not os.access(f"{venv}/bin/python", os.X_OK):
        print(f"python: torch {version}: the wheel did not build or install (log: {rel(log_path)})", flush=True)
        print(tail(log_path.read_text(errors="replace"), 30), end="", file=sys.stderr, flush=True)
        return 1
    work = tempfile.mkdtemp()
    # CC and CXX (ccache) are the build's: inductor's CPU backend, which compiled tests run, takes
    # CXX for a program to run, and a command line is none.
    env = {k: v for k, v in os.environ.items() if k not in ("CC", "CXX")} | {"GMT_ESTIMATE_BINARY": binary}
    failed: list[tuple[str, int, str]] = []
    for f in sorted(glob.glob(f"{ROOT}/gpu-mem-track-py/tests/test_*.py")):
        # A hung test file is killed after 10 minutes and named, instead of running into CI's limit.
        # -rfEs: the failures' and errors' one-line reasons beside the skips'.
        pytest = ["timeout", "600", f"{venv}/bin/python", "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", f]
        file_log = Path(work) / "file.log"
        with open(file_log, "w") as out:
            code = run(pytest, cwd=work, env=env, stdout=out, stderr=out).returncode
        output = file_log.read_text(errors="replace")
        with open(log_path, "a") as out:
            out.write(output)
            if code == 124:
                print(f"python: {rel(f)} TIMED OUT after 600 s", file=out)
                log_raw(f"python: {rel(f)} TIMED OUT after 600 s")
        if code != 0:
            # A crashed process (a signal) prints no summary: its exit status names it.
            failed.append((rel(f), code, output))
        rc = 1 if code != 0 else rc
    for line in log_path.read_text(errors="replace").splitlines():
        if re.match(r"python: torch .* refused", line):
            print(line)
    # 4-5 GB of torch a rerun makes afresh anyway.
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(venv, ignore_errors=True)
    print(python_summary(version, started, str(log_path)), flush=True)
    for name, code, output in failed:
        how = f"killed by signal {code - 128}" if code > 128 else ("timed out" if code == 124 else f"exit {code}")
        print(f"python: {name} FAILED ({how}):", file=sys.stderr)
        print(crash_report(output) or tail(output, 40), end="", file=sys.stderr, flush=True)
    return rc


def cmd_python(args: argparse.Namespace) -> int:
    # Every torch's tests, whatever the ones before did.
    return int(sum(python_tests(v) != 0 for v in args.versions) > 0)
