//! What a `+`/`-` line is about: a group of tensors with one shape, dtype and class.
use std::fmt;

/// A tensor's element type, by libtorch's `c10::ScalarType` number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DType(i32);

/// `c10::ScalarType` names by number (`torch/headeronly/core/ScalarType.h`, libtorch 2.13). The
/// main crate checks this table against libtorch's own `toString` in a test.
const C10_NAMES: [&str; 46] = [
    "Byte",
    "Char",
    "Short",
    "Int",
    "Long",
    "Half",
    "Float",
    "Double",
    "ComplexHalf",
    "ComplexFloat",
    "ComplexDouble",
    "Bool",
    "QInt8",
    "QUInt8",
    "QInt32",
    "BFloat16",
    "QUInt4x2",
    "QUInt2x4",
    "Bits1x8",
    "Bits2x4",
    "Bits4x2",
    "Bits8",
    "Bits16",
    "Float8_e5m2",
    "Float8_e4m3fn",
    "Float8_e5m2fnuz",
    "Float8_e4m3fnuz",
    "UInt16",
    "UInt32",
    "UInt64",
    "UInt1",
    "UInt2",
    "UInt3",
    "UInt4",
    "UInt5",
    "UInt6",
    "UInt7",
    "Int1",
    "Int2",
    "Int3",
    "Int4",
    "Int5",
    "Int6",
    "Int7",
    "Float8_e8m0fnu",
    "Float4_e2m1fn_x2",
];

impl DType {
    /// `torch.float32`.
    pub const FLOAT32: DType = DType(6);
    /// `torch.float16`.
    pub const FLOAT16: DType = DType(5);
    /// `torch.bfloat16`.
    pub const BFLOAT16: DType = DType(15);
    /// `torch.int64` (token ids, indices).
    pub const INT64: DType = DType(4);

    /// The dtype with `c10::ScalarType` number `scalar_type`.
    pub const fn from_scalar_type(scalar_type: i32) -> Self {
        DType(scalar_type)
    }

    /// The `c10::ScalarType` number.
    pub fn scalar_type(self) -> i32 {
        self.0
    }

    /// libtorch's name (`Float`, `Long`, ...); `Undefined` for a number it does not have.
    pub fn c10_name(self) -> &'static str {
        usize::try_from(self.0).ok().and_then(|i| C10_NAMES.get(i)).copied().unwrap_or("Undefined")
    }

    /// The name Python prints: `torch.float32`, `torch.int64`, `torch.bfloat16`, ...
    pub fn torch_name(self) -> String {
        format!("torch.{}", python_dtype(self.c10_name()))
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

    /// Whether the class is a compiler's tracing tensor (dynamo's and inductor's fake tensors,
    /// AOTAutograd's functional wrappers): alive while a compiled graph is kept, no memory of the
    /// program's.
    pub fn is_compiler_tracing(&self) -> bool {
        matches!(
            self.python_name(),
            "torch._subclasses.fake_tensor.FakeTensor"
                | "torch._subclasses.functional_tensor.FunctionalTensor"
        )
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
    /// Views of storage another tensor owns (their line says `Memory: 0.0 M`), kept apart from
    /// the tensors that own their storage: when gradients replace transposed-weight views of the
    /// same shape, the log shows one group going and one coming, not a line with a count of 0.
    pub view: bool,
    /// The op that made the tensors, when the tracker groups by op (`op_names(true)`).
    pub op: Option<std::sync::Arc<str>>,
    /// What the tensors are, when the tracker knows it from the program's structure.
    pub role: Option<TensorRole>,
}

/// What a group's tensors are, as the tracker knows it from the program's structure (the same
/// with or without a memory history): a field of its own on the log line, after the five of
/// Pytorch-Memory-Utils (`| gradient`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TensorRole {
    /// The gradient of a parameter the tracker knows by name (`register_varstore`, `register`).
    Gradient,
    /// Made by an optimizer step (`MemTracker::optimizer_step`) and kept: Adam's moments.
    OptimizerState,
    /// Made by an op inside the program's call `op`, which did not return it: max-pool's indices,
    /// a dropout mask, what autograd saves for backward.
    Internal {
        /// The program's call (`aten::max_pool2d`).
        op: std::sync::Arc<str>,
    },
    /// Allocated by a `torch.compile`'d graph's code (inductor's), past the dispatcher: its
    /// outputs and what its forward saves for the backward, while they live.
    InductorBuffer,
}

impl TensorRole {
    /// The field as the log prints it.
    pub fn label(&self) -> String {
        match self {
            TensorRole::Gradient => "gradient".into(),
            TensorRole::OptimizerState => "optimizer state".into(),
            TensorRole::Internal { op } => format!("internal to {op}"),
            TensorRole::InductorBuffer => "inductor buffer".into(),
        }
    }

    /// The role a log field names, if it names one.
    pub fn from_label(field: &str) -> Option<TensorRole> {
        match field {
            "gradient" => Some(TensorRole::Gradient),
            "optimizer state" => Some(TensorRole::OptimizerState),
            "inductor buffer" => Some(TensorRole::InductorBuffer),
            _ => field
                .strip_prefix("internal to ")
                .filter(|op| !op.is_empty())
                .map(|op| TensorRole::Internal { op: op.into() }),
        }
    }
}

/// Count and bytes of one group. Bytes are the storages this group owns: a storage shared by
/// several tensors (views) is owned by its largest, then oldest, tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GroupTotals {
    /// Live tensors in the group.
    pub count: u64,
    /// Storage bytes attributed to the group.
    pub bytes: u64,
    /// Other tensors holding the storages the group owns (views of them), for a group that owns.
    pub views: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_names_are_pythons() {
        assert_eq!(DType::FLOAT32.torch_name(), "torch.float32");
        assert_eq!(DType::from_scalar_type(4).torch_name(), "torch.int64");
        assert_eq!(DType::from_scalar_type(15).torch_name(), "torch.bfloat16");
        assert_eq!(DType::from_scalar_type(24).torch_name(), "torch.float8_e4m3fn");
        assert_eq!(DType::from_scalar_type(-1).c10_name(), "Undefined");
        assert_eq!(DType::from_scalar_type(1000).c10_name(), "Undefined");
    }

    #[test]
    fn only_the_compilers_fake_and_functional_tensors_are_its_tracing() {
        let fake = TensorClass::from_python_name("torch._subclasses.fake_tensor.FakeTensor");
        let functional =
            TensorClass::from_python_name("torch._subclasses.functional_tensor.FunctionalTensor");
        assert!(fake.is_compiler_tracing() && functional.is_compiler_tracing());
        let others = [
            "torch.Tensor",
            "torch.nn.parameter.Parameter",
            "torch.distributed.tensor.DTensor",
            "FakeTensor",
        ];
        assert!(others.iter().all(|c| !TensorClass::from_python_name(c).is_compiler_tracing()));
    }
}
