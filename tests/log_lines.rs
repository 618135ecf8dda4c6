//! Exact log content for tensors created, viewed, cloned, moved, converted and dropped on CPU.
//! Each test runs in its own process (cargo nextest), so byte counts are exact.
mod common;

use common::{cpu_tracker, last_group_lines, line, raw_blocks, PARAM, TENSOR};
use gpu_mem_track::log::{parse_log_file, ALLOCATED, PEAK_ALLOCATED, TENSOR_USED, UNATTRIBUTED, WORKSPACE};
use gpu_mem_track::{cpu_allocator_stats, track, MemTracker, TrackedDevice};
use tch::{Device, Kind, Tensor};

const QUARTER_MIB: usize = 256 * 256 * 4;

#[test]
fn create_view_clone_move_convert_drop() {
    let dir = tempfile::tempdir().unwrap();
    let t = cpu_tracker(dir.path());
    track!(t).unwrap();

    let a = Tensor::zeros([256, 256], (Kind::Float, Device::Cpu));
    let p = track!(t).unwrap();
    assert_eq!(last_group_lines(&t), vec![line('+', 1, "(256, 256)", "0.25", TENSOR, "torch.float32")]);
    assert_eq!(p.tensor_bytes, QUARTER_MIB as u64);

    // A view shares the storage: it adds no memory and prints nothing on its own.
    let v = a.view([65536]);
    let p = track!(t).unwrap();
    assert_eq!(last_group_lines(&t), Vec::<String>::new());
    assert_eq!(p.tensor_bytes, QUARTER_MIB as u64, "views are not double counted");

    // A clone joins the (256, 256) group: 1 -> 2 prints one `+ | 1 *` line, not `+2` and `-1`.
    let b = a.copy();
    let p = track!(t).unwrap();
    assert_eq!(last_group_lines(&t), vec![line('+', 1, "(256, 256)", "0.25", TENSOR, "torch.float32")]);
    assert_eq!(p.tensor_bytes, 2 * QUARTER_MIB as u64);

    // Moving a tensor between Rust owners, or `to` the device it is on, creates nothing.
    let holder = vec![b];
    let same = a.to_device(Device::Cpu);
    track!(t).unwrap();
    assert_eq!(last_group_lines(&t), Vec::<String>::new());

    // A dtype conversion is a new tensor of twice the bytes.
    let d = a.to_kind(Kind::Double);
    track!(t).unwrap();
    assert_eq!(last_group_lines(&t), vec![line('+', 1, "(256, 256)", "0.5", TENSOR, "torch.float64")]);

    drop(holder);
    track!(t).unwrap();
    assert_eq!(last_group_lines(&t), vec![line('-', 1, "(256, 256)", "0.25", TENSOR, "torch.float32")]);

    // Dropping the base, its view and the conversion: largest first, then by key; the view goes
    // on its owner's line.
    drop((a, v, same, d));
    let p = track!(t).unwrap();
    assert_eq!(
        last_group_lines(&t),
        vec![
            line('-', 1, "(256, 256)", "0.5", TENSOR, "torch.float64"),
            line('-', 1, "(256, 256)", "0.25", TENSOR, "torch.float32") + " | (+1 views)",
        ]
    );
    assert_eq!(p.tensor_bytes, 0);
}

/// `detail_views(true)`: views get lines of their own, `Memory: 0.0 M`, as in Pytorch-Memory-Utils.
#[test]
fn views_print_lines_of_their_own_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let t = MemTracker::builder()
        .device(TrackedDevice::Cpu)
        .log_dir(dir.path())
        .detail_views(true)
        .build()
        .unwrap();
    let a = Tensor::zeros([256, 256], (Kind::Float, Device::Cpu));
    track!(t).unwrap();
    let v = a.view([65536]);
    track!(t).unwrap();
    assert_eq!(last_group_lines(&t), vec![line('+', 1, "(65536,)", "0.0", TENSOR, "torch.float32")]);
    drop((a, v));
    track!(t).unwrap();
    assert_eq!(
        last_group_lines(&t),
        vec![
            line('-', 1, "(256, 256)", "0.25", TENSOR, "torch.float32"),
            line('-', 1, "(65536,)", "0.0", TENSOR, "torch.float32"),
        ]
    );
}

#[test]
fn at_line_totals_are_live_storages_and_the_allocator_count() {
    let dir = tempfile::tempdir().unwrap();
    let t = cpu_tracker(dir.path());
    let x = Tensor::ones([1000, 1000], (Kind::Float, Device::Cpu)); // 4,000,000 B
    let y = x.narrow(0, 0, 10); // view: no bytes
    let z = Tensor::arange(1000, (Kind::Int64, Device::Cpu)); // 8,000 B
    let p = track!(t).unwrap();
    assert_eq!(p.tensor_bytes, 4_000_000 + 8_000);
    let stats = cpu_allocator_stats().expect("installed");
    assert_eq!(
        p.allocator.allocated, stats.current,
        "Total Allocated Memory is the wrapped allocator's count"
    );

    let log = parse_log_file(t.log_path()).unwrap();
    let at = &log.blocks.last().unwrap().at;
    let mib = |b: u64| (b as f64 / 1048576.0 * 10.0).round() / 10.0;
    assert_eq!(at.field(TENSOR_USED), Some(mib(4_008_000)));
    assert_eq!(at.field(ALLOCATED), Some(mib(stats.current)));
    // What tensors do not explain is printed as such; the CPU has no library workspaces.
    assert_eq!(p.tensor_bytes + p.unattributed_bytes, p.allocator.allocated);
    assert_eq!(at.field(UNATTRIBUTED), Some(mib(p.unattributed_bytes)));
    assert_eq!((p.workspace_bytes, at.field(WORKSPACE)), (None, None));

    // 2 MiB the registry never saw (a library's buffer, to the log): unattributed.
    gpu_mem_track::set_registry_enabled(false).unwrap();
    let hidden = Tensor::zeros([512 * 1024], (Kind::Float, Device::Cpu));
    gpu_mem_track::set_registry_enabled(true).unwrap();
    let q = track!(t).unwrap();
    assert_eq!(q.tensor_bytes, p.tensor_bytes);
    assert_eq!(q.unattributed_bytes, p.unattributed_bytes + (2 << 20));
    assert_eq!(q.tensor_bytes + q.unattributed_bytes, q.allocator.allocated);
    drop((x, y, z, hidden));
}

#[test]
fn peak_between_lines_comes_from_the_allocator() {
    let dir = tempfile::tempdir().unwrap();
    let t = cpu_tracker(dir.path());
    let before = track!(t).unwrap().allocator.allocated;
    {
        let tmp = Tensor::zeros([1024, 1024], (Kind::Float, Device::Cpu)); // 4 MiB, freed before the line
        drop(tmp);
    }
    let p = track!(t).unwrap();
    assert_eq!(p.allocator.allocated, before);
    assert_eq!(p.allocator.peak_since_previous, before + 4 * 1024 * 1024);
    let log = parse_log_file(t.log_path()).unwrap();
    let at = &log.blocks.last().unwrap().at;
    assert_eq!(
        at.field(PEAK_ALLOCATED),
        Some(((before + 4 * 1024 * 1024) as f64 / 1048576.0 * 10.0).round() / 10.0)
    );
    // The window restarts at each line.
    let p = track!(t).unwrap();
    assert_eq!(p.allocator.peak_since_previous, before);
}

#[test]
fn varstore_variables_print_as_parameters_and_grads_as_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let t = cpu_tracker(dir.path());
    track!(t).unwrap();
    let vs = tch::nn::VarStore::new(Device::Cpu);
    let fc = tch::nn::linear(vs.root() / "fc", 32, 16, Default::default());
    assert_eq!(t.register_varstore(&vs).unwrap(), 2);
    track!(t).unwrap();
    assert_eq!(
        last_group_lines(&t),
        vec![
            line('+', 1, "(16, 32)", "0.002", PARAM, "torch.float32"),
            line('+', 1, "(16,)", "0.0001", PARAM, "torch.float32"),
        ]
    );
    let mut listing = Vec::new();
    t.print_all_tensors(&mut listing).unwrap();
    let listing = String::from_utf8(listing).unwrap();
    assert!(listing.contains("fc.weight"), "{listing}");
    assert!(listing.contains("2 tensors on cpu, 2112 bytes"), "{listing}");

    let x = Tensor::ones([4, 32], (Kind::Float, Device::Cpu));
    let loss = x.apply(&fc).sum(Kind::Float);
    loss.backward();
    drop(loss);
    track!(t).unwrap();
    let lines = last_group_lines(&t);
    // The input and the two gradients (plain tensors, not parameters, said to be gradients).
    let gradient = |shape, mib| line('+', 1, shape, mib, TENSOR, "torch.float32") + " | gradient";
    assert!(lines.contains(&gradient("(16, 32)", "0.002")), "{lines:#?}");
    assert!(lines.contains(&line('+', 1, "(4, 32)", "0.0005", TENSOR, "torch.float32")), "{lines:#?}");
    assert!(lines.contains(&gradient("(16,)", "0.0001")), "{lines:#?}");
}

#[test]
fn tensors_the_registry_missed_appear_once_registered() {
    let dir = tempfile::tempdir().unwrap();
    let t = cpu_tracker(dir.path());
    gpu_mem_track::set_registry_enabled(false).unwrap();
    let hidden = Tensor::zeros([128], (Kind::Int64, Device::Cpu));
    gpu_mem_track::set_registry_enabled(true).unwrap();
    track!(t).unwrap();
    assert!(last_group_lines(&t).is_empty());
    t.register(&hidden, "hidden").unwrap();
    track!(t).unwrap();
    assert_eq!(last_group_lines(&t), vec![line('+', 1, "(128,)", "0.001", TENSOR, "torch.int64")]);
}

#[test]
fn without_detail_only_at_lines_are_written() {
    let dir = tempfile::tempdir().unwrap();
    let t = gpu_mem_track::MemTracker::builder()
        .device(gpu_mem_track::TrackedDevice::Cpu)
        .log_dir(dir.path())
        .detail(false)
        .build()
        .unwrap();
    let x = Tensor::zeros([512, 512], (Kind::Float, Device::Cpu));
    let p = track!(t).unwrap();
    assert!(p.changes.is_empty());
    assert_eq!(p.tensor_bytes, 512 * 512 * 4);
    let blocks = raw_blocks(t.log_path());
    assert_eq!(blocks.len(), 1);
    assert!(blocks[0].0.is_empty());
    assert!(blocks[0].1.contains("Total Tensor Used Memory:1.0    Mb"), "{}", blocks[0].1);
    drop(x);
}

/// A view and a tensor that owns its storage are different groups even with the same shape and
/// dtype: when the base of a same-shaped view goes away and a new tensor of that shape comes
/// (gradients replacing transposed-weight views), the log shows a view leaving and a tensor
/// arriving, never a line with a count of 0.
#[test]
fn views_and_owners_of_one_shape_are_separate_groups() {
    let dir = tempfile::tempdir().unwrap();
    let t = MemTracker::builder()
        .device(TrackedDevice::Cpu)
        .log_dir(dir.path())
        .detail_views(true)
        .build()
        .unwrap();
    let w = Tensor::zeros([128, 128], (Kind::Float, Device::Cpu));
    let wt = w.tr(); // a (128, 128) view of w's storage
    track!(t).unwrap();
    assert_eq!(
        last_group_lines(&t),
        vec![
            line('+', 1, "(128, 128)", "0.0625", TENSOR, "torch.float32"),
            line('+', 1, "(128, 128)", "0.0", TENSOR, "torch.float32"),
        ]
    );
    // The view goes, an owner of the same shape comes: the (shape, dtype, class) count is
    // unchanged, but both moves are printed, each with count 1.
    drop(wt);
    let g = Tensor::ones([128, 128], (Kind::Float, Device::Cpu));
    track!(t).unwrap();
    assert_eq!(
        last_group_lines(&t),
        vec![
            line('+', 1, "(128, 128)", "0.0625", TENSOR, "torch.float32"),
            line('-', 1, "(128, 128)", "0.0", TENSOR, "torch.float32"),
        ]
    );
    drop((w, g));
    track!(t).unwrap();
    let all = std::fs::read_to_string(t.log_path()).unwrap();
    assert!(!all.contains("| 0 * "), "no line has a count of 0:\n{all}");
}

/// What the registry knows a group is, said after the five fields: max-pool's indices are
/// internal to the call that made them, the parameters' gradients are gradients (named or not),
/// what an optimizer step keeps is optimizer state; a call's own result is none of these, also
/// when it is a view of what an inner op made (conv1d returns a view of a conv2d's output).
#[test]
fn roles_say_what_tensors_are() {
    use tch::nn::{self, OptimizerConfig};
    let dir = tempfile::tempdir().unwrap();
    let t = cpu_tracker(dir.path());
    let vs = nn::VarStore::new(Device::Cpu);
    let conv = nn::conv1d(vs.root() / "conv", 2, 4, 3, Default::default());
    let fc = nn::linear(vs.root() / "fc", 4 * 3, 5, Default::default()); // unnamed: not watched
    let mut opt = nn::Adam::default().build(&vs, 1e-3).unwrap();
    track!(t).unwrap();
    let x = Tensor::ones([8, 2, 14], (Kind::Float, Device::Cpu));
    let y = x.apply(&conv);
    let (pooled, indices) = y.max_pool1d_with_indices([4], [4], [0], [1], false);
    let pooled2 = y.max_pool1d([4], [4], [0], [1], false);
    track!(t).unwrap();
    let lines = last_group_lines(&t);
    let float = |shape, mib| line('+', 1, shape, mib, TENSOR, "torch.float32");
    // conv1d returns a view of a conv2d's output, which is the program's then: no role.
    assert!(
        lines.contains(&(float("(8, 4, 12)", "0.0015") + " | (+2 views)")),
        "conv1d's result: {lines:#?}"
    );
    // max_pool1d pools a (8, 4, 1, 12) view and returns views: the indices the program asked for
    // are its own, those of the max_pool1d call are internal to it.
    let indices_of = |tail: &str| line('+', 1, "(8, 4, 1, 3)", "0.0007", TENSOR, "torch.int64") + tail;
    assert!(lines.contains(&indices_of(" | (+1 views)")), "{lines:#?}");
    assert!(lines.contains(&indices_of(" | internal to aten::max_pool1d")), "{lines:#?}");
    assert_eq!(pooled.size(), pooled2.size());
    let loss = pooled.flatten(1, -1).apply(&fc).sum(Kind::Float);
    opt.zero_grad();
    loss.backward();
    drop(loss);
    track!(t).unwrap();
    let lines = last_group_lines(&t);
    assert!(
        lines.contains(&(float("(4, 2, 3)", "0.0001") + " | gradient")),
        "a named parameter's: {lines:#?}"
    );
    assert!(lines.contains(&(float("(5, 12)", "0.0002") + " | gradient")), "an unnamed one's: {lines:#?}");
    t.optimizer_step(|| opt.step());
    track!(t).unwrap();
    let lines = last_group_lines(&t);
    assert!(
        lines.contains(&(line('+', 2, "(5, 12)", "0.0005", TENSOR, "torch.float32") + " | optimizer state")),
        "{lines:#?}"
    );
    drop((x, y, pooled, indices, pooled2, opt, fc, conv, vs));
}
