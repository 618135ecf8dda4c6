//! The demo: a small CNN trained on generated data, with `track!()` between its steps.
//!
//! Runs on the GPU when libtorch sees one, else on the CPU. Writes
//! `logs/<timestamp>-gpu_mem_track.txt` and prints it at the end. The first epoch is also
//! recorded as a memory history: `...-snapshot.pickle` (open it in PyTorch's memory_viz) and
//! `...-timeline.png` (bytes by category over time) beside the log.
//!
//! ```text
//! cargo run --release --example train -- [--epochs N] [--batch N]
//! ```
use anyhow::{bail, Context, Result};
use gpu_mem_track::{track, track_memory, MemTracker, TrackedDevice};
use tch::nn::{self, Module, OptimizerConfig};
use tch::{Device, Kind, Tensor};

#[path = "demo/cnn.rs"]
mod demo;
use demo::cnn;

/// Images whose class is the brightest of ten horizontal bands: learnable, and generated on the spot.
fn batch(n: i64, device: Device) -> (Tensor, Tensor) {
    let images = Tensor::rand([n, 1, 28, 28], (Kind::Float, device));
    let labels = Tensor::randint(10, [n], (Kind::Int64, device));
    let band = Tensor::arange(28, (Kind::Int64, device)).divide_scalar_mode(3, "floor").clamp_max(9);
    let bright = band.unsqueeze(0).eq_tensor(&labels.unsqueeze(1)).to_kind(Kind::Float); // [n, 28]
    let images = images + bright.view([n, 1, 28, 1]) * 0.5;
    (images, labels)
}

#[track_memory(tracker = tracker)]
fn train_step(
    tracker: &MemTracker,
    model: &impl Module,
    opt: &mut nn::Optimizer,
    x: &Tensor,
    y: &Tensor,
) -> f64 {
    let logits = model.forward(x);
    track!(tracker); // activations and the autograd graph are alive here
    let loss = logits.cross_entropy_for_logits(y);
    opt.zero_grad();
    loss.backward();
    track!(tracker); // gradients appeared, the graph is gone
    tracker.optimizer_step(|| opt.step()); // what it keeps is optimizer state in the history
    loss.double_value(&[])
}

/// The first epoch's history as a memory_viz snapshot and a timeline by category.
fn write_history(tracker: &MemTracker) -> Result<()> {
    let stem = tracker.log_path().with_extension("");
    let stem = stem.to_string_lossy();
    let history = tracker.history();
    let snapshot = format!("{stem}-snapshot.pickle");
    history.dump_snapshot(std::path::Path::new(&snapshot))?;
    let trace = history.trace();
    let timeline = format!("{stem}-timeline.png");
    gpu_mem_track::plot::plot_timeline(
        &trace,
        "demo, first epoch: memory by category",
        std::path::Path::new(&timeline),
    )?;
    let (allocs, frees) = history.counts();
    println!("history: {allocs} allocations, {frees} frees ({} dropped by the ring)", history.dropped);
    if let Some(peak) = trace.peak() {
        let parts: Vec<String> = peak
            .bytes
            .iter()
            .filter(|b| b.1 > 0)
            .map(|(c, b)| format!("{} {:.2} MiB", c.name(), *b as f64 / 1048576.0))
            .collect();
        println!("history peak {:.2} MiB = {}", peak.total as f64 / 1048576.0, parts.join(" + "));
    }
    println!("snapshot: {snapshot}\ntimeline: {timeline}");
    Ok(())
}

fn arg(name: &str, default: i64) -> Result<i64> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == name) {
        None => Ok(default),
        Some(i) => {
            let v = args.get(i + 1).with_context(|| format!("{name} needs a value"))?;
            v.parse().with_context(|| format!("{name} {v:?} is not a whole number"))
        }
    }
}

fn main() -> Result<()> {
    // What this build and machine can do (libtorch, tch, CUDA, CUDA history, NVML).
    println!("{}\n", gpu_mem_track::capabilities());
    tracing_subscriber::fmt().with_env_filter("gpu_mem_track=warn").with_writer(std::io::stderr).init();
    let epochs = arg("--epochs", 3)?;
    let batch_size = arg("--batch", 128)?;
    if epochs < 1 || batch_size < 1 {
        bail!("--epochs and --batch must be at least 1");
    }
    let device = Device::cuda_if_available();
    // Install the hooks before the first tensor so every tensor is seen.
    let tracker = MemTracker::builder().device(TrackedDevice::try_from(device)?).build()?;
    println!("training on {} ; log: {}", tracker.device(), tracker.log_path().display());

    track!(tracker);
    // History from before the model exists, so parameters are in it; a ring bounds its memory.
    let history = tracker.record_history(200_000);
    if let Err(e) = &history {
        eprintln!("no memory history: {e}");
    }
    let vs = nn::VarStore::new(device);
    let model = cnn(&vs.root());
    tracker.register_varstore(&vs)?;
    track!(tracker); // the parameters
    let mut opt = nn::Adam::default().build(&vs, 1e-3)?;

    let (test_x, test_y) = batch(512, device);
    tracker.tag_input(&test_x);
    track!(tracker); // the test set
    for epoch in 1..=epochs {
        let mut loss_sum = 0.0;
        for _ in 0..20 {
            let (x, y) = batch(batch_size, device);
            tracker.tag_input(&x);
            loss_sum += train_step(&tracker, &model, &mut opt, &x, &y);
        }
        let accuracy = tch::no_grad(|| model.forward(&test_x).accuracy_for_logits(&test_y).double_value(&[]));
        track!(tracker); // end of epoch: Adam's state is alive from the first step on
        println!("epoch {epoch}: mean loss {:.3}, test accuracy {:.1}%", loss_sum / 20.0, accuracy * 100.0);
        if epoch == 1 && history.is_ok() {
            tracker.stop_history()?;
            write_history(&tracker)?;
        }
    }
    drop((test_x, test_y));
    let released = tracker.clear_cache()?;
    track!(tracker);
    println!("clear_cache released {released} bytes");

    let log = std::fs::read_to_string(tracker.log_path())?;
    let lines: Vec<&str> = log.lines().collect();
    println!("\n==> {} ({} lines; first 40 shown)\n", tracker.log_path().display(), lines.len());
    for l in lines.iter().take(40) {
        println!("{l}");
    }
    Ok(())
}
