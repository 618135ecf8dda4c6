//! Out of memory on the CPU (`cpu_memory_limit`): the block in the log, the snapshot beside it,
//! `report`, and that the program gets the error it would get without the tracker.
mod common;

use std::path::{Path, PathBuf};

use common::python_with_torch;
use gpu_mem_track::log::oom::OOM_MARK;
use gpu_mem_track::log::{parse_log_file, MEMORY_LIMIT, REQUESTED};
use gpu_mem_track::report::{analyse_file, combine, render_text};
use gpu_mem_track::{cpu_allocator_stats, track, MemTracker, TrackPoint, TrackedDevice};
use tch::nn::{self, Module, OptimizerConfig};
use tch::{Device, Kind, Tensor};

const MIB: f64 = 1024.0 * 1024.0;

fn model(vs: &nn::Path) -> nn::Sequential {
    nn::seq()
        .add(nn::conv2d(vs / "conv1", 3, 32, 3, nn::ConvConfig { padding: 1, ..Default::default() }))
        .add_fn(|x| x.relu())
        .add(nn::conv2d(vs / "conv2", 32, 64, 3, nn::ConvConfig { padding: 1, ..Default::default() }))
        .add_fn(|x| x.relu().flatten(1, -1))
        .add(nn::linear(vs / "fc", 64 * 32 * 32, 10, Default::default()))
}

fn batch() -> (Tensor, Tensor) {
    tch::manual_seed(0);
    (
        Tensor::randn([16, 3, 32, 32], (Kind::Float, Device::Cpu)),
        Tensor::zeros([16], (Kind::Int64, Device::Cpu)),
    )
}

/// One unlimited step, measured by a tracker of its own: the allocator peak of the forward pass
/// and of the backward pass.
fn measure(dir: &Path) -> (u64, u64) {
    let t = MemTracker::builder().device(TrackedDevice::Cpu).log_dir(dir).build().unwrap();
    let vs = nn::VarStore::new(Device::Cpu);
    let net = model(&vs.root());
    let (x, y) = batch();
    track!(t);
    let loss = net.forward(&x).cross_entropy_for_logits(&y);
    let forward: TrackPoint = track!(t).unwrap();
    loss.backward();
    let backward: TrackPoint = track!(t).unwrap();
    (forward.allocator.peak_since_previous, backward.allocator.peak_since_previous)
}

fn memory_viz_trace(pickle: &Path) -> String {
    let python = python_with_torch().expect("a Python with torch");
    let out = std::process::Command::new(python)
        .args(["-m", "torch.cuda._memory_viz", "trace"])
        .arg(pickle)
        .output()
        .unwrap();
    assert!(out.status.success(), "memory_viz failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn snapshot_beside(log: &Path, suffix: &str) -> PathBuf {
    let name = log.file_name().unwrap().to_string_lossy().replace("-gpu_mem_track.txt", suffix);
    log.with_file_name(name)
}

#[cfg_attr(
    not(gmt_python_torch),
    ignore = "needs Python with torch for memory_viz (scripts/dev installs it)"
)]
#[test]
fn a_step_out_of_memory_mid_backward_leaves_a_whole_block_a_snapshot_and_the_usual_error() {
    gpu_mem_track::install().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (forward_peak, backward_peak) = measure(dir.path());
    assert!(backward_peak > forward_peak + (1 << 20), "forward {forward_peak}, backward {backward_peak}");
    // Room for the forward pass, not for the backward pass.
    let limit = (forward_peak + backward_peak) / 2;

    let logs = dir.path().join("limited");
    std::fs::create_dir(&logs).unwrap();
    let t = MemTracker::builder()
        .device(TrackedDevice::Cpu)
        .log_dir(&logs)
        .cpu_memory_limit(limit)
        .build()
        .unwrap();
    let vs = nn::VarStore::new(Device::Cpu);
    let net = model(&vs.root());
    t.register_varstore(&vs).unwrap();
    // With a history, the snapshot has the whole trace and the block knows the activations.
    t.record_history(0).unwrap();
    let mut opt = nn::Adam::default().build(&vs, 1e-3).unwrap();
    let (x, y) = batch();
    let loss = net.forward(&x).cross_entropy_for_logits(&y);
    let site_line = line!() + 1;
    track!(t);
    let log_before = std::fs::read_to_string(t.log_path()).unwrap();

    let err = loss.f_backward().expect_err("the backward pass needs more than the limit");
    // tch's usual error, with c10's message for a CPU allocation that failed.
    let tch::TchError::Torch(message) = &err else { panic!("not a Torch error: {err:?}") };
    assert!(message.contains("DefaultCPUAllocator: not enough memory: you tried to allocate"), "{message}");
    opt.zero_grad();

    let text = std::fs::read_to_string(t.log_path()).unwrap();
    assert!(text.starts_with(&log_before), "what was in the log stays");
    let log = parse_log_file(t.log_path()).expect("the log parses strictly");
    let oom = log.blocks.last().unwrap();
    assert!(oom.is_oom());
    assert!(text.ends_with("Mb\n\n"), "the block is whole");
    assert_eq!(oom.at.location.file, file!());
    assert_eq!(oom.at.location.line, site_line);
    assert!(oom.at.location.function.contains(OOM_MARK), "{}", oom.at.location.function);
    assert_eq!(oom.at.field(MEMORY_LIMIT), Some((limit as f64 / MIB * 10.0).round() / 10.0));
    let requested = oom.at.field(REQUESTED).unwrap();
    assert!(requested > 0.0);
    let first = &oom.notes[0];
    assert!(first.starts_with("OUT OF MEMORY on cpu in aten::"), "{first}");
    assert!(first.contains(&format!("after {} line {site_line}:", file!())), "{first}");
    let notes = oom.notes.join("\n");
    assert!(notes.contains("of the ") && notes.contains("limit (cpu_memory_limit)"), "{notes}");
    assert!(notes.contains("largest live tensor groups"), "{notes}");
    // The first layer's weight is a parameter the tracker knows by its VarStore.
    assert!(notes.contains("(32, 3, 3, 3) torch.float32 Parameter, parameters"), "{notes}");
    // The forward activations autograd keeps for the backward pass, and the op that made them.
    assert!(notes.contains("Tensor, activations saved for backward, made by aten::relu"), "{notes}");
    assert!(notes.contains("remedy: "), "{notes}");
    let pickle = snapshot_beside(t.log_path(), "-oom-snapshot.pickle");
    assert!(notes.contains(&pickle.display().to_string()), "{notes}");

    // The snapshot: PyTorch's own reader ends with the failure; every block lies in a segment.
    let trace = memory_viz_trace(&pickle);
    assert!(trace.contains("raise OutOfMemoryError"), "{trace}");
    let replay = gpu_mem_track::memviz::replay_segments(&pickle).unwrap();
    assert_eq!(replay.ooms, 1);
    assert!(replay.blocks > 10, "the history's allocations: {replay:?}");

    // `report` puts the failure first.
    let report = render_text(&combine(vec![analyse_file(t.log_path(), 10).unwrap()]));
    let oom_at = report.find("OUT OF MEMORY at").expect("report names the failure");
    assert!(oom_at < report.find("peak").unwrap(), "{report}");
    assert!(report.contains("| largest live tensor groups"), "{report}");
}

#[test]
fn a_second_failure_writes_a_second_block_and_failures_inside_a_report_do_not_recurse() {
    gpu_mem_track::install().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let live = cpu_allocator_stats().unwrap().current;
    let t = MemTracker::builder()
        .device(TrackedDevice::Cpu)
        .log_dir(dir.path())
        .cpu_memory_limit(live + (8 << 20))
        .op_names(true)
        .build()
        .unwrap();
    let kept = Tensor::zeros([1 << 20], (Kind::Float, Device::Cpu)); // 4 MiB of the 8
    track!(t);
    for n in 0..2 {
        let allocations = cpu_allocator_stats().unwrap().allocations;
        let err = Tensor::f_zeros([1 << 21], (Kind::Float, Device::Cpu)).expect_err("8 MiB more do not fit");
        assert!(err.to_string().contains("not enough memory"), "{n}: {err}");
        // The report allocated nothing on the failing device (and the refused allocation is not
        // counted): it ran on what the allocator let it hold.
        assert_eq!(cpu_allocator_stats().unwrap().allocations, allocations, "{n}");
    }
    // Failures on several threads at once: each writes a whole block.
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| assert!(Tensor::f_ones([1 << 22], (Kind::Float, Device::Cpu)).is_err()));
        }
    });
    let log = parse_log_file(t.log_path()).expect("whole blocks parse strictly");
    let ooms: Vec<_> = log.blocks.iter().filter(|b| b.is_oom()).collect();
    assert_eq!(ooms.len(), 5);
    assert!(
        ooms[1].notes[0].starts_with("OUT OF MEMORY (#2 in this log) on cpu in aten::"),
        "{:?}",
        ooms[1].notes
    );
    assert_eq!(ooms[0].at.field(REQUESTED), Some(8.0));
    assert_eq!(ooms[4].at.field(REQUESTED), Some(16.0));
    for (i, suffix) in
        ["-oom-snapshot.pickle", "-oom-snapshot-2.pickle", "-oom-snapshot-5.pickle"].iter().enumerate()
    {
        let p = snapshot_beside(t.log_path(), suffix);
        let replay = gpu_mem_track::memviz::replay_segments(&p).unwrap_or_else(|e| panic!("{i}: {e}"));
        assert_eq!(replay.ooms, 1);
    }
    // The first block lists the live 4 MiB tensor with the op that made it.
    let notes = ooms[0].notes.join("\n");
    assert!(notes.contains("4.0 MiB  1 * (1048576,) torch.float32 Tensor, made by aten::"), "{notes}");
    drop(kept);
    track!(t);
    // The limit goes with the tracker that set it.
    drop(t);
    assert!(Tensor::f_zeros([1 << 22], (Kind::Float, Device::Cpu)).is_ok());
}
