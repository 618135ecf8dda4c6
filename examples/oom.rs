//! Reproduces an out-of-memory on a laptop: a training step under a CPU memory limit runs out in
//! its backward pass. The log ends with the out-of-memory block, and a snapshot lies beside it.
//!
//! ```text
//! cargo run --example oom
//! ```
use gpu_mem_track::{track, MemTracker, TrackedDevice};
use tch::nn::{self, Module, OptimizerConfig};
use tch::{Device, Kind, Tensor};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    gpu_mem_track::install()?;
    let tracker =
        MemTracker::builder().device(TrackedDevice::Cpu).cpu_memory_limit(14 << 20).op_names(true).build()?;
    let vs = nn::VarStore::new(Device::Cpu);
    let root = vs.root();
    let conv =
        |name, i, o| nn::conv2d(&root / name, i, o, 3, nn::ConvConfig { padding: 1, ..Default::default() });
    let net = nn::seq()
        .add(conv("conv1", 3, 32))
        .add_fn(|x| x.relu())
        .add(conv("conv2", 32, 64))
        .add_fn(|x| x.relu().flatten(1, -1))
        .add(nn::linear(&root / "fc", 64 * 32 * 32, 10, Default::default()));
    tracker.register_varstore(&vs)?;
    let mut opt = nn::Adam::default().build(&vs, 1e-3)?;
    track!(tracker);
    let x = Tensor::randn([16, 3, 32, 32], (Kind::Float, Device::Cpu));
    let y = Tensor::zeros([16], (Kind::Int64, Device::Cpu));
    let loss = net.forward(&x).cross_entropy_for_logits(&y);
    track!(tracker);
    match loss.f_backward() {
        Ok(()) => opt.step(),
        Err(e) => {
            eprintln!("the step failed as it would on a GPU: {}", e.to_string().lines().next().unwrap_or(""))
        }
    }
    println!("log: {}", tracker.log_path().display());
    Ok(())
}
