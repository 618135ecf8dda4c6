//! Memory history and snapshots PyTorch's memory_viz tools read.
mod common;
#[path = "../examples/demo/cnn.rs"]
mod demo;

use common::{cpu_tracker, python_with_torch, MEMORY_VIZ_CHECK as CHECK};
use gpu_mem_track::history::{EventKind, HistoryOptions};
use gpu_mem_track::track;
use tch::{Device, Kind, Tensor};

#[cfg_attr(
    not(gmt_python_torch),
    ignore = "needs Python with torch to export TorchScript models (scripts/dev installs it)"
)]
#[test]
fn snapshot_loads_in_memory_viz_with_the_same_counts_and_peak() {
    let dir = tempfile::tempdir().unwrap();
    let t = cpu_tracker(dir.path());
    t.record_history(0).unwrap();
    let mut kept = Vec::new();
    for step in 0..5i64 {
        let x = Tensor::rand([64, 128], (Kind::Float, Device::Cpu));
        let y = x.matmul(&x.tr()).relu();
        kept.push(y.sum(Kind::Float));
        track!(t);
        drop((x, y, step));
    }
    t.stop_history().unwrap();
    let history = t.history();
    let (allocs, frees) = history.counts();
    assert!(allocs >= 15 && frees >= 10, "{allocs} {frees}");
    assert!(history
        .events
        .iter()
        .any(|e| e.site.as_ref().is_some_and(|s| s.function.contains("snapshot_loads"))));
    let pickle = dir.path().join("snapshot.pickle");
    t.dump_snapshot(&pickle).unwrap();
    // Each host allocation is its own segment: a replay of segments and blocks finds every block
    // inside one.
    let replay = gpu_mem_track::memviz::replay_segments(&pickle).unwrap();
    assert_eq!(replay.blocks, allocs);

    let python = python_with_torch().expect("a Python with torch");
    let script = dir.path().join("check.py");
    std::fs::write(&script, CHECK).unwrap();
    let out = std::process::Command::new(python).arg(&script).arg(&pickle).output().unwrap();
    assert!(out.status.success(), "memory_viz failed: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["allocs"], allocs as u64);
    assert_eq!(v["frees"], frees as u64);
    assert_eq!(v["peak"], history.peak_bytes());
    assert!(v["html"].as_u64().unwrap() > 1000 && v["segments_html"].as_u64().unwrap() > 1000);
    assert!(v["segsum"].as_u64().unwrap() > 0);
    assert_eq!(
        v["live_segments"],
        (allocs - frees) as u64,
        "every allocation of the run still live is a segment"
    );
}

#[test]
fn the_ring_buffer_keeps_the_last_max_entries() {
    let dir = tempfile::tempdir().unwrap();
    let t = cpu_tracker(dir.path());
    t.record_history(1000).unwrap();
    for _ in 0..50_000 {
        drop(Tensor::zeros([4], (Kind::Float, Device::Cpu)));
    }
    t.stop_history().unwrap();
    let h = t.history();
    assert_eq!(h.events.len(), 1000);
    assert_eq!(h.events.len() as u64 + h.dropped, 100_000, "one alloc and one free per tensor");
    // Oldest first, and the last event is the last free.
    assert!(h.events.windows(2).all(|w| w[0].time_us <= w[1].time_us));
    assert_eq!(h.events.last().unwrap().kind, EventKind::Free);
}

#[inline(never)]
fn allocate_here() -> Tensor {
    Tensor::ones([1000], (Kind::Float, Device::Cpu))
}

#[test]
fn stacks_are_resolved_to_rust_functions() {
    let dir = tempfile::tempdir().unwrap();
    let t = cpu_tracker(dir.path());
    t.record_history_with(HistoryOptions::new(100).with_stacks(true)).unwrap();
    let x = allocate_here();
    t.stop_history().unwrap();
    let h = t.history();
    let alloc = h
        .events
        .iter()
        .find(|e| e.kind == EventKind::Alloc && e.size == 4000)
        .expect("the 4000-byte allocation");
    assert!(alloc.frames.iter().any(|f| f.name.contains("allocate_here")), "{:#?}", alloc.frames);
    drop(x);
}

#[cfg_attr(
    not(gmt_python_torch),
    ignore = "needs Python with torch to export TorchScript models (scripts/dev installs it)"
)]
#[test]
fn live_training_step_categories_sum_to_the_peak_with_exact_parameters_and_adam_state() {
    use gpu_mem_track::history::Category;
    use tch::nn::{self, Module, OptimizerConfig};
    let dir = tempfile::tempdir().unwrap();
    let t = cpu_tracker(dir.path());
    // Recording starts before the model exists, so its parameters are in the history.
    t.record_history(0).unwrap();
    let vs = nn::VarStore::new(Device::Cpu);
    let net = nn::seq()
        .add(nn::linear(vs.root() / "l1", 256, 512, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(vs.root() / "l2", 512, 10, Default::default()));
    t.register_varstore(&vs).unwrap();
    let param_bytes: u64 = vs.trainable_variables().iter().map(|p| p.numel() as u64 * 4).sum();
    let mut opt = nn::Adam::default().build(&vs, 1e-3).unwrap();
    for _ in 0..2 {
        let x = Tensor::randn([64, 256], (Kind::Float, Device::Cpu));
        t.tag_input(&x);
        let labels = Tensor::zeros([64], (Kind::Int64, Device::Cpu));
        let loss = net.forward(&x).cross_entropy_for_logits(&labels);
        opt.zero_grad();
        loss.backward();
        t.optimizer_step(|| opt.step());
        track!(t);
    }
    t.stop_history().unwrap();
    let history = t.history();
    let trace = history.trace();
    let peak = trace.peak().unwrap();
    let at = |c: Category| peak.bytes.iter().find(|b| b.0 == c).unwrap().1;
    println!("peak {} B: {:?}", peak.total, peak.bytes);
    assert_eq!(peak.bytes.iter().map(|b| b.1).sum::<u64>(), peak.total, "categories sum to the peak");
    assert_eq!(peak.total, history.peak_bytes(), "the trace's peak is the history's");
    assert_eq!(at(Category::Parameter), param_bytes, "parameters are exactly the model's");
    assert_eq!(at(Category::OptimizerState), 2 * param_bytes, "Adam keeps exp_avg and exp_avg_sq");
    assert!(at(Category::Activation) > 0, "tensors saved for backward are activations");
    // At the end: the last step's gradients (one per parameter) and nothing unexplained.
    let end = trace.timeline().pop().unwrap();
    let end_at = |c: Category| end.bytes.iter().find(|b| b.0 == c).unwrap().1;
    assert_eq!(end_at(Category::Gradient), param_bytes, "{:?}", end.bytes);
    assert_eq!(end_at(Category::Parameter), param_bytes);
    let pickle = dir.path().join("live.pickle");
    t.dump_snapshot(&pickle).unwrap();
    let python = python_with_torch().expect("a Python with torch");
    let script = dir.path().join("categories.py");
    std::fs::write(
        &script,
        "import pickle, sys, collections\nd = pickle.load(open(sys.argv[1], 'rb'))\n\
         c = collections.Counter(e.get('category') for e in d['device_traces'][0] if e['action'] == 'alloc')\n\
         print(','.join(sorted(k for k in c if k)))\n",
    )
    .unwrap();
    let out = std::process::Command::new(python).arg(&script).arg(&pickle).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let cats = String::from_utf8_lossy(&out.stdout);
    for c in ["activation", "gradient", "input", "optimizer_state", "parameter", "temporary"] {
        assert!(cats.contains(c), "{c} missing from the snapshot's categories: {cats}");
    }
}

#[cfg_attr(gmt_gpu, ignore = "tests the path without a GPU; this machine has one")]
#[test]
fn cuda_history_without_a_gpu_says_why_not() {
    use gpu_mem_track::{Error, MemTracker, TrackedDevice};
    assert!(!tch::Cuda::is_available(), "the build found no GPU");
    let dir = tempfile::tempdir().unwrap();
    // Without a GPU the tracker cannot be built for CUDA, or recording refuses clearly.
    match MemTracker::builder().device(TrackedDevice::Cuda(0)).log_dir(dir.path()).build() {
        Err(e) => assert!(e.to_string().contains("CUDA"), "{e}"),
        Ok(t) => match t.record_history(0) {
            Err(Error::CudaUnavailable { reason }) => assert!(reason.contains("cuda:0"), "{reason}"),
            other => panic!("expected CudaUnavailable, got {other:?}"),
        },
    }
}

#[cfg_attr(not(gmt_gpu), ignore = "needs a CUDA GPU")]
#[test]
fn cuda_history_records_the_caching_allocator() {
    use gpu_mem_track::{MemTracker, TrackedDevice};
    assert!(tch::Cuda::is_available(), "the build found a GPU but libtorch sees no CUDA device");
    assert!(
        gpu_mem_track::history::cuda_hooks_compiled(),
        "a GPU machine needs the CUDA headers at build time"
    );
    let dir = tempfile::tempdir().unwrap();
    let t = MemTracker::builder().device(TrackedDevice::Cuda(0)).log_dir(dir.path()).build().unwrap();
    t.clear_cache().unwrap();
    t.record_history(0).unwrap();
    let x = Tensor::zeros([1000], (Kind::Float, Device::Cuda(0)));
    let y = Tensor::zeros([8 << 20], (Kind::Float, Device::Cuda(0)));
    drop(x);
    t.stop_history().unwrap();
    let h = t.history();
    let sizes: Vec<(EventKind, u64)> = h.events.iter().map(|e| (e.kind, e.size)).collect();
    // The trace keeps the size asked for, as PyTorch's own does (torch 2.11 on an H200: 1000
    // floats are 4000 B, in a block rounded to 4096 B); a small block opens a 2 MiB segment of
    // the small pool, a 32 MiB one a segment of its own.
    assert!(sizes.contains(&(EventKind::Alloc, 4000)), "1000 floats: {sizes:?}");
    assert!(sizes.contains(&(EventKind::Free, 4000)), "{sizes:?}");
    assert!(sizes.contains(&(EventKind::Alloc, 32 << 20)), "{sizes:?}");
    assert!(sizes.contains(&(EventKind::SegmentAlloc, 2 << 20)), "{sizes:?}");
    assert!(sizes.contains(&(EventKind::SegmentAlloc, 32 << 20)), "{sizes:?}");
    let pickle = dir.path().join("cuda.pickle");
    t.dump_snapshot(&pickle).unwrap();
    // PyTorch's own reader takes it, blocks adding up to their segments.
    let script = dir.path().join("check.py");
    std::fs::write(&script, CHECK).unwrap();
    let python = python_with_torch().expect("a Python with torch");
    let out = std::process::Command::new(python).arg(&script).arg(&pickle).output().unwrap();
    assert!(out.status.success(), "memory_viz failed: {}", String::from_utf8_lossy(&out.stderr));
    drop(y);
}

#[test]
fn registered_buffers_stay_buffers_when_autograd_saves_them() {
    use gpu_mem_track::history::Category;
    use tch::nn::{self, ModuleT};
    let dir = tempfile::tempdir().unwrap();
    let t = cpu_tracker(dir.path());
    t.record_history(0).unwrap();
    let vs = nn::VarStore::new(Device::Cpu);
    let net = nn::seq_t()
        .add(nn::conv2d(vs.root() / "conv", 3, 8, 3, Default::default()))
        .add(nn::batch_norm2d(vs.root() / "bn", 8, Default::default()));
    t.register_varstore(&vs).unwrap();
    let bytes = |trainable: bool| -> u64 {
        vs.variables()
            .values()
            .filter(|v| v.requires_grad() == trainable)
            .map(|v| v.numel() as u64 * v.kind().elt_size_in_bytes() as u64)
            .sum()
    };
    let x = Tensor::randn([4, 3, 16, 16], (Kind::Float, Device::Cpu));
    net.forward_t(&x, true).sum(Kind::Float).backward();
    t.stop_history().unwrap();
    let end = t.history().trace().timeline().pop().unwrap();
    let at = |c: Category| end.bytes.iter().find(|b| b.0 == c).unwrap().1;
    assert!(bytes(false) > 0, "batch norm has running statistics");
    assert_eq!(
        at(Category::Buffer),
        bytes(false),
        "batch norm saves its running stats, still buffers: {:?}",
        end.bytes
    );
    assert_eq!(at(Category::Parameter), bytes(true));
    assert_eq!(at(Category::Gradient), bytes(true));
}

/// Out of memory on CUDA (the CPU path is in tests/oom.rs; this test lives here to ship in the
/// GPU bundle's one test binary). The CUDA path: the caching allocator's out-of-memory observer writes the same block, with the
/// device's figures, and a snapshot of the allocator's segments.
#[cfg_attr(not(gmt_gpu), ignore = "needs a CUDA GPU (run it with the GPU bundle where one is lent)")]
#[test]
fn a_cuda_out_of_memory_is_logged_by_the_allocators_observer() {
    use gpu_mem_track::log::{parse_log_file, DEVICE_TOTAL, REQUESTED, RESERVED};
    use gpu_mem_track::MemTracker;
    use gpu_mem_track::TrackedDevice;
    const MIB: f64 = 1024.0 * 1024.0;
    assert!(tch::Cuda::is_available(), "the build found a GPU but libtorch sees no CUDA device");
    let dir = tempfile::tempdir().unwrap();
    let t = MemTracker::builder().device(TrackedDevice::Cuda(0)).log_dir(dir.path()).build().unwrap();
    let kept = Tensor::zeros([16 << 20], (Kind::Float, Device::Cuda(0)));
    let site_line = line!() + 1;
    track!(t);
    // Four times what any GPU has: refused after the allocator's own retry.
    let err = Tensor::f_empty([1i64 << 40], (Kind::Float, Device::Cuda(0))).expect_err("4 TiB do not fit");
    assert!(err.to_string().contains("out of memory"), "{err}");
    let log = parse_log_file(t.log_path()).unwrap();
    let oom = log.blocks.last().unwrap();
    assert!(oom.is_oom(), "{:?}", oom.notes);
    assert_eq!(oom.at.location.line, site_line);
    assert_eq!(oom.at.field(REQUESTED), Some((4u64 << 40) as f64 / MIB));
    assert!(oom.at.field(DEVICE_TOTAL).unwrap() > 1000.0);
    assert!(oom.at.field(RESERVED).unwrap() >= 64.0);
    assert!(oom.notes[0].starts_with("OUT OF MEMORY on cuda:0 in aten::empty"), "{:?}", oom.notes);
    assert!(
        oom.notes.iter().any(|n| n.contains("64.0 MiB  1 * (16777216,) torch.float32 Tensor")),
        "{:?}",
        oom.notes
    );
    let name = t
        .log_path()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .replace("-gpu_mem_track.txt", "-oom-snapshot.pickle");
    let pickle = t.log_path().with_file_name(name);
    let replay = gpu_mem_track::memviz::replay_segments(&pickle).unwrap();
    assert_eq!(replay.ooms, 1);
    drop(kept);
}

/// The demo's network and step (examples/train.rs), logged twice: with a memory history recorded
/// and without. The log must not depend on it: same lines, timestamps aside.
#[test]
fn the_demo_step_logs_the_same_lines_with_history_on_and_off() {
    use gpu_mem_track::MemTracker;
    use tch::nn::{self, Module, OptimizerConfig};

    use demo::cnn;
    fn step(t: &MemTracker, model: &impl Module, opt: &mut nn::Optimizer) {
        let x = Tensor::rand([32, 1, 28, 28], (Kind::Float, Device::Cpu));
        let y = Tensor::randint(10, [32], (Kind::Int64, Device::Cpu));
        t.tag_input(&x);
        let logits = model.forward(&x);
        track!(t);
        let loss = logits.cross_entropy_for_logits(&y);
        opt.zero_grad();
        loss.backward();
        track!(t);
        t.optimizer_step(|| opt.step());
        track!(t);
    }
    /// The log's lines after its header (its timestamp).
    fn run(history: bool) -> Vec<String> {
        let dir = tempfile::tempdir().unwrap();
        let t = cpu_tracker(dir.path());
        if history {
            t.record_history(0).unwrap();
        }
        let vs = nn::VarStore::new(Device::Cpu);
        let model = cnn(&vs.root());
        t.register_varstore(&vs).unwrap();
        let mut opt = nn::Adam::default().build(&vs, 1e-3).unwrap();
        track!(t);
        for _ in 0..3 {
            step(&t, &model, &mut opt);
        }
        if history {
            t.stop_history().unwrap();
        }
        drop((opt, model, vs));
        let log = std::fs::read_to_string(t.log_path()).unwrap();
        log.lines()
            .skip(1)
            .map(|l| {
                if l.starts_with("At ") {
                    l.split(" Total").next().unwrap_or(l).to_owned()
                } else {
                    l.to_owned()
                }
            })
            .collect()
    }
    let off = run(false);
    let on = run(true);
    assert!(off.iter().filter(|l| l.starts_with("+ |")).count() > 10, "{off:#?}");
    assert!(!off.iter().any(|l| l.contains("Memory: 0.0 M")), "views are folded by default: {off:#?}");
    let differ: Vec<(usize, &String, &String)> =
        off.iter().zip(&on).enumerate().filter(|(_, (a, b))| a != b).map(|(i, (a, b))| (i, a, b)).collect();
    assert!(
        differ.is_empty() && off.len() == on.len(),
        "history off / on differ: {differ:#?}\n{} vs {} lines",
        off.len(),
        on.len()
    );
}

/// On CUDA the log explains the cuBLAS workspaces (this test lives here to ship in the GPU
/// bundle's one test binary): after a first matmul, `Workspace Memory` counts them, a tensor of
/// a workspace's size stays a tensor, and tensors + workspaces + unattributed = Total Allocated
/// Memory, to the byte.
#[cfg_attr(not(gmt_gpu), ignore = "needs a CUDA GPU (run it with the GPU bundle where one is lent)")]
#[test]
fn a_cuda_log_adds_up_with_the_cublas_workspaces() {
    use gpu_mem_track::log::{parse_log_file, ALLOCATED, TENSOR_USED, UNATTRIBUTED, WORKSPACE};
    use gpu_mem_track::{MemTracker, TrackedDevice};
    let dir = tempfile::tempdir().unwrap();
    let t = MemTracker::builder().device(TrackedDevice::Cuda(0)).log_dir(dir.path()).build().unwrap();
    let adds_up = |p: &gpu_mem_track::TrackPoint| {
        let w = p.workspace_bytes.expect("a CUDA line has the workspace figure");
        assert_eq!(p.tensor_bytes + w + p.unattributed_bytes, p.allocator.allocated, "{p:?}");
        w
    };
    let a = Tensor::randn([512, 512], (Kind::Float, Device::Cuda(0)));
    let before = adds_up(&track!(t).unwrap());
    let b = a.matmul(&a);
    let after = adds_up(&track!(t).unwrap());
    let sizes = gpu_mem_track_gpu::cuda_libraries::workspace_sizes_from_env();
    assert!(
        after >= before + sizes[0],
        "a matmul's handle keeps a workspace: {before} -> {after} ({sizes:?})"
    );
    // A tensor of the largest workspace size is a tensor.
    let largest = *sizes.last().unwrap();
    let lookalike = Tensor::zeros([i64::try_from(largest / 4).unwrap()], (Kind::Float, Device::Cuda(0)));
    let p = track!(t).unwrap();
    assert_eq!(adds_up(&p), after, "the lookalike tensor is no workspace");
    let log = parse_log_file(t.log_path()).unwrap();
    let at = &log.blocks.last().unwrap().at;
    let sum: f64 = [TENSOR_USED, WORKSPACE, UNATTRIBUTED].iter().map(|f| at.field(f).unwrap()).sum();
    assert!((sum - at.field(ALLOCATED).unwrap()).abs() <= 0.15, "{}", at.render());
    drop((a, b, lookalike));
}
