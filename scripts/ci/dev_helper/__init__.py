"""scripts/dev's helper: what a shell script does worse than Python, standard library only.

scripts/dev keeps what sets up the environment its commands build in (the virtualenv, libtorch,
ccache: exported variables) and the order of the steps; this package holds its usage text, the
torch<->tch table (read from scripts/ci/torch-pairs.tsv), pip from the wheel folder, the step
table, the ccache summary, and the checks that run no cargo build of ours: the shim against a
torch's headers, tch resolution beside a user's crate, wrong Python installs, the GPU bundle run
without cargo. Each is a subcommand (`python3 scripts/ci/dev.py --help`); scripts/dev calls them.

One job a module:
  cli               the subcommands and their arguments (argparse); main()
  usage             scripts/dev's usage text
  checkout          the checkout, spelled as scripts/dev spells it; paths relative to it
  shell             log lines, commands whose exit status is read, `date +%s`, `tail`
  pairs             the torch<->tch table and docs/compatibility.md's copy of it
  pins              the pinned Python tools, and `vars`, the table and the pins for the shell
  wheel_folder      pip from the wheel folder, with the versions of python-constraints.txt
  ccache            the environment that sends C and C++ through ccache, and its summary
  libtorch          the libtorch a build uses (a torch's virtualenv unless the user brings one)
  ci_disk           removing, in CI, what has served
  pair_tree         the tree a (tch, torch) pair builds in
  compat            the pair tests against other pairs
  wheel             the Python package's wheel against a torch
  install_refusals  what a user who installs the Python package wrongly gets
  python_tests      the Python package's tests, its wheel installed in a fresh virtualenv
  steps             the step table that ends `scripts/dev test` and `matrix`
  headers           the shim and the estimator's C++ against a torch's headers
  resolve           tch resolution beside a user's crate
  bundle_check      the GPU bundle run without cargo
  bench_package     which package holds a benchmark
"""
