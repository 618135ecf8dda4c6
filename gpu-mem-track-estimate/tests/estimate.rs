//! Meta-device estimates equal the wrapped CPU allocator's measurement of the same run.
use gpu_mem_track_testkit as common;

use std::path::Path;

use common::{export_models, python_with_torch};
use gpu_mem_track_estimate::Error;
use gpu_mem_track_estimate::{
    estimate_static, estimate_torchscript, Estimate, EstimateDevice, EstimateOptions, Mode, Optimizer,
    Precision,
};

fn run(model: &Path, shape: &[i64], ids: bool, mode: Mode, device: EstimateDevice) -> Estimate {
    let options = EstimateOptions {
        input_shape: shape.to_vec(),
        input_is_index: ids,
        precision: Precision::F32,
        mode,
        device,
        ..EstimateOptions::default()
    };
    estimate_torchscript(model, &options).unwrap_or_else(|e| panic!("{}: {e}", model.display()))
}

fn within(meta: u64, cpu: u64, pct: f64, what: &str) {
    let diff = (meta as f64 - cpu as f64).abs() / cpu as f64 * 100.0;
    println!("  {what:<20} meta {meta:>12} cpu {cpu:>12}  diff {diff:.3} %");
    assert!(diff <= pct, "{what}: meta {meta} vs cpu {cpu} differ by {diff:.2} %");
}

#[cfg_attr(
    not(gmt_python_torch),
    ignore = "needs Python with torch to export TorchScript models (scripts/dev installs it)"
)]
#[test]
fn meta_matches_the_cpu_allocator_within_2_percent() {
    let dir = tempfile::tempdir().unwrap();
    let models = export_models(dir.path(), &["mlp", "cnn", "resnetlike", "transformer"]);
    let shapes: [(&[i64], bool); 4] =
        [(&[256, 256], false), (&[32, 3, 64, 64], false), (&[16, 3, 32, 32], false), (&[8, 64], true)];
    for (model, (shape, ids)) in models.iter().zip(shapes) {
        println!("{}", model.display());
        let train = Mode::Train(Optimizer::Adam);
        let meta = run(model, shape, ids, train, EstimateDevice::Meta);
        let cpu = run(model, shape, ids, train, EstimateDevice::Cpu);
        assert_eq!(meta.sizes.param_bytes, cpu.sizes.param_bytes);
        assert_eq!(meta.sizes.grad_bytes, cpu.sizes.grad_bytes);
        assert_eq!(
            meta.sizes.optimizer_state_bytes,
            2 * meta.sizes.param_bytes,
            "Adam keeps two buffers per parameter"
        );
        within(meta.live_after_forward, cpu.live_after_forward, 2.0, "live after forward");
        within(meta.forward_peak, cpu.forward_peak, 2.0, "forward peak");
        within(meta.peak.bytes, cpu.peak.bytes, 2.0, "training step peak");
        let inf_meta = run(model, shape, ids, Mode::Inference, EstimateDevice::Meta);
        let inf_cpu = run(model, shape, ids, Mode::Inference, EstimateDevice::Cpu);
        within(inf_meta.peak.bytes, inf_cpu.peak.bytes, 2.0, "inference peak");
        // The only allocations left out on the CPU are oneDNN's own temporaries.
        println!(
            "  oneDNN temporaries (CPU only): training {} B, inference {} B",
            cpu.cpu_only_temporaries, inf_cpu.cpu_only_temporaries
        );
        assert_eq!(meta.cpu_only_temporaries, 0);
    }
}

#[cfg_attr(
    not(gmt_python_torch),
    ignore = "needs Python with torch to export TorchScript models (scripts/dev installs it)"
)]
#[test]
fn transposed_grouped_convolution_and_group_norm_run_on_meta() {
    let dir = tempfile::tempdir().unwrap();
    let models = export_models(dir.path(), &["decoder"]);
    let train = Mode::Train(Optimizer::SgdMomentum);
    let meta = run(&models[0], &[8, 32, 16, 16], false, train, EstimateDevice::Meta);
    let cpu = run(&models[0], &[8, 32, 16, 16], false, train, EstimateDevice::Cpu);
    // Output 8x8x32x32 f32 and everything kept for backward: the same storages on both devices.
    within(meta.live_after_forward, cpu.live_after_forward, 2.0, "live after forward");
    assert_eq!(
        meta.sizes.optimizer_state_bytes, meta.sizes.param_bytes,
        "momentum: one buffer per parameter"
    );
    // The CPU's transposed convolution (oneDNN) reorders its input and output through temporaries
    // that no GPU kernel makes, so the CPU peak is higher; meta never exceeds a real run.
    assert!(meta.forward_peak <= cpu.forward_peak);
}

#[cfg_attr(
    not(gmt_python_torch),
    ignore = "needs Python with torch to export TorchScript models (scripts/dev installs it)"
)]
#[test]
fn bad_models_and_inputs_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let opts = EstimateOptions { input_shape: vec![4, 256], ..EstimateOptions::default() };
    let e = estimate_torchscript(&dir.path().join("none.pt"), &opts).unwrap_err();
    assert!(matches!(e, Error::Input(_)) && e.to_string().contains("none.pt"), "{e}");
    let junk = dir.path().join("junk.pt");
    std::fs::write(&junk, b"not a zip archive").unwrap();
    let e = estimate_torchscript(&junk, &opts).unwrap_err();
    // Sorted by the kind the C++ names (gmt_failure), not by its text.
    assert!(matches!(e, Error::Input(_)), "{e:?}");
    assert!(e.to_string().starts_with("cannot load") && e.to_string().contains("junk.pt"), "{e}");
    assert_eq!(e.to_string().lines().count(), 1);
    let models = export_models(dir.path(), &["mlp"]);
    let wrong = EstimateOptions { input_shape: vec![4, 100], ..EstimateOptions::default() };
    let e = estimate_torchscript(&models[0], &wrong).unwrap_err();
    assert!(matches!(e, Error::Input(_)), "{e:?}");
    let msg = e.to_string();
    assert!(msg.starts_with("forward failed for input [4, 100]"), "{msg}");
    assert_eq!(msg.lines().count(), 1, "{msg}");
}

#[cfg_attr(
    not(gmt_python_torch),
    ignore = "needs Python with torch to export TorchScript models (scripts/dev installs it)"
)]
#[test]
fn static_ir_estimate_agrees_with_meta_for_inference() {
    let dir = tempfile::tempdir().unwrap();
    let models = export_models(dir.path(), &["cnn", "resnetlike", "transformer"]);
    for (model, shape) in models[..2].iter().zip([[32i64, 3, 64, 64], [16, 3, 32, 32]]) {
        let options = EstimateOptions { input_shape: shape.to_vec(), ..EstimateOptions::default() };
        let meta = estimate_torchscript(model, &options).unwrap();
        let st = estimate_static(model, &options).unwrap();
        assert_eq!(st.unknown_shapes, 0, "{}", model.display());
        // Parameters and the buffers the forward reads (not, say, an unused `num_batches_tracked`).
        assert!(
            st.param_bytes >= meta.sizes.param_bytes
                && st.param_bytes <= meta.sizes.param_bytes + meta.sizes.buffer_bytes
        );
        within(st.activation_peak, meta.activation_peak(), 1.0, "static vs meta");
    }
    // Views with data-dependent sizes stay symbolic: the static method says what it left out.
    let options =
        EstimateOptions { input_shape: vec![8, 64], input_is_index: true, ..EstimateOptions::default() };
    let st = estimate_static(&models[2], &options).unwrap();
    assert!(st.unknown_shapes > 0);
}

#[cfg_attr(
    not(gmt_python_torch),
    ignore = "needs Python with torch to export TorchScript models (scripts/dev installs it)"
)]
#[test]
fn model_size_of_a_varstore_and_of_a_torchscript_model() {
    use gpu_mem_track_estimate::{torchscript_size, varstore_size};
    let vs = tch::nn::VarStore::new(tch::Device::Cpu);
    let _l = tch::nn::linear(vs.root() / "l", 100, 10, Default::default());
    let _bn = tch::nn::batch_norm1d(vs.root() / "bn", 10, Default::default());
    let s = varstore_size(&vs, Optimizer::Adam);
    assert_eq!(s.param_count, 100 * 10 + 10 + 10 + 10);
    assert_eq!(s.param_bytes, (100 * 10 + 30) * 4);
    assert_eq!(s.param_bytes_by_dtype["torch.float32"], s.param_bytes);
    assert_eq!(s.buffer_bytes, (10 + 10) * 4, "running mean and variance");
    assert_eq!((s.grad_bytes, s.optimizer_state_bytes), (s.param_bytes, 2 * s.param_bytes));

    let dir = tempfile::tempdir().unwrap();
    let models = export_models(dir.path(), &["mlp"]);
    let options = EstimateOptions { input_shape: vec![64, 256], ..EstimateOptions::default() };
    let s = torchscript_size(&models[0], &options, Optimizer::SgdMomentum).unwrap();
    assert_eq!(s.param_count, 256 * 512 + 512 + 512 * 10 + 10);
    assert_eq!(s.optimizer_state_bytes, s.param_bytes);
    let a = s.activations.unwrap();
    // No grad: the hidden layer [64, 512] (relu runs on a new tensor) and the output [64, 10] at
    // the peak: linear's output, then relu's, with the first freed after relu.
    assert_eq!(a.without_backward, 2 * 64 * 512 * 4);
    // With grad: relu saves its result (also the second linear's saved input); the first linear's
    // output dies after relu; the output [64, 10] is alive.
    assert_eq!(a.with_backward, 64 * 512 * 4 + 64 * 10 * 4);
}

#[cfg_attr(
    not(gmt_python_torch),
    ignore = "needs Python with torch to export TorchScript models (scripts/dev installs it)"
)]
#[test]
fn live_tensors_at_the_peak_are_grouped_like_the_log() {
    use gpu_mem_track::recorder;
    use gpu_mem_track::TensorClass;
    use gpu_mem_track_estimate::{
        estimate_torchscript_traced, estimate_torchscript_with_peak_tensors, forward_passes,
    };
    let dir = tempfile::tempdir().unwrap();
    let models = export_models(dir.path(), &["cnn"]);
    let options = EstimateOptions {
        input_shape: vec![32, 3, 64, 64],
        mode: Mode::Train(Optimizer::Adam),
        ..EstimateOptions::default()
    };
    let passes = forward_passes();
    let (e, _, groups) = estimate_torchscript_with_peak_tensors(&models[0], &options).unwrap();
    assert_eq!(forward_passes() - passes, 2, "one run of two steps: the peak's tensors come from it");
    // What a second run snapshotting at the peak event the first one named finds: the same groups.
    recorder::walk_at(e.peak.event as i64);
    let (again, _) = estimate_torchscript_traced(&models[0], &options).unwrap();
    assert_eq!(again.peak.event, e.peak.event);
    let mut second: Vec<_> = recorder::peak_walk().groups.into_iter().filter(|(k, _)| !k.view).collect();
    second.sort_by(|a, b| b.1.bytes.cmp(&a.1.bytes).then(b.1.count.cmp(&a.1.count)).then(a.0.cmp(&b.0)));
    let shapes: Vec<_> = groups.iter().map(|g| (g.shape.clone(), g.count)).collect();
    let second_shapes: Vec<_> = second.iter().map(|(k, t)| (k.shape.to_vec(), t.count)).collect();
    assert_eq!(shapes, second_shapes, "one run's peak tensors are the two-run method's");
    let bytes = |g: &gpu_mem_track::log::GroupLine| (g.memory_mib * 1048576.0).round() as u64;
    let total: u64 = groups.iter().map(bytes).sum();
    let params: u64 = groups.iter().filter(|g| g.class == TensorClass::Parameter).map(bytes).sum();
    println!("peak {} B, grouped live tensors {} B in {} groups", e.peak.bytes, total, groups.len());
    assert_eq!(params, e.sizes.param_bytes, "every parameter is named and counted once");
    // The peak is in the second iteration: Adam's two moments are live, and the registry knows
    // them as optimizer state, as MemTracker::optimizer_step marks a tch step's.
    assert_eq!(e.peak.iteration, 2, "{:?}", e.peak);
    let state: u64 =
        groups.iter().filter(|g| g.role == Some(gpu_mem_track::TensorRole::OptimizerState)).map(bytes).sum();
    assert_eq!(state, e.sizes.optimizer_state_bytes, "{groups:#?}");
    assert_eq!(state, 2 * params, "Adam: two moments per parameter");
    // Storages autograd keeps through its own tensor handles (saved outputs) have no op-returned
    // tensor left: they are in the peak but not in the groups, and the CLI says how much.
    assert!(total <= e.peak.bytes, "{total} vs {}", e.peak.bytes);
    assert!(groups.windows(2).all(|w| bytes(&w[0]) >= bytes(&w[1])), "largest first");
}

#[cfg_attr(
    not(gmt_python_torch),
    ignore = "needs Python with torch to export TorchScript models (scripts/dev installs it)"
)]
#[test]
fn eager_lifetimes_match_eager_pytorch_and_torchscript_lifetimes_free_earlier() {
    use gpu_mem_track_estimate::Lifetimes;
    let dir = tempfile::tempdir().unwrap();
    let models = export_models(dir.path(), &["transformer", "loop"]);
    let python = python_with_torch().unwrap();
    // (model, shape, token ids?) with no CPU-only temporaries in eager PyTorch.
    for (model, shape, ids) in [(&models[0], vec![4i64, 64], true), (&models[1], vec![1024, 256], false)] {
        let estimate = |lifetimes| {
            let options = EstimateOptions {
                input_shape: shape.clone(),
                input_is_index: ids,
                lifetimes,
                ..EstimateOptions::default()
            };
            let e = estimate_torchscript(model, &options).unwrap();
            e.peak.bytes - e.sizes.param_bytes - e.sizes.buffer_bytes - e.sizes.input_bytes
        };
        let (script, eager) = (estimate(Lifetimes::TorchScript), estimate(Lifetimes::Eager));
        // The same model run eagerly by PyTorch on this CPU, measured by its profiler.
        let name = model.file_stem().unwrap().to_str().unwrap();
        let shape_arg = shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("x");
        let probe = common::fixtures().join("eager_peak.py");
        let out = std::process::Command::new(&python).arg(&probe).args([name, &shape_arg]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let measured: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        println!("{name}: above parameters+input: torchscript {script} B, eager {eager} B, eager PyTorch {measured} B");
        assert_eq!(eager, measured, "{name}: eager lifetimes reproduce eager PyTorch's peak");
        assert!(script <= eager, "{name}: the interpreter never holds longer: {script} vs {eager}");
    }
}

#[cfg_attr(
    not(gmt_torchvision),
    ignore = "needs Python with torch and torchvision to export ResNet-50 (scripts/dev installs them)"
)]
#[test]
fn estimating_resnet50_training_runs_its_forward_once_per_step() {
    use gpu_mem_track_estimate::{estimate_torchscript_with_peak_tensors, forward_passes, Phase};
    let dir = tempfile::tempdir().unwrap();
    let model = export_models(dir.path(), &["resnet50"]).remove(0);
    let options = EstimateOptions {
        input_shape: vec![16, 3, 224, 224],
        mode: Mode::Train(Optimizer::AdamW),
        ..EstimateOptions::default()
    };
    // What `gpu-mem-track estimate --mode train` calls for its report: the estimate, its trace and
    // the live tensors at the peak.
    let before = forward_passes();
    let (e, trace, groups) = estimate_torchscript_with_peak_tensors(&model, &options).unwrap();
    let passes = forward_passes() - before;
    assert_eq!(passes, 2, "two training steps of one run, and no second run for the peak's tensors");
    // The trace is that run's: forward, backward and the optimizer of steps 1 and 2, once each.
    let forwards: std::collections::BTreeSet<u32> =
        trace.events.iter().filter(|ev| ev.phase == Phase::Forward).map(|ev| ev.iteration).collect();
    assert_eq!(forwards, [1, 2].into(), "forward phases in the trace");
    assert_eq!(e.peak.iteration, 2, "{:?}", e.peak);
    assert!(groups.len() > 10, "ResNet-50's live tensors at the peak: {}", groups.len());
}

#[cfg_attr(
    not(gmt_torchvision),
    ignore = "needs Python with torch and torchvision to export ResNet-50 (scripts/dev installs them)"
)]
#[test]
fn resnet50_training_too_large_for_a_t4_names_the_first_allocation_that_fails() {
    use gpu_mem_track_estimate::device_replay::replay_on_device;
    use gpu_mem_track_estimate::estimate_torchscript_traced;
    use gpu_mem_track_estimate::profile::{predict, DeviceProfile};
    use gpu_mem_track_estimate::runtime::{place_runtime_allocations, RuntimeSizes};
    let dir = tempfile::tempdir().unwrap();
    let model = export_models(dir.path(), &["resnet50"]).remove(0);
    let t4 = DeviceProfile::find("t4").unwrap();
    let trace_at = |batch: i64| {
        let options = EstimateOptions {
            input_shape: vec![batch, 3, 224, 224],
            mode: Mode::Train(Optimizer::SgdMomentum),
            ..EstimateOptions::default()
        };
        estimate_torchscript_traced(&model, &options).unwrap().1
    };
    let trace = trace_at(256);
    let g = predict(&t4, &trace, None);
    assert!(!g.fits);
    assert_eq!(g.usable_bytes, t4.memory_bytes - t4.context_bytes);
    let oom = g.first_oom.clone().expect("batch 256 of ResNet-50 training cannot run in 16 GiB");
    println!("{oom}");
    // It is the trace's allocation, as recorded.
    let e = &trace.events[oom.event];
    assert!(e.alloc);
    assert_eq!((&e.op, &e.top_op, e.phase, e.iteration), (&oom.op, &oom.top_op, oom.phase, oom.iteration));
    assert_eq!((oom.runtime, oom.requested), (None, e.size), "a tensor: cuDNN workspaces fall back");
    assert!(oom.iteration >= 1, "parameters and input fit: it fails in a step");
    // The shortfall is what the definition says, and the allocation really did not fit.
    assert!(oom.short_by > 0 && oom.reserved_after_retry <= oom.capacity);
    assert_eq!(oom.segment + oom.reserved_after_retry - oom.capacity, oom.short_by);
    assert!(oom.segment >= oom.rounded && oom.rounded >= oom.requested);
    // It is the first: the same replay without that event and what follows places everything.
    let runtime = place_runtime_allocations(
        &trace,
        RuntimeSizes {
            cublas_workspace: t4.cublas_workspace_bytes(None),
            cublaslt_workspace: gpu_mem_track_estimate::profile::cublaslt_workspace_bytes(None, None),
            cudnn_workspaces: true,
        },
    );
    let before =
        gpu_mem_track_estimate::Trace { events: trace.events[..oom.event].to_vec(), ..trace.clone() };
    let runtime_before: Vec<_> = runtime.iter().copied().filter(|r| r.after_event < oom.event).collect();
    assert_eq!(replay_on_device(&before, &runtime_before, Some(g.usable_bytes)).1, None);
    // A batch that fits has none.
    let small = predict(&t4, &trace_at(32), None);
    assert!(small.fits);
    assert_eq!(small.first_oom, None);
}

/// torchvision models that stopped at the first op without a meta kernel (mobilenet_v2 at
/// `hardtanh_backward`, swin_t at `roll`) estimate on meta, with meta kernels of the shim's own
/// (no op of either runs on the CPU), within 2 % of the same run computed on the CPU.
#[cfg_attr(
    not(all(gmt_python_torch, gmt_torchvision)),
    ignore = "needs Python with torch and torchvision to export the models (scripts/dev installs them)"
)]
#[test]
fn torchvision_models_without_meta_kernels_estimate_on_meta() {
    let dir = tempfile::tempdir().unwrap();
    let models = export_models(dir.path(), &["mobilenet_v2", "swin_t"]);
    let adam = Mode::Train(Optimizer::Adam);
    for (model, compare) in models.iter().zip([true, false]) {
        let meta = run(model, &[2, 3, 224, 224], false, adam, EstimateDevice::Meta);
        assert!(meta.cpu_fallback.is_empty(), "{}: {:?}", model.display(), meta.cpu_fallback);
        assert_eq!(meta.cpu_tensors.made_on_cpu, 0, "{}", model.display());
        if compare {
            let cpu = run(model, &[2, 3, 224, 224], false, adam, EstimateDevice::Cpu);
            within(meta.live_after_forward, cpu.live_after_forward, 2.0, "live after forward");
            within(meta.peak.bytes, cpu.peak.bytes, 2.0, "training step peak");
        }
    }
}

/// A traced model bakes the device it was traced on into its graph (`aten::arange(.., device=cpu)`
/// for positions, a mask made on the CPU and copied with `aten::to`): during a meta estimate the
/// CPU means meta, so it estimates, within 2 % of the same run on the CPU, with no tensor left on
/// the CPU.
#[cfg_attr(
    not(gmt_python_torch),
    ignore = "needs Python with torch to export the model (scripts/dev installs it)"
)]
#[test]
fn a_traced_model_with_its_trace_device_baked_in_estimates_on_meta() {
    let dir = tempfile::tempdir().unwrap();
    let model = export_models(dir.path(), &["tracedmask"]).remove(0);
    let adam = Mode::Train(Optimizer::Adam);
    let meta = run(&model, &[8, 64, 64], false, adam, EstimateDevice::Meta);
    let cpu = run(&model, &[8, 64, 64], false, adam, EstimateDevice::Cpu);
    within(meta.live_after_forward, cpu.live_after_forward, 2.0, "live after forward");
    within(meta.peak.bytes, cpu.peak.bytes, 2.0, "training step peak");
    assert_eq!(meta.cpu_tensors.made_on_cpu, 0, "{:?}", meta.cpu_tensors);
}

/// A traced position slice (`position_ids[:, 0 : seq + 0]`, as a Hugging Face encoder's trace
/// has it) reads a shape through a 0-dim tensor constant: loaded on meta that constant has no
/// value, so it is given the file's. Both lifetimes estimate (eager ones failed: "The expanded
/// size of the tensor (64) must match the existing size (0)"), reading no meta value.
#[cfg_attr(
    not(gmt_python_torch),
    ignore = "needs Python with torch to export the model (scripts/dev installs it)"
)]
#[test]
fn traced_shapes_read_through_scalar_constants_keep_their_values() {
    use gpu_mem_track_estimate::Lifetimes;
    let dir = tempfile::tempdir().unwrap();
    let model = export_models(dir.path(), &["tracedpositions"]).remove(0);
    for lifetimes in [Lifetimes::TorchScript, Lifetimes::Eager] {
        let options = EstimateOptions {
            input_shape: vec![4, 64, 32],
            mode: Mode::Train(Optimizer::Adam),
            device: EstimateDevice::Meta,
            lifetimes,
            ..EstimateOptions::default()
        };
        let e = estimate_torchscript(&model, &options).unwrap_or_else(|e| panic!("{lifetimes:?}: {e}"));
        assert_eq!(e.meta_scalar_reads, 0, "{lifetimes:?}");
        // The embedded positions (1 x 64 x 32 floats) and the output (4 x 64 x 32) are there.
        assert!(
            e.live_after_forward >= (64 * 32 + 4 * 64 * 32) * 4,
            "{lifetimes:?}: {}",
            e.live_after_forward
        );
    }
}

/// Transformer blocks as people train them. A hand-written block (dropout on the attention
/// weights and both residual branches, layer norm, GELU) estimates on meta within 2 % of the CPU
/// run. PyTorch's own encoder layers call `scaled_dot_product_attention` with dropout: a GPU runs
/// it as one fused kernel that keeps no attention weights, and so does the meta run, while the
/// CPU takes the math path and keeps the weights, their dropout mask and output for backward
/// (about 14 bytes per attention weight here): meta is below the CPU by that much, and no op
/// runs on the CPU.
#[cfg_attr(
    not(gmt_python_torch),
    ignore = "needs Python with torch to export the model (scripts/dev installs it)"
)]
#[test]
fn transformer_blocks_with_dropout_estimate_on_meta_like_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let models = export_models(dir.path(), &["blocks", "encoder"]);
    let adam = Mode::Train(Optimizer::Adam);
    let (batch, seq, heads, layers) = (8u64, 64u64, 4u64, 2u64);
    for model in &models {
        let meta = run(model, &[8, 64, 128], false, adam, EstimateDevice::Meta);
        let cpu = run(model, &[8, 64, 128], false, adam, EstimateDevice::Cpu);
        assert!(meta.cpu_fallback.is_empty(), "{:?}", meta.cpu_fallback);
        assert_eq!(
            meta.cpu_tensors.made_on_cpu + meta.cpu_tensors.moved_to_meta,
            0,
            "{:?}",
            meta.cpu_tensors
        );
        if model.ends_with("blocks.pt") {
            within(meta.live_after_forward, cpu.live_after_forward, 2.0, "live after forward");
            within(meta.peak.bytes, cpu.peak.bytes, 2.0, "training step peak");
        } else {
            // Per layer, the math path keeps attention weights the fused kernel does not: at
            // least the softmax output (float) and the dropout mask (bool); measured, 14.4 bytes
            // a weight (the scaled scores and the dropped weights too); at most four floats.
            let weights = layers * batch * heads * seq * seq;
            let gap = cpu.live_after_forward.saturating_sub(meta.live_after_forward);
            println!("  encoder: the CPU keeps {gap} bytes more after forward ({weights} attention weights)");
            assert!(gap >= weights * 5 && gap <= weights * 16, "{gap} bytes for {weights} weights");
            assert!(meta.peak.bytes < cpu.peak.bytes);
        }
    }
}

/// An op that can run neither on meta nor on the CPU (CUDA-only ops have neither kernel): the
/// error names every such op of the model at once, with its schema and where it is called, not
/// only the one the run stopped at.
/// A model traced on `cuda:0` has the GPU baked into its graph (a copy to it, a factory on it):
/// on meta it estimates as the same model naming the CPU does, on a machine without CUDA.
#[cfg_attr(
    not(gmt_python_torch),
    ignore = "needs Python with torch to export the models (scripts/dev installs it)"
)]
#[test]
fn a_model_that_names_cuda_estimates_on_meta_as_one_naming_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let models = export_models(dir.path(), &["cudanamed", "cpunamed"]);
    for mode in [Mode::Inference, Mode::Train(Optimizer::AdamW)] {
        let cuda = run(&models[0], &[16, 64], false, mode, EstimateDevice::Meta);
        let cpu = run(&models[1], &[16, 64], false, mode, EstimateDevice::Meta);
        assert_eq!(cuda.peak.bytes, cpu.peak.bytes, "{mode:?}");
        assert_eq!(cuda.live_after_forward, cpu.live_after_forward, "{mode:?}");
        // The mask (16 x 64 floats) and the linear layer's output are there.
        assert!(cuda.peak.bytes >= 2 * 16 * 64 * 4, "{mode:?}: {}", cuda.peak.bytes);
    }
}

#[cfg_attr(
    not(gmt_python_torch),
    ignore = "needs Python with torch to export the model (scripts/dev installs it)"
)]
#[test]
fn every_op_without_a_meta_or_cpu_kernel_is_named_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let model = export_models(dir.path(), &["cudaonly"]).remove(0);
    let options = EstimateOptions { input_shape: vec![4, 8], ..EstimateOptions::default() };
    let e = estimate_torchscript(&model, &options).unwrap_err();
    let Error::MissingMetaKernel { op, all } = &e else { panic!("{e}") };
    assert_eq!(op, "aten::batch_norm_stats", "{e}");
    assert_eq!(all.len(), 2, "{all:?}");
    assert!(all[0].starts_with("aten::batch_norm_stats(Tensor input, float eps)"), "{all:?}");
    assert!(all[1].starts_with("aten::batch_norm_elemt("), "{all:?}");
    for entry in all {
        assert!(entry.contains("export_models.py line "), "{entry}");
    }
    let msg = e.to_string();
    assert!(
        msg.contains("2 op(s) with no meta, composite or CPU kernel")
            && msg.contains("cannot run them either"),
        "{msg}"
    );
    assert_eq!(msg.lines().count(), 1, "{msg}");
}
