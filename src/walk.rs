//! A walk of the live tensors on one device, grouped the way the log prints them:
//! by (shape, dtype, class), with each storage's bytes counted once.
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use parking_lot::Mutex;

pub use gpu_mem_track_log::group::{DType, GroupKey, GroupTotals, TensorClass, TensorRole};
use rustc_hash::FxHashMap;

use crate::ffi::{self, GroupTotal, RegistryGroup, RoleCode, TensorRecord, WalkTotals};

/// The dtype of a tch `Kind`, by its `c10::ScalarType` number (tch keeps its own mapping
/// private).
#[cfg(feature = "tch")]
pub fn dtype_of(kind: tch::Kind) -> DType {
    use tch::Kind as K;
    DType::from_scalar_type(match kind {
        K::Uint8 => 0,
        K::Int8 => 1,
        K::Int16 => 2,
        K::Int => 3,
        K::Int64 => 4,
        K::Half => 5,
        K::Float => 6,
        K::Double => 7,
        K::ComplexHalf => 8,
        K::ComplexFloat => 9,
        K::ComplexDouble => 10,
        K::Bool => 11,
        K::QInt8 => 12,
        K::QUInt8 => 13,
        K::QInt32 => 14,
        K::BFloat16 => 15,
        K::Float8e5m2 => 23,
        K::Float8e4m3fn => 24,
        K::Float8e5m2fnuz => 25,
        K::Float8e4m3fnuz => 26,
    })
}

/// The grouped live tensors on a device at one moment.
#[derive(Debug, Clone, Default)]
pub struct Walk {
    /// Per-group totals (empty when the tracker runs without detail).
    pub groups: FxHashMap<GroupKey, GroupTotals>,
    /// Bytes of all unique storages (each counted once).
    pub tensor_bytes: u64,
    /// Live tensors seen.
    pub tensor_count: usize,
    /// Unique storages seen.
    pub storage_count: usize,
}

/// A group key borrowing its shape from the walk buffer, so grouping allocates per group,
/// not per tensor.
#[derive(Clone, Copy, PartialEq, Eq)]
struct BorrowedKey<'a> {
    shape: &'a [i64],
    dtype: DType,
    class_id: i32,
    view: bool,
    /// The registry's op id, when grouping by op.
    op: Option<u32>,
    /// What the tensors are, and the op id an internal one was made in.
    role: RoleCode,
    role_op: Option<u32>,
}

impl Hash for BorrowedKey<'_> {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.shape.hash(h);
        h.write_i32(self.dtype.scalar_type());
        h.write_i32(self.class_id);
        h.write_u8(self.view as u8);
        if let Some(op) = self.op {
            h.write_u32(op);
        }
        h.write_i32(self.role.0);
    }
}

/// Entry `id` of a table of the registry, looked up once (its tables only grow) and kept in
/// `cache`.
fn cached<T: Clone>(
    cache: &Mutex<Vec<Option<T>>>,
    id: u32,
    look_up: impl FnOnce(u32) -> Option<T>,
) -> Option<T> {
    let mut cache = cache.lock();
    let i = id as usize;
    if cache.len() <= i {
        cache.resize(i + 1, None);
    }
    if cache[i].is_none() {
        cache[i] = look_up(id);
    }
    cache[i].clone()
}

/// Op names by registry op id.
fn op_name(id: u32) -> Option<Arc<str>> {
    static NAMES: Mutex<Vec<Option<Arc<str>>>> = Mutex::new(Vec::new());
    cached(&NAMES, id, |id| ffi::registry_op_name(id).map(Arc::from))
}

/// The registry's log groups by id.
fn registry_group(id: u32) -> Option<Arc<RegistryGroup>> {
    static GROUPS: Mutex<Vec<Option<Arc<RegistryGroup>>>> = Mutex::new(Vec::new());
    cached(&GROUPS, id, |id| ffi::registry_group(id).map(Arc::new))
}

/// Index of the owner of each storage held by several tensors, among `records`. A storage held by
/// one tensor (`storage_shared == 0`, the common case) is owned by it without a lookup.
fn shared_storage_owners(records: &[TensorRecord]) -> FxHashMap<u64, usize> {
    let mut owners: FxHashMap<u64, usize> = FxHashMap::default();
    for (i, r) in records.iter().enumerate() {
        if r.storage_id() == 0 || !r.storage_shared() {
            continue;
        }
        owners
            .entry(r.storage_id())
            .and_modify(|o| {
                let cur = &records[*o];
                if r.nbytes() > cur.nbytes() || (r.nbytes() == cur.nbytes() && r.seq() < cur.seq()) {
                    *o = i;
                }
            })
            .or_insert(i);
    }
    owners
}

/// Whether record `i` is the one its storage's bytes are attributed to.
fn owns_storage(records: &[TensorRecord], owners: &FxHashMap<u64, usize>, i: usize) -> bool {
    let r = &records[i];
    r.storage_id() != 0 && (!r.storage_shared() || owners.get(&r.storage_id()) == Some(&i))
}

impl Walk {
    /// Groups raw registry records, by op too when `by_op`. With `detail == false` only the totals
    /// are computed.
    pub(crate) fn from_records(records: &[TensorRecord], dims: &[i64], detail: bool, by_op: bool) -> Walk {
        let owners = shared_storage_owners(records);
        // Tensors holding each shared storage: its owner's line counts the others as views.
        let mut holders: FxHashMap<u64, u64> = FxHashMap::default();
        if detail {
            for r in records.iter().filter(|r| r.storage_id() != 0 && r.storage_shared()) {
                *holders.entry(r.storage_id()).or_default() += 1;
            }
        }
        let mut snap = Walk { tensor_count: records.len(), ..Walk::default() };
        let mut grouped: FxHashMap<BorrowedKey<'_>, GroupTotals> = FxHashMap::default();
        for (i, r) in records.iter().enumerate() {
            let owned = owns_storage(records, &owners, i);
            if owned {
                snap.tensor_bytes += r.storage_nbytes();
                snap.storage_count += 1;
            }
            if !detail {
                continue;
            }
            let key = BorrowedKey {
                shape: r.shape(dims),
                dtype: r.dtype(),
                class_id: r.class_id(),
                view: !owned,
                op: if by_op { r.op_id() } else { None },
                role: r.role(),
                // The call an internal tensor was made in names its role: only then a key part.
                role_op: if r.role().is_internal() { r.op_id() } else { None },
            };
            let g = grouped.entry(key).or_default();
            g.count += 1;
            if owned {
                g.bytes += r.storage_nbytes();
                g.views += holders.get(&r.storage_id()).map_or(0, |n| n - 1);
            }
        }
        snap.groups.reserve(grouped.len());
        for (k, v) in grouped {
            let class = ffi::registry_class(k.class_id);
            let op = k.op.and_then(op_name);
            let role = k.role.role(k.role_op.and_then(op_name));
            snap.groups
                .insert(GroupKey { shape: k.shape.into(), dtype: k.dtype, class, view: k.view, op, role }, v);
        }
        snap
    }
}

impl Walk {
    /// The registry's grouped totals (what one track takes: no record per tensor), by op too
    /// when `by_op`: the same walk [`from_records`](Self::from_records) makes of the records.
    pub(crate) fn from_groups(groups: &[GroupTotal], totals: WalkTotals, by_op: bool) -> Walk {
        let mut snap = Walk {
            tensor_bytes: totals.tensor_bytes,
            tensor_count: totals.tensor_count,
            storage_count: totals.storage_count,
            ..Walk::default()
        };
        snap.groups.reserve(groups.len());
        for g in groups {
            // The registry names every group it counts; a miss would be a shim bug, not data.
            let Some(def) = registry_group(g.group()) else { continue };
            let key = GroupKey {
                shape: def.shape.clone(),
                dtype: def.dtype,
                class: def.class.clone(),
                view: g.view(),
                // Groups the registry keeps apart by op merge here unless the log names ops.
                op: if by_op { def.op_id.and_then(op_name) } else { None },
                role: def.role.role(def.op_id.and_then(op_name)),
            };
            let totals = snap.groups.entry(key).or_default();
            totals.count += g.count();
            totals.bytes += g.bytes();
            totals.views += g.views();
        }
        snap
    }
}

pub use crate::ffi::with_gil_held;

/// One live tensor, for `MemTracker::print_all_tensors`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Name given at registration (`register_varstore`, `register_module`, `register`), if any.
    pub name: Option<String>,
    /// Sizes.
    pub shape: Vec<i64>,
    /// Element type.
    pub dtype: DType,
    /// Parameter or plain tensor.
    pub class: TensorClass,
    /// `numel * itemsize` of this tensor (a view's own extent).
    pub nbytes: u64,
    /// Bytes of the storage it uses (shared with its views).
    pub storage_nbytes: u64,
    /// Identity of the storage (views share it) while the tensor is alive.
    pub storage_id: u64,
    /// Whether this tensor is the one its storage's bytes are attributed to.
    pub owns_storage: bool,
}

pub(crate) fn tensor_infos(records: &[TensorRecord], dims: &[i64]) -> Vec<TensorInfo> {
    let owners = shared_storage_owners(records);
    let mut out: Vec<TensorInfo> = records
        .iter()
        .enumerate()
        .map(|(i, r)| TensorInfo {
            name: r.name_id().and_then(ffi::registry_name),
            shape: r.shape(dims).to_vec(),
            dtype: r.dtype(),
            class: ffi::registry_class(r.class_id()),
            nbytes: r.nbytes(),
            storage_nbytes: r.storage_nbytes(),
            storage_id: r.storage_id(),
            owns_storage: owns_storage(records, &owners, i),
        })
        .collect();
    out.sort_by(|a, b| {
        b.storage_nbytes
            .cmp(&a.storage_nbytes)
            .then(a.storage_id.cmp(&b.storage_id))
            .then(b.owns_storage.cmp(&a.owns_storage))
            .then(a.name.cmp(&b.name))
    });
    out
}

/// The largest groups of live tensors by what holds memory: (shape, dtype, class, what the
/// tracker knows they are, the op that made them), largest first; the first `n` and the count and
/// bytes of the rest. Records must come from a categorised walk to name categories.
pub(crate) fn largest_holders(
    records: &[TensorRecord],
    dims: &[i64],
    n: usize,
) -> (Vec<gpu_mem_track_log::log::oom::Holder>, (u64, u64)) {
    let owners = shared_storage_owners(records);
    type Key<'a> = (&'a [i64], i32, i32, Option<gpu_mem_track_log::Category>, Option<u32>);
    let mut grouped: FxHashMap<Key<'_>, GroupTotals> = FxHashMap::default();
    for (i, r) in records.iter().enumerate() {
        if !owns_storage(records, &owners, i) {
            continue; // views hold no memory of their own
        }
        let g = grouped
            .entry((r.shape(dims), r.dtype().scalar_type(), r.class_id(), r.category(), r.op_id()))
            .or_default();
        g.count += 1;
        g.bytes += r.storage_nbytes();
    }
    let mut groups: Vec<_> = grouped.into_iter().collect();
    groups.sort_by(|a, b| b.1.bytes.cmp(&a.1.bytes).then(b.1.count.cmp(&a.1.count)).then(a.0.cmp(&b.0)));
    let rest = groups.iter().skip(n).fold((0, 0), |(c, b), g| (c + 1, b + g.1.bytes));
    let holders = groups
        .into_iter()
        .take(n)
        .map(|((shape, dtype, class_id, category, op), totals)| gpu_mem_track_log::log::oom::Holder {
            count: totals.count,
            shape: shape.to_vec(),
            dtype: DType::from_scalar_type(dtype).torch_name(),
            class: ffi::registry_class(class_id),
            bytes: totals.bytes,
            what: category.map(|c| holder_label(c).to_owned()),
            op: op.and_then(op_name).map(|o| o.to_string()),
        })
        .collect();
    (holders, rest)
}

/// How an out-of-memory block names what a group of tensors is.
fn holder_label(c: gpu_mem_track_log::Category) -> &'static str {
    use gpu_mem_track_log::Category as C;
    match c {
        C::Parameter => "parameters",
        C::Buffer => "buffers",
        C::Gradient => "gradients",
        C::Activation => "activations saved for backward",
        C::Input => "input",
        C::OptimizerState => "optimizer state",
        C::Workspace => "library workspaces",
        C::Temporary => "temporaries",
        C::Unknown => "unknown",
        C::ShardedParameter => "parameter shards",
        C::UnshardedParameter => "parameters gathered whole",
        C::ShardedGradient => "gradient shards",
        C::UnshardedGradient => "gradients before their reduce-scatter",
        C::DdpBucket => "DDP buckets",
        C::AllGatherBuffer => "all-gather buffers",
        C::ReduceScatterBuffer => "reduce-scatter buffers",
    }
}

// The tensors come from tch.
#[cfg(all(test, feature = "tch"))]
mod tests {
    use super::*;
    use crate::device::DeviceKind;
    use crate::ffi::RegistryWalk;
    use tch::{Device, Kind, Tensor};

    /// The grouped walk and the records' grouping of the same live tensors, by op or not.
    fn both_ways(raw: &mut RegistryWalk, by_op: bool) -> (Walk, Walk) {
        let (records, dims) = raw.take(DeviceKind::Cpu, -1).unwrap();
        let from_records = Walk::from_records(records, dims, true, by_op);
        let (groups, totals) = raw.take_grouped(DeviceKind::Cpu, -1, true).unwrap();
        (from_records, Walk::from_groups(groups, totals, by_op))
    }

    fn assert_same(raw: &mut RegistryWalk, what: &str) {
        for by_op in [false, true] {
            let (records, grouped) = both_ways(raw, by_op);
            assert_same_walks(&grouped, &records, &format!("{what} (by op: {by_op})"));
        }
    }

    /// As `assert_same`, the grouped walk first: it is then the one that meets the dead entries
    /// (and removes them), and the records' walk after it sees what it left.
    fn assert_same_grouped_first(raw: &mut RegistryWalk, what: &str) {
        let (groups, totals) = raw.take_grouped(DeviceKind::Cpu, -1, true).unwrap();
        let grouped = Walk::from_groups(groups, totals, false);
        let (records, dims) = raw.take(DeviceKind::Cpu, -1).unwrap();
        let records = Walk::from_records(records, dims, true, false);
        assert_same_walks(&grouped, &records, what);
    }

    fn assert_same_walks(grouped: &Walk, records: &Walk, what: &str) {
        assert_eq!(grouped.groups, records.groups, "{what}");
        assert_eq!(
            (grouped.tensor_bytes, grouped.tensor_count, grouped.storage_count),
            (records.tensor_bytes, records.tensor_count, records.storage_count),
            "{what}"
        );
    }

    #[test]
    fn grouped_walks_are_the_records_grouped() {
        ffi::install().unwrap();
        let mut raw = RegistryWalk::new().unwrap();
        let base = Tensor::zeros([6, 4], (Kind::Float, Device::Cpu));
        // Views share the base's storage; the largest, then oldest, tensor owns it.
        let row = base.narrow(0, 0, 1);
        let flat = base.view([-1]);
        let mut other = Tensor::ones([3], (Kind::Int64, Device::Cpu)) + 1;
        let weight = Tensor::zeros([4, 4], (Kind::Half, Device::Cpu)).set_requires_grad(true);
        let derived = weight.to_kind(Kind::Float) * 2;
        assert_same(&mut raw, "views, a parameter and tensors made by different ops");
        // A tensor's group changes after it entered the registry: resized, made a parameter.
        let _ = other.resize_([5]);
        let _ = derived.set_requires_grad(true); // a leaf? no: it has a grad_fn, stays a tensor
        let becomes_parameter = Tensor::zeros([3, 3], (Kind::Float, Device::Cpu));
        let mut grows = Tensor::zeros([2, 2], (Kind::Float, Device::Cpu));
        assert_same(&mut raw, "before resize_");
        let _ = becomes_parameter.set_requires_grad(true);
        let _ = grows.resize_([8, 2]);
        assert_same(&mut raw, "after resize_");
        let (_, grouped) = both_ways(&mut raw, false);
        assert!(grouped.groups.keys().any(|k| *k.shape == [8, 2]), "{:?}", grouped.groups.keys());
        let views: Vec<_> = grouped.groups.iter().filter(|(k, _)| k.view).collect();
        assert!(views.len() >= 2 && views.iter().all(|(_, v)| v.bytes == 0), "{views:?}");
        drop((row, flat, base));
        assert_same(&mut raw, "after the base and its views are gone");
    }

    /// The grouped walk reads most tensors without pinning them and keeps their storages between
    /// walks: it must see storages, shapes and dtypes swapped behind the registry's back, and
    /// survive tensors dying on other threads while it walks.
    #[test]
    fn grouped_walks_follow_swapped_storages_and_concurrent_drops() {
        use std::sync::atomic::{AtomicBool, Ordering};
        ffi::install().unwrap();
        let mut raw = RegistryWalk::new().unwrap();
        let mut swapped = Tensor::zeros([4], (Kind::Float, Device::Cpu));
        let shared = Tensor::zeros([2, 8], (Kind::Float, Device::Cpu));
        let view = shared.view([-1]);
        let mut alias = Tensor::zeros([16], (Kind::Float, Device::Cpu));
        assert_same(&mut raw, "before set_data");
        // set_data returns nothing: the registry sees the new storage, shape and dtype on a walk.
        swapped.set_data(&Tensor::zeros([3, 3], (Kind::Int64, Device::Cpu)));
        alias.set_data(&view); // now shares the storage of `shared`
        assert_same(&mut raw, "after set_data");
        drop((view, shared));
        assert_same(&mut raw, "after the other holders of a storage are gone");
        let stop = AtomicBool::new(false);
        std::thread::scope(|scope| {
            for _ in 0..2 {
                scope.spawn(|| {
                    while !stop.load(Ordering::Relaxed) {
                        let a = Tensor::zeros([8, 8], (Kind::Float, Device::Cpu));
                        let v = a.view([-1]);
                        let p = Tensor::zeros([4], (Kind::Float, Device::Cpu)).set_requires_grad(true);
                        let d = &p * 2;
                        drop((a, v, p, d));
                    }
                });
            }
            for _ in 0..300 {
                raw.take_grouped(DeviceKind::Cpu, -1, true).unwrap();
            }
            stop.store(true, Ordering::Relaxed);
        });
        assert_same(&mut raw, "after tensors died on other threads during walks");
        drop((swapped, alias));
    }

    /// A registry of thousands of entries is walked by several threads at once, each taking
    /// chunks of entries: views whose bases sit in other chunks, parameters (pinned by a helper),
    /// dead entries among the live and groups that changed must add up as one thread would.
    #[test]
    fn grouped_walks_split_across_threads_match_the_records() {
        use std::sync::atomic::{AtomicBool, Ordering};
        ffi::install().unwrap();
        ffi::set_walk_threads(3);
        let mut raw = RegistryWalk::new().unwrap();
        let n = 12_000;
        let bases: Vec<Tensor> =
            (0..n).map(|i| Tensor::zeros([(i % 7) as i64 + 1, 3], (Kind::Float, Device::Cpu))).collect();
        let params: Vec<Tensor> = (0..n / 4)
            .map(|i| Tensor::zeros([(i % 5) as i64 + 2], (Kind::Float, Device::Cpu)).set_requires_grad(true))
            .collect();
        let derived: Vec<Tensor> = params.iter().step_by(3).map(|p| p * 2).collect();
        // Registered after every base, so a view and its base are in different chunks.
        let mut views: Vec<Tensor> = bases.iter().step_by(5).map(|b| b.view([-1])).collect();
        let mut live = bases;
        live.extend(params);
        live.extend(derived);
        assert_same(&mut raw, "views, parameters and derived tensors");
        assert_eq!(ffi::walk_threads(), 3);
        // Dead entries among the live, and group changes, throughout the registry.
        let mut k = 0;
        live.retain(|_| {
            k += 1;
            k % 7 != 0
        });
        for (i, t) in live.iter_mut().enumerate().filter(|(i, t)| i % 97 == 0 && !t.requires_grad()) {
            let _ = t.resize_([i as i64 % 4 + 9]);
        }
        // New storages behind the registry's back (the walk replaces the storage it kept).
        for t in live.iter_mut().skip(5).step_by(89).filter(|t| !t.requires_grad()) {
            t.set_data(&Tensor::zeros([2, 5], (Kind::Int64, Device::Cpu)));
        }
        views.truncate(views.len() / 2); // the last entries registered
        assert_same_grouped_first(&mut raw, "after deaths, resizes and new storages");
        assert_same(&mut raw, "steady");
        // Tensors dying on other threads while the walks run.
        let stop = AtomicBool::new(false);
        let mut churn: Vec<Tensor> = live.split_off(live.len() / 2);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    let a: Vec<Tensor> =
                        (0..64).map(|_| Tensor::zeros([8], (Kind::Float, Device::Cpu))).collect();
                    let p = Tensor::zeros([4], (Kind::Float, Device::Cpu)).set_requires_grad(true);
                    let d = &p * 2;
                    drop((a, p, d));
                }
            });
            let dropper = scope.spawn(move || {
                while let Some(t) = churn.pop() {
                    drop(t);
                }
            });
            for _ in 0..50 {
                raw.take_grouped(DeviceKind::Cpu, -1, true).unwrap();
            }
            dropper.join().unwrap();
            stop.store(true, Ordering::Relaxed);
        });
        assert_same(&mut raw, "after tensors died on other threads during walks");
        drop(live.split_off(live.len() / 3));
        assert_same_grouped_first(&mut raw, "after the last third died");
        ffi::set_walk_threads(1);
        assert_same(&mut raw, "walked alone");
        drop((live, views));
    }
}
