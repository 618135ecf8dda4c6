//! tch models estimated on the meta device equal a CPU run of the same step.
use gpu_mem_track_testkit as common;

use common::{GPU_ALLOCATED_ABOVE_PCT, GPU_ALLOCATED_BELOW_PCT, GPU_RESERVED_PCT};
use gpu_mem_track::{MemTracker, TrackedDevice};
use gpu_mem_track_estimate::runtime::{
    largest_cudnn_workspace, place_runtime_allocations, RuntimeKind, RuntimeSizes,
};
use gpu_mem_track_estimate::Phase;
use gpu_mem_track_estimate::{
    inference_step, training_step, EstimateDevice, Mode, Optimizer, Precision, TchStepOptions,
};
use tch::nn::{self, Module, ModuleT, OptimizerConfig, RNN};
use tch::{Kind, Tensor};

fn cnn(p: &nn::Path) -> nn::SequentialT {
    let padded = || nn::ConvConfig { padding: 1, ..Default::default() };
    nn::seq_t()
        .add(nn::conv2d(p / "c1", 1, 16, 3, padded()))
        .add(nn::batch_norm2d(p / "bn", 16, Default::default()))
        .add_fn(|x| x.relu().max_pool2d_default(2))
        .add(nn::conv2d(p / "c2", 16, 32, 3, padded()))
        .add_fn(|x| x.relu().max_pool2d_default(2).flatten(1, -1))
        .add(nn::linear(p / "fc", 32 * 7 * 7, 10, Default::default()))
}

fn within(meta: u64, cpu: u64, what: &str) {
    let diff = (meta as f64 - cpu as f64).abs() / cpu as f64 * 100.0;
    println!("  {what:<20} meta {meta:>12} cpu {cpu:>12} diff {diff:.3} %");
    assert!(diff <= 2.0, "{what}: meta {meta} vs cpu {cpu}: {diff:.2} %");
}

#[test]
fn native_cnn_step_on_meta_matches_the_cpu() {
    let step = |m: &nn::SequentialT, x: &Tensor, y: &Tensor| m.forward_t(x, true).cross_entropy_for_logits(y);
    let options = |device| TchStepOptions {
        input_shape: vec![32, 1, 28, 28],
        input_is_index: false,
        target_shape: vec![32],
        precision: Precision::F32,
        optimizer: Optimizer::Adam,
        device,
    };
    let (meta, trace) = training_step(cnn, step, &options(EstimateDevice::Meta)).unwrap();
    let (cpu, _) = training_step(cnn, step, &options(EstimateDevice::Cpu)).unwrap();
    assert_eq!(meta.sizes.param_count, (16 * 9 + 16) + 32 + (32 * 16 * 9 + 32) + (32 * 49 * 10 + 10));
    assert_eq!(meta.sizes.param_bytes, cpu.sizes.param_bytes);
    assert_eq!(meta.sizes.optimizer_state_bytes, 2 * meta.sizes.param_bytes);
    within(meta.live_after_forward, cpu.live_after_forward, "live after forward");
    within(meta.forward_peak, cpu.forward_peak, "forward peak");
    within(meta.peak.bytes, cpu.peak.bytes, "training step peak");
    // A GPU run's library allocations are placed at the calls a meta run records.
    let placed = place_runtime_allocations(
        &trace,
        RuntimeSizes { cublas_workspace: 1, cublaslt_workspace: 0, cudnn_workspaces: true },
    );
    let kinds: Vec<RuntimeKind> = placed.iter().map(|r| r.kind).collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == RuntimeKind::CublasWorkspace).count(),
        2,
        "the linear layer's matmul forward (the program's thread) and backward (autograd's)"
    );
    // Two convolutions forward and two backward (per iteration, two iterations).
    assert_eq!(kinds.iter().filter(|k| **k == RuntimeKind::CudnnWorkspace).count(), 8, "{placed:?}");
    // The first convolution's high-end workspace is what its meta kernel saw: 9/8 of its operands
    // (input 32x1x28x28, output 32x16x28x28, weight 16x1x3x3, float32) plus 16 bytes.
    let first = placed.iter().find(|r| r.kind == RuntimeKind::CudnnWorkspace).unwrap();
    assert_eq!(first.bytes, (32 * 28 * 28 + 32 * 16 * 28 * 28 + 16 * 9) * 4 / 8 * 9 + 16);
    assert!(largest_cudnn_workspace(&trace) > 0);
}

#[test]
fn a_failing_step_is_an_error_naming_the_problem() {
    let options = TchStepOptions {
        input_shape: vec![4, 7],
        input_is_index: false,
        target_shape: vec![],
        precision: Precision::F32,
        optimizer: Optimizer::Sgd,
        device: EstimateDevice::Meta,
    };
    let build = |p: &nn::Path| nn::linear(p / "l", 8, 2, Default::default());
    let e = training_step(build, |m, x, _| m.forward(x).sum(Kind::Float), &options).unwrap_err();
    let msg = e.to_string();
    assert!(msg.starts_with("the step failed"), "{msg}");
    assert_eq!(msg.lines().count(), 1);
}

/// Dropout, hardtanh, hardswish and roll have hand-written meta kernels (elementwise over whole
/// activations: copying them to the CPU would cost what the estimate avoids); log_sigmoid and
/// prelu's backward have no Meta kernel in libtorch C++ and run their CPU kernel on CPU copies of
/// their meta inputs. Either way the estimate equals the CPU run, but for what `at::dropout`
/// keeps, which follows the GPU's kernel.
#[test]
fn ops_without_a_meta_kernel_run_their_cpu_kernel_and_match_the_cpu() {
    fn mlp(p: &nn::Path) -> nn::Sequential {
        let slope = p.var("slope", &[1], nn::Init::Const(0.25));
        nn::seq()
            .add(nn::linear(p / "l1", 64, 256, Default::default()))
            .add_fn(|x| x.hardtanh().dropout(0.1, true).roll([1], [1]))
            .add(nn::linear(p / "l2", 256, 256, Default::default()))
            .add_fn(|x| x.hardswish().native_dropout(0.2, true).0.log_sigmoid())
            .add_fn(move |x| x.prelu(&slope))
            .add(nn::linear(p / "l3", 256, 10, Default::default()))
    }
    let step = |m: &nn::Sequential, x: &Tensor, y: &Tensor| m.forward(x).cross_entropy_for_logits(y);
    let options = |device| TchStepOptions { device, ..adam(Precision::F32, &[32, 64], false, &[32]) };
    let (meta, _) = training_step(mlp, step, &options(EstimateDevice::Meta)).unwrap();
    let (cpu, _) = training_step(mlp, step, &options(EstimateDevice::Cpu)).unwrap();
    // What the forward pass keeps is the CPU run's to the byte but for `dropout`'s mask: on meta,
    // as on a GPU, `at::dropout` runs the fused kernel, which keeps a bool mask; the CPU draws
    // float noise and keeps that, three bytes more for each of its 32x256 elements.
    assert_eq!(meta.live_after_forward + 3 * 32 * 256, cpu.live_after_forward);
    // Peaks: CPU kernels' own temporaries are CPU memory the meta run leaves out (a GPU's fused
    // kernel makes only the output and the mask), so meta is at most the CPU run.
    assert!(meta.forward_peak <= cpu.forward_peak, "{} > {}", meta.forward_peak, cpu.forward_peak);
    within(meta.peak.bytes, cpu.peak.bytes, "training step peak");
    let ops: Vec<&str> = meta.cpu_fallback.iter().map(|o| o.op.as_str()).collect();
    for op in ["aten::log_sigmoid_forward", "aten::log_sigmoid_backward", "aten::_prelu_kernel_backward"] {
        assert!(ops.contains(&op), "{op} not in {ops:?}");
    }
    for op in
        ["aten::native_dropout", "aten::native_dropout_backward", "aten::roll", "aten::hardtanh_backward"]
    {
        assert!(!ops.contains(&op), "{op} has a meta kernel of its own: {ops:?}");
    }
    // One per forward, two iterations; the copies are that op's input (32x256 floats).
    let log_sigmoid = meta.cpu_fallback.iter().find(|o| o.op == "aten::log_sigmoid_forward").unwrap();
    assert_eq!(log_sigmoid.calls, 2);
    assert_eq!(log_sigmoid.bytes, 2 * 32 * 256 * 4);
    assert!(cpu.cpu_fallback.is_empty(), "a CPU run needs no fallback");
    assert!(meta.to_string().contains("ran on the CPU for want of a meta kernel"), "{meta}");
}

/// An Adam step's options (the device is set per run).
fn adam(
    precision: Precision,
    input_shape: &[i64],
    input_is_index: bool,
    target_shape: &[i64],
) -> TchStepOptions {
    TchStepOptions {
        input_shape: input_shape.to_vec(),
        input_is_index,
        target_shape: target_shape.to_vec(),
        precision,
        optimizer: Optimizer::Adam,
        device: EstimateDevice::Meta,
    }
}

/// Meta within 2 % of the CPU.
fn within_two_percent(meta: u64, cpu: u64, what: &str) {
    let diff = (meta as f64 - cpu as f64) / cpu as f64 * 100.0;
    println!("  {what:<20} meta {meta:>12} cpu {cpu:>12} diff {diff:.3} %");
    assert!(diff.abs() <= 2.0, "{what}: meta {meta} and cpu {cpu} differ by {diff:.3} %");
}

/// How far CPU memory rose above its level before `f` while `f` ran, read by a CPU tracker (the
/// wrapped CPU allocator's peak window): an independent witness of the estimate's own
/// `cpu_tensors` count.
fn cpu_rise_during<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let dir = tempfile::tempdir().unwrap();
    let tracker = MemTracker::builder().device(TrackedDevice::Cpu).log_dir(dir.path()).build().unwrap();
    let before = tracker.track().unwrap().allocator.allocated;
    let out = f();
    let during = tracker.track().unwrap().allocator.peak_since_previous;
    (out, during.saturating_sub(before))
}

/// Estimates `build`/`step` on meta and on the CPU and checks that they agree within 2 % (peak and
/// live after forward), and that the meta run made no tensor on the CPU.
fn meta_matches_cpu<M>(
    what: &str,
    case: TchStepOptions,
    build: impl Fn(&nn::Path) -> M,
    step: impl Fn(&M, &Tensor, &Tensor) -> Tensor,
) -> gpu_mem_track_estimate::Estimate {
    let options = |device| TchStepOptions { device, ..case.clone() };
    let (cpu, _) = training_step(&build, &step, &options(EstimateDevice::Cpu)).unwrap();
    let (meta, cpu_rise) = cpu_rise_during(|| {
        training_step(&build, &step, &options(EstimateDevice::Meta))
            .unwrap_or_else(|e| panic!("{what} on meta: {e}"))
    });
    let (meta, _) = meta;
    println!("{what}:");
    within_two_percent(meta.live_after_forward, cpu.live_after_forward, "live after forward");
    within_two_percent(meta.peak.bytes, cpu.peak.bytes, "training step peak");
    assert_eq!(meta.sizes.param_bytes, cpu.sizes.param_bytes, "{what}");
    assert_eq!(meta.cpu_tensors.made_on_cpu, 0, "{what}: {:?}", meta.cpu_tensors);
    assert_eq!(meta.cpu_tensors.moved_to_meta, 0, "{what}: {:?}", meta.cpu_tensors);
    // The meta-via-CPU fallback's copies are the only CPU tensors a meta estimate may make; the
    // rest is scalars ops wrap as 0-dim CPU tensors (8 bytes each, freed at once). The smallest
    // tensor these models would make on the CPU is larger (an RNN state: 8 KiB and up).
    println!("  CPU memory rose by {cpu_rise} bytes during the meta estimate");
    if meta.cpu_fallback.is_empty() {
        assert!(cpu_rise < 512, "{what}: CPU memory rose by {cpu_rise} bytes during the meta estimate");
    }
    meta
}

enum Recurrent {
    Lstm(nn::LSTM),
    Gru(nn::GRU),
}

struct Rnn {
    rnn: Recurrent,
    head: nn::Linear,
}

/// An RNN's shape: LSTM or GRU, layers, batch first, bidirectional; features in, hidden size,
/// classes out of the linear head; and the rest of tch's `RNNConfig`: biases, dropout between
/// layers.
#[derive(Clone, Copy)]
struct RnnShape {
    lstm: bool,
    num_layers: i64,
    batch_first: bool,
    bidirectional: bool,
    features: i64,
    hidden: i64,
    classes: i64,
    has_biases: bool,
    dropout: f64,
}

impl RnnShape {
    fn directions(self) -> i64 {
        if self.bidirectional {
            2
        } else {
            1
        }
    }

    /// Builds the LSTM or GRU with its linear head.
    fn build(self) -> impl Fn(&nn::Path) -> Rnn + Copy {
        move |p: &nn::Path| {
            let config = nn::RNNConfig {
                num_layers: self.num_layers,
                batch_first: self.batch_first,
                bidirectional: self.bidirectional,
                has_biases: self.has_biases,
                dropout: self.dropout,
                ..Default::default()
            };
            let rnn = if self.lstm {
                Recurrent::Lstm(nn::lstm(p / "rnn", self.features, self.hidden, config))
            } else {
                Recurrent::Gru(nn::gru(p / "rnn", self.features, self.hidden, config))
            };
            let head =
                nn::linear(p / "head", self.directions() * self.hidden, self.classes, Default::default());
            Rnn { rnn, head }
        }
    }

    /// A step: the RNN over the whole sequence, the head on every step, cross-entropy.
    fn step(self) -> impl Fn(&Rnn, &Tensor, &Tensor) -> Tensor + Copy {
        move |m: &Rnn, x: &Tensor, y: &Tensor| {
            // tch's `seq` takes the batch from dimension 0; sequence-first input
            // needs its own zero state (made on the build device, as `seq`'s is).
            let b = x.size()[if self.batch_first { 0 } else { 1 }];
            let out = match &m.rnn {
                Recurrent::Lstm(l) => l.seq_init(x, &l.zero_state(b)).0,
                Recurrent::Gru(g) => g.seq_init(x, &g.zero_state(b)).0,
            };
            m.head.forward(&out).view([-1, self.classes]).cross_entropy_for_logits(y)
        }
    }
}

/// tch's LSTM and GRU make their zero state with the device the model was built on (the CPU of
/// the estimate's VarStore): on meta, that state is made on meta.
///
/// In half precision: a float32 RNN on the CPU runs oneDNN's fused kernel (`mkldnn_rnn_layer`),
/// which keeps a workspace of its own for backward, about twice what PyTorch's own cell ops keep
/// (char-rnn: 40.4 vs 21.0 MiB live after forward). In half precision with gradients on, the CPU
/// takes PyTorch's own path (RNN.cpp), and the meta run takes it as the CPU does (input projection
/// of all steps at once), so the two runs keep the same tensors.
#[test]
fn tch_lstm_and_gru_estimate_on_meta_like_the_cpu() {
    let (batch, seq, features, hidden, classes) = (32i64, 24i64, 32i64, 128i64, 10i64);
    for (lstm, num_layers, batch_first, bidirectional) in rnn_cases() {
        // Biases, no dropout: tch's defaults, as in char-rnn.
        let rnn =
            RnnShape { lstm, num_layers, batch_first, bidirectional, features, hidden, classes, ..CHAR_RNN };
        let (directions, build, step) = (rnn.directions(), rnn.build(), rnn.step());
        let shape = if batch_first { [batch, seq, features] } else { [seq, batch, features] };
        let what = format!(
            "{} {num_layers} layer(s){}{}",
            if lstm { "lstm" } else { "gru" },
            if batch_first { ", batch first" } else { "" },
            if bidirectional { ", bidirectional" } else { "" }
        );
        let case = adam(Precision::F16, &shape, false, &[batch * seq]);
        // A CPU run takes PyTorch's own RNN path; so does the meta run held to it.
        gpu_mem_track_estimate::meta_rnns_take_cudnn_path(false);
        let meta = meta_matches_cpu(&what, case, build, step);
        // The recurrent weights of every layer are parameters.
        let per_gate = if lstm { 4 } else { 3 };
        let layer = |input: i64| directions * per_gate * hidden * (input + hidden + 2);
        let rnn_params = layer(features) + (num_layers - 1) * layer(directions * hidden);
        let head = directions * hidden * classes + classes;
        assert_eq!(meta.sizes.param_count as i64, rnn_params + head, "{what}");
    }
}

/// (lstm, layers, batch first, bidirectional): every combination.
fn rnn_cases() -> Vec<(bool, i64, bool, bool)> {
    let mut all = Vec::new();
    for lstm in [true, false] {
        for layers in [1, 2] {
            for batch_first in [true, false] {
                for bidirectional in [false, true] {
                    all.push((lstm, layers, batch_first, bidirectional));
                }
            }
        }
    }
    all
}

/// tch's char-rnn model: an LSTM over the labels and a linear layer back to them.
struct CharRnn {
    lstm: nn::LSTM,
    linear: nn::Linear,
}

impl CharRnn {
    fn new(p: &nn::Path, labels: i64, hidden: i64) -> Self {
        CharRnn {
            lstm: nn::lstm(p, labels, hidden, Default::default()),
            linear: nn::linear(p, hidden, labels, Default::default()),
        }
    }
}

/// tch's char-rnn example: `nn::lstm` + `nn::linear`, one-hot input (made with the input's
/// device), Adam, `cross_entropy_for_logits`; half precision as above.
#[test]
fn char_rnn_estimates_on_meta_like_the_cpu() {
    let (labels, hidden, batch, seq) = (65i64, 256i64, 32i64, 64i64);
    let build = |p: &nn::Path| CharRnn::new(p, labels, hidden);
    let step = |m: &CharRnn, xs: &Tensor, ys: &Tensor| {
        let onehot = xs.onehot(labels).to_kind(m.linear.ws.kind());
        let (out, _) = m.lstm.seq(&onehot);
        let logits = m.linear.forward(&out);
        logits.view([batch * seq, labels]).cross_entropy_for_logits(&ys.view([batch * seq]))
    };
    let case = adam(Precision::F16, &[batch, seq], true, &[batch, seq]);
    gpu_mem_track_estimate::meta_rnns_take_cudnn_path(false);
    let meta = meta_matches_cpu("char-rnn", case, build, step);
    assert_eq!(meta.sizes.param_count as i64, 4 * hidden * (labels + hidden + 2) + hidden * labels + labels);
    // What the forward keeps for backward dominates: the gates of all 64 steps, at least.
    assert!(meta.live_after_forward > (seq * batch * 4 * hidden * 2) as u64, "{meta}");
}

/// A model that keeps the device it was built on and makes a causal mask and a position table
/// there in `forward`, as users write them.
struct Masked {
    device: tch::Device,
    positions: nn::Embedding,
    proj: nn::Linear,
    head: nn::Linear,
}

const MASKED: (i64, i64, i64) = (4, 24, 32); // batch, sequence, width

fn masked(p: &nn::Path) -> Masked {
    let (_, seq, dim) = MASKED;
    Masked {
        device: p.device(),
        positions: nn::embedding(p / "pos", seq, dim, Default::default()),
        proj: nn::linear(p / "proj", dim, dim, Default::default()),
        head: nn::linear(p / "head", dim, 3, Default::default()),
    }
}

impl Masked {
    fn logits(&self, x: &Tensor) -> Tensor {
        let t = x.size()[1];
        let pos = self.positions.forward(&Tensor::arange(t, (Kind::Int64, self.device)));
        let h = self.proj.forward(&(x + pos));
        let scores = h.matmul(&h.transpose(-2, -1)) / (MASKED.2 as f64).sqrt();
        let mask = Tensor::ones([t, t], (Kind::Bool, self.device)).tril(0).logical_not();
        let attn = scores.masked_fill(&mask, f64::NEG_INFINITY).softmax(-1, Kind::Float);
        self.head.forward(&attn.matmul(&h).mean_dim(1, false, Kind::Float))
    }
}

#[test]
fn masks_made_on_the_build_device_in_forward_land_on_meta() {
    let (batch, seq, dim) = MASKED;
    let build = masked;
    let step = |m: &Masked, x: &Tensor, y: &Tensor| m.logits(x).cross_entropy_for_logits(y);
    meta_matches_cpu(
        "masked attention",
        adam(Precision::F32, &[batch, seq, dim], false, &[batch]),
        build,
        step,
    );
}

/// A forward-only estimate of the same model: no gradients, no optimizer, the same mask on meta.
#[test]
fn inference_of_a_tch_model_estimates_on_meta_like_the_cpu() {
    let (batch, seq, dim) = MASKED;
    let options = |device| TchStepOptions { device, ..adam(Precision::F32, &[batch, seq, dim], false, &[]) };
    let forward = |m: &Masked, x: &Tensor| m.logits(x);
    let (cpu, _) = inference_step(masked, forward, &options(EstimateDevice::Cpu)).unwrap();
    let (meta, _) = inference_step(masked, forward, &options(EstimateDevice::Meta)).unwrap();
    assert_eq!(meta.options.mode, Mode::Inference);
    assert_eq!((meta.sizes.grad_bytes, meta.sizes.optimizer_state_bytes), (0, 0));
    assert_eq!(meta.sizes.param_bytes, cpu.sizes.param_bytes);
    assert_eq!(meta.cpu_tensors.made_on_cpu + meta.cpu_tensors.moved_to_meta, 0, "{:?}", meta.cpu_tensors);
    within(meta.forward_peak, cpu.forward_peak, "inference peak");
    // Without autograd nothing is kept: after the forward, parameters, input (and the output).
    let kept = meta.sizes.param_bytes + meta.sizes.input_bytes;
    assert!(meta.live_after_forward >= kept && meta.live_after_forward <= kept + 1024, "{meta}");
}

/// The redirection is this thread's, for the estimate only: CPU work on another thread during
/// the estimate, and on this one after it, stays on the CPU.
#[test]
fn cpu_work_elsewhere_during_an_estimate_stays_on_the_cpu() {
    let options = TchStepOptions {
        input_shape: vec![4, 8],
        input_is_index: false,
        target_shape: vec![4],
        precision: Precision::F32,
        optimizer: Optimizer::Sgd,
        device: EstimateDevice::Meta,
    };
    let build = |p: &nn::Path| nn::linear(p / "l", 8, 3, Default::default());
    let seen = std::sync::Mutex::new(Vec::new());
    let step = |m: &nn::Linear, x: &Tensor, y: &Tensor| {
        let here = Tensor::zeros([2], (Kind::Float, tch::Device::Cpu));
        let there = std::thread::scope(|s| {
            s.spawn(|| {
                let t = Tensor::ones([3], (Kind::Float, tch::Device::Cpu)) * 2.0;
                (t.device(), f64::try_from(t.sum(Kind::Float)).unwrap())
            })
            .join()
            .unwrap()
        });
        seen.lock().unwrap().push((here.device(), there));
        m.forward(x).cross_entropy_for_logits(y)
    };
    training_step(build, step, &options).unwrap();
    let seen = seen.into_inner().unwrap();
    assert_eq!(seen.len(), 2, "two iterations");
    for (here, (there, sum)) in seen {
        // tch names a meta tensor's device Mps (it has no variant for meta).
        assert_eq!(here, tch::Device::Mps, "on the estimating thread, the CPU means meta");
        assert_eq!(there, tch::Device::Cpu, "another thread's tensors stay on the CPU");
        assert_eq!(sum, 6.0, "and hold their values");
    }
    let after = Tensor::from_slice(&[1.0f32, 2.0]) + Tensor::ones([2], (Kind::Float, tch::Device::Cpu));
    assert_eq!(after.device(), tch::Device::Cpu);
    assert_eq!(Vec::<f32>::try_from(&after).unwrap(), vec![2.0, 3.0]);
}

/// Every meta kernel the shim registers gives the CPU kernel's result sizes, strides and dtypes,
/// for several shapes each (a transposed input among them for elementwise ops); where meta
/// follows a GPU kernel's layout on purpose (fused attention), sizes and dtypes.
#[test]
fn every_meta_kernel_of_the_shim_matches_the_cpu_kernel() {
    let (cases, registered) = gpu_mem_track_estimate::check_meta_kernels().unwrap();
    assert!(registered.len() >= 36, "{registered:?}");
    for op in &registered {
        assert!(cases.iter().any(|c| &c.op == op), "no case checks the meta kernel of {op}");
    }
    for c in &cases {
        println!("{:<55} {:<60} {}", c.op, c.inputs, c.verdict);
    }
    let wrong: Vec<String> =
        cases.iter().filter(|c| !c.ok()).map(|c| format!("{} {}: {}", c.op, c.inputs, c.verdict)).collect();
    assert!(wrong.is_empty(), "{} of {} cases differ:\n{}", wrong.len(), cases.len(), wrong.join("\n"));
    assert!(cases.len() >= 100, "{} cases", cases.len());
}

/// tch's char-rnn as issue 28 measured it on an H200 (PyTorch 2.11, tch 0.24, `cuda:0`):
/// `nn::lstm(65 -> 256)` + `nn::linear`, float input 32x64x65, `cross_entropy_for_logits`, Adam,
/// two steps: peak allocated 105.8 MiB, reserved 114.0 MiB. The h100-80g prediction (sm 9.0, as
/// the H200) must lie within 5 % of both; on PyTorch's own RNN path (the CPU's) it was 10 % under.
#[test]
fn char_rnn_on_an_h100_profile_is_within_five_percent_of_the_h200() {
    use gpu_mem_track_estimate::profile::{predict, DeviceProfile};
    let (labels, hidden, batch, seq) = (65i64, 256i64, 32i64, 64i64);
    let build = |p: &nn::Path| CharRnn::new(p, labels, hidden);
    let step = |m: &CharRnn, xs: &Tensor, ys: &Tensor| {
        let (out, _) = m.lstm.seq(xs);
        let logits = m.linear.forward(&out);
        logits.view([batch * seq, labels]).cross_entropy_for_logits(&ys.view([batch * seq]))
    };
    let h100 = DeviceProfile::find("h100-80g").unwrap();
    let case = adam(Precision::F32, &[batch, seq, labels], false, &[batch, seq]);
    let (_, trace) = training_step(build, step, &case).unwrap();
    let g = predict(&h100, &trace, None);
    let mib = |b: u64| b as f64 / 1048576.0;
    for (what, gpu, low, high) in [
        ("allocated", 105.8, mib(g.peak_allocated.low), mib(g.peak_allocated.high)),
        ("reserved", 114.0, mib(g.peak_reserved.low), mib(g.peak_reserved.high)),
    ] {
        println!("peak {what}: GPU {gpu} MiB, predicted {low:.1}-{high:.1} MiB");
        assert!(
            low <= gpu * 1.05 && high >= gpu * 0.95,
            "peak {what}: GPU {gpu}, predicted {low:.1}-{high:.1}"
        );
    }
}

/// A tch RNN trained on `cuda:0` as issue 28 measured the char-rnn (float input 32x64xfeatures,
/// batch first, the head on every step, cross-entropy, two steps of tch's `nn::Adam`) against the
/// h100-80g prediction of the same step, held to the GPU table's acceptance: the GPU's peak
/// allocated at most 1 % above the predicted high end and at most 3 % below its low end, reserved
/// within 5 %. Prints both, so a GPU run reports its figures.
fn rnn_on_cuda_fits_its_h100_prediction(rnn: RnnShape) {
    use gpu_mem_track_estimate::profile::{predict, DeviceProfile};
    let (batch, seq) = (32i64, 64i64);
    let shape = if rnn.batch_first { [batch, seq, rnn.features] } else { [seq, batch, rnn.features] };
    let (build, step) = (rnn.build(), rnn.step());
    let (_, trace) =
        training_step(build, step, &adam(Precision::F32, &shape, false, &[batch * seq])).unwrap();
    let g = predict(&DeviceProfile::find("h100-80g").unwrap(), &trace, None);
    let mib = |b: u64| b as f64 / 1048576.0;
    let (low, high) = (mib(g.peak_allocated.low), mib(g.peak_allocated.high));
    let (reserved_low, reserved_high) = (mib(g.peak_reserved.low), mib(g.peak_reserved.high));
    println!(
        "predicted: allocated {low:.1}-{high:.1} MiB, reserved {reserved_low:.1}-{reserved_high:.1} MiB"
    );

    let device = tch::Device::Cuda(0);
    let logs = tempfile::tempdir().unwrap();
    let tracker = MemTracker::builder()
        .device(TrackedDevice::Cuda(0))
        .log_dir(logs.path())
        .nvml(false)
        .build()
        .unwrap();
    let vs = nn::VarStore::new(device);
    let model = build(&vs.root());
    let mut opt = nn::Adam::default().build(&vs, 1e-3).unwrap();
    let x = Tensor::randn(shape, (Kind::Float, device));
    let y = Tensor::randint(rnn.classes, [batch * seq], (Kind::Int64, device));
    tracker.track().unwrap(); // the peak window opens here, with the model and the batch on the GPU
    for _ in 0..2 {
        let loss = step(&model, &x, &y);
        opt.backward_step(&loss);
    }
    tch::Cuda::synchronize(0);
    let point = tracker.track().unwrap();
    let reserved = point.allocator.reserved.expect("CUDA reports reserved memory");
    let (gpu_allocated, gpu_reserved) = (mib(point.allocator.peak_since_previous), mib(reserved));
    let allocated = g.peak_allocated.miss(point.allocator.peak_since_previous);
    let (above, below) = (allocated.above, allocated.below);
    let reserved_off = g.peak_reserved.miss(reserved).either();
    println!(
        "{} layer(s){}{}{}{}, {} -> {}: peak allocated GPU {gpu_allocated:.1} MiB, predicted \
         {low:.1}-{high:.1} ({above:.2} % above, {below:.2} % below); reserved GPU {gpu_reserved:.1} \
         MiB, predicted {reserved_low:.1}-{reserved_high:.1} ({reserved_off:.2} % off)",
        rnn.num_layers,
        if rnn.bidirectional { ", bidirectional" } else { "" },
        if rnn.batch_first { "" } else { ", sequence first" },
        if rnn.has_biases { "" } else { ", no biases" },
        if rnn.dropout > 0.0 { format!(", dropout {}", rnn.dropout) } else { String::new() },
        rnn.features,
        rnn.hidden
    );
    assert!(
        above <= GPU_ALLOCATED_ABOVE_PCT
            && below <= GPU_ALLOCATED_BELOW_PCT
            && reserved_off <= GPU_RESERVED_PCT,
        "outside the acceptance"
    );
}

/// tch's char-rnn shape: `nn::lstm(65 -> 256)` and a linear head back to 65.
const CHAR_RNN: RnnShape = RnnShape {
    lstm: true,
    num_layers: 1,
    batch_first: true,
    bidirectional: false,
    features: 65,
    hidden: 256,
    classes: 65,
    has_biases: true,
    dropout: 0.0,
};

#[cfg_attr(not(gmt_gpu), ignore = "needs a CUDA GPU (run it with the GPU bundle where one is lent)")]
#[test]
fn a_cudnn_lstm_on_cuda_fits_its_h100_prediction() {
    rnn_on_cuda_fits_its_h100_prediction(CHAR_RNN);
}

#[cfg_attr(not(gmt_gpu), ignore = "needs a CUDA GPU (run it with the GPU bundle where one is lent)")]
#[test]
fn a_cudnn_gru_on_cuda_fits_its_h100_prediction() {
    rnn_on_cuda_fits_its_h100_prediction(RnnShape { lstm: false, ..CHAR_RNN });
}

#[cfg_attr(not(gmt_gpu), ignore = "needs a CUDA GPU (run it with the GPU bundle where one is lent)")]
#[test]
fn a_two_layer_bidirectional_cudnn_lstm_on_cuda_fits_its_h100_prediction() {
    rnn_on_cuda_fits_its_h100_prediction(RnnShape { num_layers: 2, bidirectional: true, ..CHAR_RNN });
}

/// Every option of tch's `RNNConfig`, one test (one process: cuDNN's dropout state is made once
/// per process) per configuration, LSTM and GRU: more layers, dropout between layers (with one and
/// two directions), no biases, sequence-first input, and hidden sizes below and far above the
/// input's. `scripts/gpu-check` runs every `*_on_cuda_fits_its_h100_prediction` test.
macro_rules! cudnn_rnn_grid {
    ($($name:ident: $shape:expr;)*) => {$(
        #[cfg_attr(not(gmt_gpu), ignore = "needs a CUDA GPU (run it with the GPU bundle where one is lent)")]
        #[test]
        fn $name() {
            rnn_on_cuda_fits_its_h100_prediction($shape);
        }
    )*};
}

const CHAR_GRU: RnnShape = RnnShape { lstm: false, ..CHAR_RNN };

cudnn_rnn_grid! {
    a_three_layer_cudnn_lstm_on_cuda_fits_its_h100_prediction: RnnShape { num_layers: 3, ..CHAR_RNN };
    a_three_layer_cudnn_gru_on_cuda_fits_its_h100_prediction: RnnShape { num_layers: 3, ..CHAR_GRU };
    a_cudnn_lstm_with_dropout_on_cuda_fits_its_h100_prediction:
        RnnShape { num_layers: 2, dropout: 0.5, ..CHAR_RNN };
    a_cudnn_gru_with_dropout_on_cuda_fits_its_h100_prediction:
        RnnShape { num_layers: 2, dropout: 0.5, ..CHAR_GRU };
    a_bidirectional_cudnn_lstm_with_dropout_on_cuda_fits_its_h100_prediction:
        RnnShape { num_layers: 2, bidirectional: true, dropout: 0.5, ..CHAR_RNN };
    a_bidirectional_cudnn_gru_with_dropout_on_cuda_fits_its_h100_prediction:
        RnnShape { num_layers: 2, bidirectional: true, dropout: 0.5, ..CHAR_GRU };
    a_cudnn_lstm_without_biases_on_cuda_fits_its_h100_prediction: RnnShape { has_biases: false, ..CHAR_RNN };
    a_cudnn_gru_without_biases_on_cuda_fits_its_h100_prediction: RnnShape { has_biases: false, ..CHAR_GRU };
    a_sequence_first_cudnn_lstm_on_cuda_fits_its_h100_prediction: RnnShape { batch_first: false, ..CHAR_RNN };
    a_sequence_first_cudnn_gru_on_cuda_fits_its_h100_prediction: RnnShape { batch_first: false, ..CHAR_GRU };
    a_narrow_cudnn_lstm_on_cuda_fits_its_h100_prediction:
        RnnShape { features: 512, hidden: 128, num_layers: 2, ..CHAR_RNN };
    a_narrow_cudnn_gru_on_cuda_fits_its_h100_prediction:
        RnnShape { features: 512, hidden: 128, num_layers: 2, ..CHAR_GRU };
    a_wide_cudnn_lstm_on_cuda_fits_its_h100_prediction: RnnShape { hidden: 1024, ..CHAR_RNN };
    a_wide_cudnn_gru_on_cuda_fits_its_h100_prediction: RnnShape { hidden: 1024, ..CHAR_GRU };
}

/// On meta an LSTM or GRU takes cuDNN's path: its reserve space is made in forward and kept until
/// its backward, each call takes a workspace it frees on return, and every weight's gradient is a
/// view of one flat buffer.
#[test]
fn rnns_on_meta_keep_cudnns_reserve_until_backward() {
    let (batch, seq, features, hidden, classes) = (8i64, 16i64, 24i64, 32i64, 5i64);
    for (lstm, num_layers, batch_first, bidirectional) in [(true, 2, true, true), (false, 1, false, false)] {
        // Biases, no dropout: tch's defaults, as in char-rnn.
        let rnn =
            RnnShape { lstm, num_layers, batch_first, bidirectional, features, hidden, classes, ..CHAR_RNN };
        let (directions, build, step) = (rnn.directions(), rnn.build(), rnn.step());
        let shape = if batch_first { [batch, seq, features] } else { [seq, batch, features] };
        let (_, trace) =
            training_step(build, step, &adam(Precision::F32, &shape, false, &[batch * seq])).unwrap();
        let gates = if lstm { 4 } else { 3 };
        // What an H200 allocated for these two (scripts/gpu/gpu_rnn_sizes.py): the reserve exactly,
        // the workspace within 4 % (cuDNN takes other kernels for so small an RNN).
        let (reserve, gpu_workspace) = if lstm { (360_704u64, 34_251_072u64) } else { (98_560, 8_736_064) };
        let (l, d) = (num_layers - 1, directions - 1);
        let r = 150 + 50 * d + 30 * l + 15 * l * d + if lstm { 0 } else { 20 };
        let workspace = ((8 << 20) * num_layers * directions
            + directions * seq * batch * gates * hidden * 4 * r / 100) as u64;
        let off = (workspace as f64 / gpu_workspace as f64 - 1.0).abs();
        assert!(off < 0.04, "workspace {workspace} B against the GPU's {gpu_workspace} B");
        let rnn_op = if lstm { "aten::lstm" } else { "aten::gru" };
        let freed_in = |id: i64, from: usize| {
            trace.events[from..].iter().find(|e| !e.alloc && e.id == id).map(|e| e.phase)
        };
        let made: Vec<(usize, &gpu_mem_track_estimate::TraceEvent)> =
            trace.events.iter().enumerate().filter(|(_, e)| e.alloc).collect();
        let reserves: Vec<_> = made
            .iter()
            .filter(|(_, e)| e.size == reserve && e.top_op == rnn_op && e.phase == Phase::Forward)
            .collect();
        assert_eq!(reserves.len(), 2, "{rnn_op}: one reserve of {reserve} B per iteration");
        for (i, e) in &reserves {
            assert_eq!(
                freed_in(e.id, *i),
                Some(Phase::Backward),
                "{rnn_op}: the reserve lives until backward"
            );
        }
        let workspaces: Vec<_> = made.iter().filter(|(_, e)| e.size == workspace).collect();
        assert_eq!(
            workspaces.len(),
            6,
            "{rnn_op}: forward, backward data and backward weights, two iterations"
        );
        for (i, e) in &workspaces {
            assert_eq!(freed_in(e.id, *i), Some(e.phase), "{rnn_op}: a workspace is freed by the call");
        }
        // One flat weight gradient per backward: the sum of the RNN's weights.
        let per_gate = gates * hidden;
        let layer = |input: i64| directions * per_gate * (input + hidden + 2);
        let flat = ((layer(features) + (num_layers - 1) * layer(directions * hidden)) * 4) as u64;
        let flats = made.iter().filter(|(_, e)| e.size == flat && e.phase == Phase::Backward).count();
        assert_eq!(flats, 2, "{rnn_op}: one flat gradient of {flat} B per iteration");
    }
}
