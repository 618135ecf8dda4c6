//! Prints what this build of gpu-mem-track and this machine can do: the libtorch it was compiled
//! against and runs on, the tch version, whether CUDA and the CUDA memory-history hooks were
//! compiled in (and why not), and whether NVML loads.
//!
//! `cargo run --example capabilities`
fn main() {
    println!("{}", gpu_mem_track::capabilities());
}
