//! A track of a program holding thousands of tensors (a registry walk split across threads, from
//! 4 096 entries) logs exactly what the program made and dropped: on the CPU here, and on CUDA
//! where there is a GPU (the GPU bundle runs it there).
use std::collections::HashMap;

use gpu_mem_track::{DType, GroupChange, MemTracker, Sign, TensorClass, TrackedDevice};
use tch::{Device, Kind, Tensor};

/// A group as the test counts it: shape, parameter, view.
type Key = (Vec<i64>, bool, bool);
/// Count and attributed bytes.
type Totals = HashMap<Key, (u64, u64)>;

fn add(totals: &mut Totals, shape: &[i64], parameter: bool, view: bool, bytes: u64) {
    let t = totals.entry((shape.to_vec(), parameter, view)).or_default();
    t.0 += 1;
    t.1 += bytes;
}

/// The changes of one sign, as the test counts groups (every tensor here is float32).
fn changes(all: &[GroupChange], sign: Sign) -> Totals {
    let mut out = Totals::new();
    for c in all.iter().filter(|c| c.sign == sign) {
        assert_eq!(c.key.dtype, DType::FLOAT32, "{c:?}");
        let parameter = match &c.key.class {
            TensorClass::Parameter => true,
            TensorClass::Tensor => false,
            other => panic!("unexpected class {other:?}"),
        };
        let t = out.entry((c.key.shape.to_vec(), parameter, c.key.view)).or_default();
        t.0 += c.count;
        t.1 += c.bytes;
    }
    out
}

fn float_bytes(shape: &[i64]) -> u64 {
    4 * shape.iter().product::<i64>() as u64
}

fn tracks_thousands_of_tensors(tracked: TrackedDevice, device: Device) {
    let dir = tempfile::tempdir().unwrap();
    // Views on lines of their own, so that the test can count them; and a tracker with the
    // default, where they are counted on their owners' lines.
    let tracker =
        MemTracker::builder().device(tracked).log_dir(dir.path()).detail_views(true).build().unwrap();
    let folded = MemTracker::builder().device(tracked).log_dir(dir.path()).prefix("folded").build().unwrap();
    tracker.track().unwrap();
    folded.track().unwrap();
    let without_views =
        |t: &Totals| -> Totals { t.iter().filter(|(k, _)| !k.2).map(|(k, v)| (k.clone(), *v)).collect() };
    let views_of = |all: &[GroupChange]| -> i64 { all.iter().map(|c| c.views).sum() };
    let mut made = Totals::new();
    // Tensors of 16 shapes, a view of every fourth (the base, older, owns the storage), and
    // parameters with tensors derived from them: 12 667 registry entries.
    let bases: Vec<Tensor> = (0..8_000)
        .map(|i| {
            let shape = [i % 16 + 1, 4];
            add(&mut made, &shape, false, false, float_bytes(&shape));
            Tensor::zeros(shape, (Kind::Float, device))
        })
        .collect();
    let mut views: Vec<Tensor> = bases
        .iter()
        .step_by(4)
        .map(|b| {
            let v = b.view([-1]);
            add(&mut made, &v.size(), false, true, 0);
            v
        })
        .collect();
    let params: Vec<Tensor> = (0..2_000)
        .map(|i| {
            let shape = [i % 5 + 2];
            add(&mut made, &shape, true, false, float_bytes(&shape));
            Tensor::zeros(shape, (Kind::Float, device)).set_requires_grad(true)
        })
        .collect();
    let derived: Vec<Tensor> = params
        .iter()
        .step_by(3)
        .map(|p| {
            let d = p * 2;
            add(&mut made, &d.size(), false, false, float_bytes(&d.size()));
            d
        })
        .collect();
    let point = tracker.track().unwrap();
    assert_eq!(changes(&point.changes, Sign::Plus), made);
    assert!(changes(&point.changes, Sign::Minus).is_empty(), "{:?}", point.changes);
    assert_eq!(point.tensor_count, 8_000 + 2_000 + 2_000 + 667);
    let point = folded.track().unwrap();
    assert_eq!(changes(&point.changes, Sign::Plus), without_views(&made));
    assert_eq!(views_of(&point.changes), 2_000, "every view on its base's line");

    // Deaths throughout the registry: every third base without a view, and the later half of the
    // views (the last entries registered).
    let mut dropped = Totals::new();
    let mut kept = Vec::new();
    for (i, b) in bases.into_iter().enumerate() {
        if i % 4 != 0 && i % 3 == 0 {
            add(&mut dropped, &b.size(), false, false, float_bytes(&b.size()));
        } else {
            kept.push(b);
        }
    }
    for v in views.split_off(views.len() / 2) {
        add(&mut dropped, &v.size(), false, true, 0);
    }
    let point = tracker.track().unwrap();
    assert_eq!(changes(&point.changes, Sign::Minus), dropped);
    assert!(changes(&point.changes, Sign::Plus).is_empty(), "{:?}", point.changes);
    // Folded: the views that went alone print nothing; the bases that went had none.
    let point = folded.track().unwrap();
    assert_eq!(changes(&point.changes, Sign::Minus), without_views(&dropped));
    assert_eq!(views_of(&point.changes), 0);
    // A steady program: nothing to log.
    assert!(tracker.track().unwrap().changes.is_empty());
    drop((kept, views, params, derived));
}

#[test]
fn a_track_of_thousands_of_cpu_tensors_logs_what_was_made_and_dropped() {
    tracks_thousands_of_tensors(TrackedDevice::Cpu, Device::Cpu);
}

#[cfg_attr(not(gmt_gpu), ignore = "needs a CUDA GPU (run it with the GPU bundle where one is lent)")]
#[test]
fn a_track_of_thousands_of_cuda_tensors_logs_what_was_made_and_dropped() {
    tracks_thousands_of_tensors(TrackedDevice::Cuda(0), Device::Cuda(0));
}
