//! The demo: a small CNN trained on generated data, with `track!()` between its steps.
//!
//! Runs on the GPU when libtorch sees one, else on the CPU. Writes
//! `logs/<timestamp>-gpu_mem_track.txt` and prints it at the end.
//!
//! ```text
//! cargo run --release --example train -- [--epochs N] [--batch N]
//! ```
use anyhow::{bail, Context, Result};
use gpu_mem_track::{track, track_memory, MemTracker, TrackedDevice};
use tch::nn::{self, Module, OptimizerConfig};
use tch::{Device, Kind, Tensor};

/// conv(1->16) - relu - pool - conv(16->32) - relu - pool - linear(32*7*7 -> 64) - relu - linear(64 -> 10)
fn cnn(p: &nn::Path) -> impl Module {
    nn::seq()
        .add(nn::conv2d(p / "conv1", 1, 16, 3, nn::ConvConfig { padding: 1, ..Default::default() }))
        .add_fn(|x| x.relu().max_pool2d_default(2))
        .add(nn::conv2d(p / "conv2", 16, 32, 3, nn::ConvConfig { padding: 1, ..Default::default() }))
        .add_fn(|x| x.relu().max_pool2d_default(2).flatten(1, -1))
        .add(nn::linear(p / "fc1", 32 * 7 * 7, 64, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(p / "fc2", 64, 10, Default::default()))
}

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
    opt.step();
    loss.double_value(&[])
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
    let vs = nn::VarStore::new(device);
    let model = cnn(&vs.root());
    tracker.watch_varstore(&vs)?;
    track!(tracker); // the parameters
    let mut opt = nn::Adam::default().build(&vs, 1e-3)?;

    let (test_x, test_y) = batch(512, device);
    track!(tracker); // the test set
    for epoch in 1..=epochs {
        let mut loss_sum = 0.0;
        for _ in 0..20 {
            let (x, y) = batch(batch_size, device);
            loss_sum += train_step(&tracker, &model, &mut opt, &x, &y);
        }
        let accuracy = tch::no_grad(|| model.forward(&test_x).accuracy_for_logits(&test_y).double_value(&[]));
        track!(tracker); // end of epoch: Adam's state is alive from the first step on
        println!("epoch {epoch}: mean loss {:.3}, test accuracy {:.1}%", loss_sum / 20.0, accuracy * 100.0);
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
