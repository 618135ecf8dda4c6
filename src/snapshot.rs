//! A snapshot of the live tensors on one device, grouped the way the log prints them:
//! by (shape, dtype, class), with each storage's bytes counted once.
use std::fmt;
use std::hash::{Hash, Hasher};

use rustc_hash::FxHashMap;

use crate::ffi::{self, TensorRecord};

/// A tensor's element type, by libtorch's `c10::ScalarType` number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DType(pub(crate) i32);

impl DType {
    /// The `c10::ScalarType` number.
    pub fn scalar_type(self) -> i32 {
        self.0
    }
}

impl DType {
    /// The name Python prints: `torch.float32`, `torch.int64`, `torch.bfloat16`, ...
    pub fn torch_name(self) -> String {
        format!("torch.{}", python_dtype(ffi::scalar_type_name(self.0)))
    }
}

impl From<tch::Kind> for DType {
    fn from(kind: tch::Kind) -> Self {
        use tch::Kind as K;
        // c10::ScalarType numbering (tch keeps its own mapping private).
        DType(match kind {
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
}

/// Python's dtype name for a c10 scalar type name (`Float` -> `float32`).
fn python_dtype(c10_name: &str) -> String {
    let fixed = match c10_name {
        "Byte" => "uint8",
        "Char" => "int8",
        "Short" => "int16",
        "Int" => "int32",
        "Long" => "int64",
        "Half" => "float16",
        "Float" => "float32",
        "Double" => "float64",
        "ComplexHalf" => "complex32",
        "ComplexFloat" => "complex64",
        "ComplexDouble" => "complex128",
        // Bool, BFloat16, QInt8, UInt16, Float8_e4m3fn, ...: Python's name is the lower-cased one.
        other => return other.to_ascii_lowercase(),
    };
    fixed.to_owned()
}

/// The class column of the log: Python prints a parameter's class differently.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TensorClass {
    /// A leaf tensor that requires grad: `<class 'torch.nn.parameter.Parameter'>`.
    Parameter,
    /// Any other tensor: `<class 'torch.Tensor'>`.
    Tensor,
    /// Another class, as read from a log written by another tool (the text between the quotes).
    Other(String),
}

impl TensorClass {
    /// The dotted Python class name.
    pub fn python_name(&self) -> &str {
        match self {
            TensorClass::Parameter => "torch.nn.parameter.Parameter",
            TensorClass::Tensor => "torch.Tensor",
            TensorClass::Other(s) => s,
        }
    }

    /// Parses a dotted Python class name.
    pub fn from_python_name(name: &str) -> Self {
        match name {
            "torch.nn.parameter.Parameter" => TensorClass::Parameter,
            "torch.Tensor" => TensorClass::Tensor,
            other => TensorClass::Other(other.to_owned()),
        }
    }
}

impl fmt::Display for TensorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<class '{}'>", self.python_name())
    }
}

/// What identifies a group of tensors in the log.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupKey {
    /// Sizes, outermost first.
    pub shape: Box<[i64]>,
    /// Element type.
    pub dtype: DType,
    /// Parameter or plain tensor.
    pub class: TensorClass,
}

/// Count and bytes of one group. Bytes are the storages this group owns: a storage shared by
/// several tensors (views) is owned by its largest, then oldest, tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GroupTotals {
    /// Live tensors in the group.
    pub count: u64,
    /// Storage bytes attributed to the group.
    pub bytes: u64,
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
    scalar_type: i32,
    parameter: bool,
}

impl Hash for BorrowedKey<'_> {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.shape.hash(h);
        h.write_i32(self.scalar_type);
        h.write_u8(self.parameter as u8);
    }
}

/// Index of the owner of each storage held by several tensors, among `records`. A storage held by
/// one tensor (`storage_shared == 0`, the common case) is owned by it without a lookup.
fn shared_storage_owners(records: &[TensorRecord]) -> FxHashMap<u64, usize> {
    let mut owners: FxHashMap<u64, usize> = FxHashMap::default();
    for (i, r) in records.iter().enumerate() {
        if r.storage_id == 0 || r.storage_shared == 0 {
            continue;
        }
        owners
            .entry(r.storage_id)
            .and_modify(|o| {
                let cur = &records[*o];
                if r.nbytes > cur.nbytes || (r.nbytes == cur.nbytes && r.seq < cur.seq) {
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
    r.storage_id != 0 && (r.storage_shared == 0 || owners.get(&r.storage_id) == Some(&i))
}

pub(crate) fn is_parameter(r: &TensorRecord) -> bool {
    r.is_leaf != 0 && r.requires_grad != 0
}

pub(crate) fn shape_of<'a>(r: &TensorRecord, dims: &'a [i64]) -> &'a [i64] {
    let start = r.dims_offset as usize;
    &dims[start..start + r.ndim as usize]
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
                snap.tensor_bytes += r.storage_nbytes.max(0) as u64;
                snap.storage_count += 1;
            }
            if !detail {
                continue;
            }
            let key = BorrowedKey {
                shape: shape_of(r, dims),
                scalar_type: r.scalar_type,
                parameter: is_parameter(r),
            };
            let g = grouped.entry(key).or_default();
            g.count += 1;
            if owned {
                g.bytes += r.storage_nbytes.max(0) as u64;
            }
        }
        snap.groups.reserve(grouped.len());
        for (k, v) in grouped {
            let class = if k.parameter { TensorClass::Parameter } else { TensorClass::Tensor };
            snap.groups.insert(GroupKey { shape: k.shape.into(), dtype: DType(k.scalar_type), class }, v);
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
            name: if r.name_id >= 0 { ffi::registry_name(r.name_id) } else { None },
            shape: shape_of(r, dims).to_vec(),
            dtype: DType(r.scalar_type),
            class: if is_parameter(r) { TensorClass::Parameter } else { TensorClass::Tensor },
            nbytes: r.nbytes.max(0) as u64,
            storage_nbytes: r.storage_nbytes.max(0) as u64,
            storage_id: r.storage_id,
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
