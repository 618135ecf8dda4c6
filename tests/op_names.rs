//! `op_names(true)`: `+`/`-` lines grouped by the op that made the tensors, named in a last column
//! that `report` reads; absent by default.
mod common;

use common::raw_blocks;
use gpu_mem_track::log::parse_log_file;
use gpu_mem_track::report::analyse_file;
use gpu_mem_track::{track, MemTracker, TrackedDevice};
use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

fn cnn_step(op_names: bool) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let t = MemTracker::builder()
        .device(TrackedDevice::Cpu)
        .log_dir(dir.path())
        .op_names(op_names)
        .build()
        .unwrap();
    let vs = nn::VarStore::new(Device::Cpu);
    let conv = nn::conv2d(vs.root() / "conv", 3, 8, 3, Default::default());
    let x = Tensor::randn([4, 3, 16, 16], (Kind::Float, Device::Cpu));
    track!(t);
    let y = conv.forward(&x);
    let s = (&y * &y).sum(Kind::Float);
    track!(t);
    s.backward();
    track!(t);
    drop((y, s));
    (dir, t.log_path().to_owned())
}

#[test]
fn op_names_name_the_op_that_made_each_group() {
    let (_dir, log) = cnn_step(true);
    let blocks = raw_blocks(&log);
    let forward = &blocks[1].0;
    // The convolution's output, named by the call the program made.
    assert!(
        forward
            .iter()
            .any(|l| l.starts_with("+ | 1 * Size:(4, 8, 14, 14)") && l.ends_with(" | aten::conv2d")),
        "{forward:#?}"
    );
    assert!(
        forward.iter().any(|l| l.starts_with("+ | 1 * Size:()") && l.ends_with(" | aten::sum")),
        "{forward:#?}"
    );
    // Gradients are stored by the autograd node that accumulates them.
    let backward = &blocks[2].0;
    assert!(
        backward.iter().any(|l| l.contains("Size:(8, 3, 3, 3)") && l.ends_with("AccumulateGrad")),
        "{backward:#?}"
    );
    // `report` and the strict parser read the extra column.
    let parsed = parse_log_file(&log).unwrap();
    let conv_line = parsed.blocks[1].changes.iter().find(|g| g.shape == vec![4, 8, 14, 14]).unwrap();
    assert_eq!(conv_line.op.as_deref(), Some("aten::conv2d"));
    assert_eq!(analyse_file(&log, 10).unwrap().points, 3);
}

#[test]
fn default_logs_have_no_op_column() {
    let (_dir, log) = cnn_step(false);
    for (lines, _) in raw_blocks(&log) {
        for l in lines {
            // After the five fields only what the tensors are (`gradient`, `internal to ...`)
            // and their views: no op column.
            for extra in l.split(" | ").skip(5) {
                let role = gpu_mem_track::TensorRole::from_label(extra).is_some();
                assert!(role || extra.ends_with(" views)"), "{l}");
            }
        }
    }
}
