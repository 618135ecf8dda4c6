//! What an estimate is asked for: the input, its precision, inference or training with which
//! optimizer, the device the run is made on, how long values live, and which dimension `fit`
//! varies.
//!
//! Every option a user names (on the command line, from Python) is a [`Choice`]: one parser
//! (`FromStr`, with its aliases) and one canonical name (`Display`), so the two front ends accept
//! the same words.
use std::fmt;

use serde::Serialize;

use gpu_mem_track_log::DType;

/// An option chosen by name: parsed by `FromStr` (canonical names and aliases, any case), shown by
/// `Display` (the canonical name). The command line lists [`Choice::NAMES`] in its `--help`.
pub trait Choice: std::str::FromStr<Err = String> + fmt::Display + Copy + Send + Sync + 'static {
    /// The canonical names, as `--help` lists them.
    const NAMES: &'static [&'static str];
}

/// `Display` of a [`Choice`] as its canonical name.
macro_rules! choice_names {
    ($ty:ty { $($variant:path => $name:literal),+ $(,)? }) => {
        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(match self { $($variant => $name),+ })
            }
        }
        impl $crate::options::Choice for $ty {
            const NAMES: &'static [&'static str] = &[$($name),+];
        }
    };
}
pub(crate) use choice_names;

/// Element type of parameters and float inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// float32
    F32,
    /// float16
    F16,
    /// bfloat16
    Bf16,
}

impl Precision {
    /// The dtype of parameters and float inputs.
    pub fn dtype(self) -> DType {
        DType::from_scalar_type(match self {
            Precision::F32 => 6,
            Precision::F16 => 5,
            Precision::Bf16 => 15,
        })
    }
}

impl std::str::FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" | "fp32" => Ok(Precision::F32),
            "f16" | "float16" | "fp16" | "half" => Ok(Precision::F16),
            "bf16" | "bfloat16" => Ok(Precision::Bf16),
            other => Err(format!("unknown dtype {other:?} (use f32, f16 or bf16)")),
        }
    }
}

impl std::str::FromStr for Lifetimes {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "torchscript" | "ts" => Ok(Lifetimes::TorchScript),
            "eager" => Ok(Lifetimes::Eager),
            other => Err(format!("unknown lifetimes {other:?} (use torchscript or eager)")),
        }
    }
}

/// Optimizer whose state a training step allocates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Optimizer {
    /// Plain SGD: no state.
    Sgd,
    /// SGD with momentum: one buffer per parameter.
    SgdMomentum,
    /// Adam: two buffers per parameter, plus a parameter-sized temporary per step.
    Adam,
    /// AdamW: as Adam.
    AdamW,
}

impl std::str::FromStr for Optimizer {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "sgd" => Ok(Optimizer::Sgd),
            "momentum" | "sgd-momentum" | "sgd_momentum" => Ok(Optimizer::SgdMomentum),
            "adam" => Ok(Optimizer::Adam),
            "adamw" => Ok(Optimizer::AdamW),
            other => Err(format!("unknown optimizer {other:?} (use sgd, momentum, adam or adamw)")),
        }
    }
}

/// Inference (forward without grad) or training steps (forward, backward, optimizer step).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// `torch.no_grad()` forward.
    Inference,
    /// Forward, backward and an optimizer step, twice (the second shows the steady state).
    Train(Optimizer),
}

/// Where the estimate runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EstimateDevice {
    /// The meta device: shapes only.
    Meta,
    /// The CPU: real compute, for models with ops that have no meta kernel, and for checking.
    Cpu,
}

/// What to estimate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EstimateOptions {
    /// Input shape, batch first.
    pub input_shape: Vec<i64>,
    /// Integer token ids (int64) rather than a float input.
    pub input_is_index: bool,
    /// Precision of parameters and float input.
    pub precision: Precision,
    /// Inference or training.
    pub mode: Mode,
    /// Where to run.
    pub device: EstimateDevice,
    /// How long values live: as the TorchScript interpreter frees them, or as eager PyTorch would.
    pub lifetimes: Lifetimes,
}

/// When a run frees the tensors a model computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Lifetimes {
    /// The TorchScript interpreter's: each value is freed right after its last use. What a tch
    /// program running the model as a `CModule` gets.
    #[default]
    TorchScript,
    /// Eager PyTorch's (CPython reference counting), read from the graph's variable names: a local
    /// variable lives until it is rebound or its `forward` returns, and a module call's inputs
    /// until the call returns. What a Python user running the same model eagerly gets; peaks move
    /// by whole activations.
    Eager,
}

impl Default for EstimateOptions {
    fn default() -> Self {
        EstimateOptions {
            input_shape: vec![1, 3, 224, 224],
            input_is_index: false,
            precision: Precision::F32,
            mode: Mode::Inference,
            device: EstimateDevice::Meta,
            lifetimes: Lifetimes::TorchScript,
        }
    }
}

/// The input dimension the search varies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FitDimension {
    /// The first input dimension.
    #[default]
    Batch,
    /// The second input dimension (tokens of a `[batch, seq]` input).
    Seq,
}

impl std::str::FromStr for FitDimension {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "batch" => Ok(FitDimension::Batch),
            "seq" | "sequence" => Ok(FitDimension::Seq),
            other => Err(format!("unknown dimension {other:?} to vary (use batch or seq)")),
        }
    }
}

choice_names!(Precision { Precision::F32 => "f32", Precision::F16 => "f16", Precision::Bf16 => "bf16" });
choice_names!(Lifetimes { Lifetimes::TorchScript => "torchscript", Lifetimes::Eager => "eager" });
choice_names!(Optimizer {
    Optimizer::Sgd => "sgd",
    Optimizer::SgdMomentum => "momentum",
    Optimizer::Adam => "adam",
    Optimizer::AdamW => "adamw",
});
choice_names!(EstimateDevice { EstimateDevice::Meta => "meta", EstimateDevice::Cpu => "cpu" });
choice_names!(FitDimension { FitDimension::Batch => "batch", FitDimension::Seq => "seq" });

impl std::str::FromStr for EstimateDevice {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "meta" => Ok(EstimateDevice::Meta),
            "cpu" => Ok(EstimateDevice::Cpu),
            other => Err(format!("unknown device {other:?} to estimate on (use meta or cpu)")),
        }
    }
}
