//! The training loops the registry benchmarks time (`registry_overhead`, `registry_own_work`):
//! a tiny 3-layer MLP (64 wide, batch 32: ~1 µs per op, the worst case) and the demo's small CNN
//! (batch 32, 28x28 images), each step forward + backward + optimizer step; and a thread that
//! runs backward passes, as CUDA autograd's device thread does.
use std::sync::mpsc;
use tch::nn::{self, Module, OptimizerConfig};
use tch::{Device, Kind, Tensor};

pub struct Loop {
    model: nn::Sequential,
    pub name: &'static str,
    opt: nn::Optimizer,
    x: Tensor,
    y: Tensor,
    _vs: nn::VarStore,
}

impl Loop {
    pub fn mlp() -> Self {
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

    pub fn cnn() -> Self {
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

    pub fn step(&mut self) -> f64 {
        let loss = self.model.forward(&self.x).cross_entropy_for_logits(&self.y);
        self.opt.backward_step(&loss);
        loss.double_value(&[])
    }

    /// A step with its backward pass on `backward`'s thread.
    pub fn step_two_threads(&mut self, backward: &BackwardThread) -> f64 {
        let loss = self.model.forward(&self.x).cross_entropy_for_logits(&self.y);
        let value = loss.double_value(&[]);
        self.opt.zero_grad();
        backward.run(loss);
        self.opt.step();
        value
    }
}

/// A thread that runs backward passes, one at a time, as CUDA autograd's device thread does.
pub struct BackwardThread {
    losses: mpsc::SyncSender<Tensor>,
    done: mpsc::Receiver<()>,
}

impl BackwardThread {
    pub fn start() -> Self {
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
