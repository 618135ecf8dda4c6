//! Where the time of a launch-bound CUDA training step goes while gpu-mem-track tracks it.
//!
//! An 8-layer MLP (width 256 and 2048, batch 64, ReLU, cross-entropy, tch's `nn::Adam`) steps on
//! `cuda:0` without a sync per step, so the CPU's time per op is what the step costs. Each stage
//! adds one part of the tracker to the one before, in one process (installing is process-wide):
//!
//! | stage | what runs |
//! |---|---|
//! | `without` | nothing of gpu-mem-track |
//! | `registry_paused` | `install()`, the per-op callback registered but paused |
//! | `registry` | the per-op callback recording every op's outputs |
//! | `track` | a `MemTracker` on `cuda:0` and a `track!()` after every step, NVML off |
//! | `track_nvml` | the same with NVML read at each `track!()` (the default) |
//!
//! Each figure is the median of 7 runs of 300 steps, in ms per step, after 50 warm-up steps. The
//! installed stages take turns run by run (the registry can be paused and resumed), so that a
//! machine's drift falls on all of them alike; `without` runs first, before anything is
//! installed. The op callbacks per step divide the cost into a cost per op. Without a CUDA device
//! it says so and measures nothing: the CPU's overhead is the `registry_overhead` bench's.
//!
//! ```text
//! cargo bench --bench cuda_step
//! ```
use std::time::Instant;
use tch::nn::{self, Module, OptimizerConfig};
use tch::{Device, Kind, Tensor};

const WIDTHS: [i64; 2] = [256, 2048];
const RUNS: usize = 7;
const STEPS: usize = 300;
const WARM_UP: usize = 50;

struct Mlp {
    model: nn::Sequential,
    opt: nn::Optimizer,
    x: Tensor,
    y: Tensor,
    _vs: nn::VarStore,
}

impl Mlp {
    fn new(width: i64, device: Device) -> Self {
        tch::manual_seed(0);
        let vs = nn::VarStore::new(device);
        let p = vs.root();
        let mut model = nn::seq();
        for layer in 0..8 {
            let out = if layer == 7 { 10 } else { width };
            model = model.add(nn::linear(&p / format!("l{layer}"), width, out, Default::default()));
            if layer < 7 {
                model = model.add_fn(|x| x.relu());
            }
        }
        let opt = nn::Adam::default().build(&vs, 1e-3).expect("Adam");
        let x = Tensor::randn([64, width], (Kind::Float, device));
        let y = Tensor::randint(10, [64], (Kind::Int64, device));
        Mlp { model, opt, x, y, _vs: vs }
    }

    fn step(&mut self) {
        let loss = self.model.forward(&self.x).cross_entropy_for_logits(&self.y);
        self.opt.backward_step(&loss);
    }
}

/// Ms per step of one run of `STEPS` steps; `after_step` runs after each step.
fn run(mlp: &mut Mlp, after_step: &mut dyn FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..STEPS {
        mlp.step();
        after_step();
    }
    tch::Cuda::synchronize(0);
    start.elapsed().as_secs_f64() * 1e3 / STEPS as f64
}

fn median(mut runs: Vec<f64>) -> f64 {
    runs.sort_by(f64::total_cmp);
    runs[runs.len() / 2]
}

fn main() {
    if gpu_mem_track::cuda_device_count() == 0 {
        eprintln!("cuda_step: libtorch sees no CUDA device; this bench measures a CUDA step, nothing ran");
        return;
    }
    let device = Device::Cuda(0);
    let mut without = Vec::new();
    for width in WIDTHS {
        let mut mlp = Mlp::new(width, device);
        (0..WARM_UP).for_each(|_| mlp.step());
        without.push(median((0..RUNS).map(|_| run(&mut mlp, &mut || {})).collect()));
    }
    gpu_mem_track::install().expect("install");
    let logs = std::env::temp_dir().join(format!("gmt-cuda-step-{}", std::process::id()));
    std::fs::create_dir_all(&logs).expect("a folder for the trackers' logs");
    let tracker = |nvml: bool| {
        gpu_mem_track::MemTracker::builder()
            .device(gpu_mem_track::TrackedDevice::Cuda(0))
            .log_dir(&logs)
            .nvml(nvml)
            .build()
            .expect("a tracker on cuda:0")
    };
    let (quiet, with_nvml) = (tracker(false), tracker(true));
    println!("ms per step (median of {RUNS} runs of {STEPS} steps; the installed stages take turns):");
    for (width, without) in WIDTHS.into_iter().zip(without) {
        let mut mlp = Mlp::new(width, device);
        (0..WARM_UP).for_each(|_| mlp.step());
        let before = gpu_mem_track::registry_callbacks();
        mlp.step();
        let callbacks = (gpu_mem_track::registry_callbacks() - before) as f64;
        // Turns, so that a machine's drift falls on every stage alike.
        let mut runs: [Vec<f64>; 4] = Default::default();
        for _ in 0..RUNS {
            gpu_mem_track::set_registry_enabled(false).expect("pause the registry");
            runs[0].push(run(&mut mlp, &mut || {}));
            gpu_mem_track::set_registry_enabled(true).expect("resume the registry");
            runs[1].push(run(&mut mlp, &mut || {}));
            runs[2].push(run(&mut mlp, &mut || {
                gpu_mem_track::track!(quiet);
            }));
            runs[3].push(run(&mut mlp, &mut || {
                gpu_mem_track::track!(with_nvml);
            }));
        }
        println!("width {width:>4} without          {without:.3} ms");
        let stages = ["registry_paused", "registry", "track", "track_nvml"];
        for (stage, runs) in stages.into_iter().zip(runs) {
            let ms = median(runs);
            println!(
                "width {width:>4} {stage:<16} {ms:.3} ms ({:+.1} %, {:.2} µs per op callback of {callbacks})",
                (ms / without - 1.0) * 100.0,
                (ms - without) * 1e3 / callbacks
            );
        }
    }
    let _ = std::fs::remove_dir_all(&logs);
}
