//! Per-op overhead of the live-tensor registry (and the wrapped CPU allocator) on two training
//! loops: a tiny 3-layer MLP (64 wide, batch 32: ~1 µs per op, the worst case) and the demo's
//! small CNN (batch 32, 28x28 images). Each step is forward + backward + optimizer step.
//! Target: under 25 % slower than the same loop without gpu-mem-track.
//!
//! The baselines run first, before anything is installed in this process. The number of op
//! callbacks per step is printed so the overhead can be read per op.
//!
//! The `two_threads` rows are CUDA's pattern on the CPU: CUDA autograd runs a device's backward
//! pass on a thread of its own, so the registry is used by the forward's thread and the
//! backward's in turn. Here the backward runs on a second thread, the forward and the optimizer
//! step on the caller's, for the same loops.
use criterion::{criterion_group, criterion_main, Criterion};
use std::sync::mpsc;
use std::time::Duration;
use tch::nn::{self, Module, OptimizerConfig};
use tch::{Device, Kind, Tensor};

struct Loop {
    model: nn::Sequential,
    name: &'static str,
    opt: nn::Optimizer,
    x: Tensor,
    y: Tensor,
    _vs: nn::VarStore,
}

impl Loop {
    fn mlp() -> Self {
        tch::manual_seed(0);
        let vs = nn::VarStore::new(Device::Cpu);
        let p = vs.root();
        let model = nn::seq()
            .add(nn::linear(&p / "l1", 64, 64, Default::default()))
            .add_fn(|x| x.relu())
            .add(nn::linear(&p / "l2", 64, 64, Default::default()))
            .add_fn(|x| x.relu())
            .add(nn::linear(&p / "l3", 64, 10, Default::default()));
        let opt = nn::Sgd { momentum: 0.9, ..Default::default() }.build(&vs, 1e-2).unwrap();
        let x = Tensor::randn([32, 64], (Kind::Float, Device::Cpu));
        let y = Tensor::randint(10, [32], (Kind::Int64, Device::Cpu));
        Loop { model, name: "mlp_step", opt, x, y, _vs: vs }
    }

    fn cnn() -> Self {
        tch::manual_seed(0);
        let vs = nn::VarStore::new(Device::Cpu);
        let p = vs.root();
        let padded = || nn::ConvConfig { padding: 1, ..Default::default() };
        let model = nn::seq()
            .add(nn::conv2d(&p / "c1", 1, 16, 3, padded()))
            .add_fn(|x| x.relu().max_pool2d_default(2))
            .add(nn::conv2d(&p / "c2", 16, 32, 3, padded()))
            .add_fn(|x| x.relu().max_pool2d_default(2).flatten(1, -1))
            .add(nn::linear(&p / "fc1", 32 * 7 * 7, 64, Default::default()))
            .add_fn(|x| x.relu())
            .add(nn::linear(&p / "fc2", 64, 10, Default::default()));
        let opt = nn::Adam::default().build(&vs, 1e-3).unwrap();
        let x = Tensor::rand([32, 1, 28, 28], (Kind::Float, Device::Cpu));
        let y = Tensor::randint(10, [32], (Kind::Int64, Device::Cpu));
        Loop { model, name: "cnn_step", opt, x, y, _vs: vs }
    }

    fn step(&mut self) -> f64 {
        let loss = self.model.forward(&self.x).cross_entropy_for_logits(&self.y);
        self.opt.backward_step(&loss);
        loss.double_value(&[])
    }

    /// A step with its backward pass on `backward`'s thread.
    fn step_two_threads(&mut self, backward: &BackwardThread) -> f64 {
        let loss = self.model.forward(&self.x).cross_entropy_for_logits(&self.y);
        let value = loss.double_value(&[]);
        self.opt.zero_grad();
        backward.run(loss);
        self.opt.step();
        value
    }
}

/// A thread that runs backward passes, one at a time, as CUDA autograd's device thread does.
struct BackwardThread {
    losses: mpsc::SyncSender<Tensor>,
    done: mpsc::Receiver<()>,
}

impl BackwardThread {
    fn start() -> Self {
        let (losses, todo) = mpsc::sync_channel::<Tensor>(1);
        let (finished, done) = mpsc::sync_channel(1);
        std::thread::spawn(move || {
            for loss in todo {
                loss.backward();
                drop(loss);
                if finished.send(()).is_err() {
                    break;
                }
            }
        });
        BackwardThread { losses, done }
    }

    fn run(&self, loss: Tensor) {
        self.losses.send(loss).expect("the backward thread runs");
        self.done.recv().expect("the backward thread answers");
    }
}

fn overhead(c: &mut Criterion) {
    tch::set_num_threads(1);
    let mut group = c.benchmark_group("training_step");
    group.warm_up_time(Duration::from_secs(2)).measurement_time(Duration::from_secs(6)).sample_size(30);
    let backward = BackwardThread::start();
    for make in [Loop::mlp, Loop::cnn] {
        let mut plain = make();
        group.bench_function(format!("{}/without_gpu_mem_track", plain.name), |b| b.iter(|| plain.step()));
        group.bench_function(format!("{}/two_threads/without_gpu_mem_track", plain.name), |b| {
            b.iter(|| plain.step_two_threads(&backward))
        });
    }
    gpu_mem_track::install().unwrap();
    for make in [Loop::mlp, Loop::cnn] {
        let mut tracked = make();
        let before = gpu_mem_track::registry_callbacks();
        tracked.step();
        let per_step = gpu_mem_track::registry_callbacks() - before;
        eprintln!("{}: {per_step} op callbacks per step", tracked.name);
        group.bench_function(format!("{}/with_registry_and_allocator", tracked.name), |b| {
            b.iter(|| tracked.step())
        });
        group.bench_function(format!("{}/two_threads/with_registry_and_allocator", tracked.name), |b| {
            b.iter(|| tracked.step_two_threads(&backward))
        });
        gpu_mem_track::set_registry_enabled(false).unwrap();
        group.bench_function(format!("{}/registry_paused", tracked.name), |b| b.iter(|| tracked.step()));
        gpu_mem_track::set_registry_enabled(true).unwrap();
    }
    group.finish();
}

criterion_group!(benches, overhead);
criterion_main!(benches);
