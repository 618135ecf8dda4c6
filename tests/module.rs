//! TorchScript modules: `CModule::load` creates parameters and buffers no op returns, so they only
//! appear once `register_module` registers them.
mod common;

use common::{cpu_tracker, last_group_lines, line, python_with_torch, PARAM, TENSOR};
use gpu_mem_track::track;

const EXPORT: &str = r#"
import sys, torch
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.bn = torch.nn.BatchNorm2d(8)
    def forward(self, x):
        return self.bn(self.conv(x))
torch.jit.script(Net()).save(sys.argv[1])
"#;

#[cfg_attr(
    not(gmt_python_torch),
    ignore = "needs Python with torch to export TorchScript models (scripts/dev installs it)"
)]
#[test]
fn register_module_registers_parameters_and_buffers() {
    let python = python_with_torch().expect("a Python with torch");
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("net.pt");
    // torch.jit.script reads the class's source, so the exporter must be a file, not `-c`.
    let script = dir.path().join("export.py");
    std::fs::write(&script, EXPORT).unwrap();
    let out = std::process::Command::new(python).arg(&script).arg(&model).output().unwrap();
    assert!(out.status.success(), "export failed: {}", String::from_utf8_lossy(&out.stderr));

    let t = cpu_tracker(dir.path());
    let module = tch::CModule::load(&model).unwrap();
    track!(t).unwrap();
    assert_eq!(t.register_module(&module).unwrap(), 7, "conv weight+bias, bn weight+bias+3 buffers");
    track!(t).unwrap();
    assert_eq!(
        last_group_lines(&t),
        vec![
            line('+', 1, "(8, 3, 3, 3)", "0.0008", PARAM, "torch.float32"),
            line('+', 3, "(8,)", "0.0001", PARAM, "torch.float32"),
            line('+', 2, "(8,)", "0.0001", TENSOR, "torch.float32"),
            line('+', 1, "()", "7.6e-06", TENSOR, "torch.int64"),
        ]
    );
    let names: Vec<_> = t.live_tensors().unwrap().into_iter().filter_map(|i| i.name).collect();
    for n in [
        "conv.weight",
        "conv.bias",
        "bn.weight",
        "bn.bias",
        "bn.running_mean",
        "bn.running_var",
        "bn.num_batches_tracked",
    ] {
        assert!(names.iter().any(|x| x == n), "{n} missing from {names:?}");
    }
    drop(module);
    track!(t).unwrap();
    assert_eq!(last_group_lines(&t).len(), 4, "all module tensors went away with it");
}
