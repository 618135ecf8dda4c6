//! A snapshot of the live tensors on one device, grouped the way the log prints them:
//! by (shape, dtype, class), with each storage's bytes counted once.
use std::hash::{Hash, Hasher};

pub use gpu_mem_track_log::group::{DType, GroupKey, GroupTotals, TensorClass};
use rustc_hash::FxHashMap;

use crate::ffi::{self, TensorRecord};

/// The dtype of a tch `Kind`, by its `c10::ScalarType` number (tch keeps its own mapping
/// private).
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
pub struct Snapshot {
    /// Per-group totals (empty when the tracker runs without detail).
    pub groups: FxHashMap<GroupKey, GroupTotals>,
    /// Bytes of all unique storages (each counted once).
    pub tensor_bytes: u64,
    /// Live tensors seen.
    pub tensor_count: usize,
    /// Unique storages seen.
    pub storage_count: usize,
}

/// A group key borrowing its shape from the snapshot buffer, so grouping allocates per group,
/// not per tensor.
#[derive(Clone, Copy, PartialEq, Eq)]
struct BorrowedKey<'a> {
    shape: &'a [i64],
    dtype: DType,
    parameter: bool,
    view: bool,
}

impl Hash for BorrowedKey<'_> {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.shape.hash(h);
        h.write_i32(self.dtype.scalar_type());
        h.write_u8(self.parameter as u8);
        h.write_u8(self.view as u8);
    }
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

impl Snapshot {
    /// Groups raw registry records. With `detail == false` only the totals are computed.
    pub(crate) fn from_records(records: &[TensorRecord], dims: &[i64], detail: bool) -> Snapshot {
        let owners = shared_storage_owners(records);
        let mut snap = Snapshot { tensor_count: records.len(), ..Snapshot::default() };
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
                parameter: r.is_parameter(),
                view: !owned,
            };
            let g = grouped.entry(key).or_default();
            g.count += 1;
            if owned {
                g.bytes += r.storage_nbytes();
            }
        }
        snap.groups.reserve(grouped.len());
        for (k, v) in grouped {
            let class = if k.parameter { TensorClass::Parameter } else { TensorClass::Tensor };
            snap.groups.insert(GroupKey { shape: k.shape.into(), dtype: k.dtype, class, view: k.view }, v);
        }
        snap
    }
}

/// One live tensor, for [`MemTracker::print_all_tensors`](crate::MemTracker::print_all_tensors).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Name given at registration (`watch_varstore`, `watch_module`, `register`), if any.
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
            class: if r.is_parameter() { TensorClass::Parameter } else { TensorClass::Tensor },
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
