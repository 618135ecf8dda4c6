//! Memory saved for backward, captured through autograd's saved-variable hooks.
use gpu_mem_track_testkit as common;

use common::python_with_torch;
use gpu_mem_track_estimate::{memory_for_backward, memory_for_backward_excluding};
use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

#[test]
fn mlp_saves_exactly_its_activations() {
    let vs = nn::VarStore::new(Device::Cpu);
    let net = nn::seq()
        .add(nn::linear(vs.root() / "l1", 512, 1024, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(vs.root() / "l2", 1024, 10, Default::default()));
    let x = Tensor::rand([64, 512], (Kind::Float, Device::Cpu));
    let (loss, report) =
        memory_for_backward_excluding(&[&x], || net.forward(&x).square().mean(Kind::Float)).unwrap();
    // Saved: l1's output is relu's input... relu saves its result [64, 1024] (the input of l2 too),
    // square saves l2's output [64, 10]. The input and the weights are left out.
    let expected = 64 * 1024 * 4 + 64 * 10 * 4;
    assert_eq!(report.total_bytes, expected, "{report:#?}");
    assert_eq!(report.by_op.iter().map(|o| o.bytes).sum::<u64>(), report.total_bytes);
    // Only l2 saves its weight (as weight.t(), for the gradient of its input); l1's input needs
    // no gradient, so l1 saves no weight.
    assert_eq!(report.parameter_bytes, 10 * 1024 * 4);
    assert!(report.by_op.iter().any(|o| o.op.contains("relu")), "{report:#?}");
    // Ground truth: what the forward left allocated also holds the pre-relu output and the loss.
    assert!(report.allocator_delta >= expected as i64);
    // Autograd still works, with the same numbers as without the hooks.
    loss.backward();
    let with_hooks = vs.variables()["l1.weight"].grad().copy();
    for (_, v) in vs.variables() {
        let _ = v.grad().zero_();
    }
    let plain = net.forward(&x).square().mean(Kind::Float);
    plain.backward();
    assert!(with_hooks.allclose(&vs.variables()["l1.weight"].grad(), 0.0, 0.0, false));
}

#[test]
fn in_place_edits_of_saved_tensors_are_still_detected() {
    let w = Tensor::rand([8], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let (y, _) = memory_for_backward(|| w.exp()).unwrap();
    let _ = tch::no_grad(|| y.shallow_clone().g_add_scalar_(1.0));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| y.sum(Kind::Float).f_backward()));
    let err = result.expect("no panic").expect_err("modified saved tensor must be refused");
    assert!(err.to_string().contains("modified by an inplace operation"), "{err}");
}

#[cfg_attr(
    not(gmt_torchvision),
    ignore = "needs Python with torch and torchvision to export ResNet-50 (scripts/dev installs them)"
)]
#[test]
fn resnet50_at_batch_16_saves_1_288_gb() {
    let python = python_with_torch().expect("a Python with torch");
    let dir = tempfile::tempdir().unwrap();
    let script = common::fixtures().join("export_models.py");
    let out =
        std::process::Command::new(python).arg(script).arg(dir.path()).arg("resnet50").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let model = tch::CModule::load(dir.path().join("resnet50.pt")).unwrap();
    let x = Tensor::rand([16, 3, 224, 224], (Kind::Float, Device::Cpu));
    // As the Python tool measures it: train mode, input included, parameters left out. It counts
    // the fc layer's `weight.t()` (8.2 MB) as not a parameter; we leave views of parameters out.
    let (out, report) = memory_for_backward(|| model.forward_ts(&[&x]).unwrap().sum(Kind::Float)).unwrap();
    let gb = report.total_bytes as f64 / (1u64 << 30) as f64;
    println!(
        "ResNet-50 batch 16: {gb:.4} GB saved for backward; allocator delta {} B",
        report.allocator_delta
    );
    for o in report.by_op.iter().take(6) {
        println!("  {:<32} {:>12} B in {} storages", o.op, o.bytes, o.storages);
    }
    let reference = 1.2881765; // the Python graph walk on this model and input size
    assert!((gb - reference).abs() / reference < 0.01, "{gb} GB vs {reference} GB");
    assert_eq!(report.by_op.iter().map(|o| o.bytes).sum::<u64>(), report.total_bytes);
    drop(out);
}
