//! tch-native models estimated on the meta device equal a CPU run of the same step.
use gpu_mem_track::estimate::gpu_runtime::{
    largest_cudnn_workspace, place_runtime_allocations, RuntimeKind, RuntimeSizes,
};
use gpu_mem_track::estimate::{training_step, EstimateDevice, NativeStepOptions, Optimizer, Precision};
use tch::nn::{self, Module, ModuleT};
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
    let options = |device| NativeStepOptions {
        input_shape: vec![32, 1, 28, 28],
        input_is_index: false,
        target_shape: vec![32],
        precision: Precision::F32,
        optimizer: Optimizer::Adam,
        device,
    };
    let (meta, trace) = training_step(cnn, step, &options(EstimateDevice::Meta)).unwrap();
    let (cpu, _) = training_step(cnn, step, &options(EstimateDevice::Cpu)).unwrap();
    assert_eq!(meta.param_count, (16 * 9 + 16) + 32 + (32 * 16 * 9 + 32) + (32 * 49 * 10 + 10));
    assert_eq!(meta.param_bytes, cpu.param_bytes);
    assert_eq!(meta.optimizer_state_bytes, 2 * meta.param_bytes);
    within(meta.live_after_forward, cpu.live_after_forward, "live after forward");
    within(meta.forward_peak, cpu.forward_peak, "forward peak");
    within(meta.peak.bytes, cpu.peak.bytes, "training step peak");
    // A GPU run's library allocations are placed at the calls a meta run records.
    let placed =
        place_runtime_allocations(&trace, RuntimeSizes { cublas_workspace: 1, cudnn_workspaces: true });
    let kinds: Vec<RuntimeKind> = placed.iter().map(|r| r.kind).collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == RuntimeKind::CublasWorkspace).count(),
        1,
        "the linear layer is a matmul"
    );
    // Two convolutions forward and two backward (per iteration, two iterations).
    assert_eq!(kinds.iter().filter(|k| **k == RuntimeKind::CudnnWorkspace).count(), 8, "{placed:?}");
    assert!(largest_cudnn_workspace(&trace) > 0);
}

#[test]
fn a_failing_step_is_an_error_naming_the_problem() {
    let options = NativeStepOptions {
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

/// native_dropout (what traced and scripted models call), hardtanh, hardswish and roll have no Meta kernel in libtorch C++: they run their CPU
/// kernel on CPU copies of their meta inputs, and the estimate equals the CPU run.
#[test]
fn ops_without_a_meta_kernel_run_their_cpu_kernel_and_match_the_cpu() {
    fn mlp(p: &nn::Path) -> nn::Sequential {
        nn::seq()
            .add(nn::linear(p / "l1", 64, 256, Default::default()))
            .add_fn(|x| x.hardtanh().dropout(0.1, true).roll([1], [1]))
            .add(nn::linear(p / "l2", 256, 256, Default::default()))
            .add_fn(|x| x.hardswish().native_dropout(0.2, true).0)
            .add(nn::linear(p / "l3", 256, 10, Default::default()))
    }
    let step = |m: &nn::Sequential, x: &Tensor, y: &Tensor| m.forward(x).cross_entropy_for_logits(y);
    let options = |device| NativeStepOptions {
        input_shape: vec![32, 64],
        input_is_index: false,
        target_shape: vec![32],
        precision: Precision::F32,
        optimizer: Optimizer::Adam,
        device,
    };
    let (meta, _) = training_step(mlp, step, &options(EstimateDevice::Meta)).unwrap();
    let (cpu, _) = training_step(mlp, step, &options(EstimateDevice::Cpu)).unwrap();
    // What the forward pass keeps (outputs, dropout masks as bool) is the CPU run's to the byte.
    assert_eq!(meta.live_after_forward, cpu.live_after_forward);
    // Peaks: the CPU dropout kernel's own temporaries are CPU memory the meta run leaves out (a
    // GPU's fused kernel makes only the output and the mask), so meta is at most the CPU run.
    assert!(meta.forward_peak <= cpu.forward_peak, "{} > {}", meta.forward_peak, cpu.forward_peak);
    within(meta.peak.bytes, cpu.peak.bytes, "training step peak");
    let ops: Vec<&str> = meta.cpu_fallback.iter().map(|o| o.op.as_str()).collect();
    for op in
        ["aten::native_dropout", "aten::native_dropout_backward", "aten::roll", "aten::hardtanh_backward"]
    {
        assert!(ops.contains(&op), "{op} not in {ops:?}");
    }
    // One per forward, two iterations; the copies are that op's input (32x256 floats).
    let dropout = meta.cpu_fallback.iter().find(|o| o.op == "aten::native_dropout").unwrap();
    assert_eq!(dropout.calls, 2);
    assert_eq!(dropout.bytes, 2 * 32 * 256 * 4);
    assert!(cpu.cpu_fallback.is_empty(), "a CPU run needs no fallback");
    assert!(meta.to_string().contains("ran on the CPU for want of a meta kernel"), "{meta}");
}
