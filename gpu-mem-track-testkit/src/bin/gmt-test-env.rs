//! Prints the test cfgs this machine satisfies, comma-separated (`gmt_python_torch,gmt_torchvision`):
//! `scripts/dev` exports them as `GMT_TEST_CFGS` for the crates' build scripts.
fn main() {
    println!("{}", gpu_mem_track_testkit::environment::probe().join(","));
}
