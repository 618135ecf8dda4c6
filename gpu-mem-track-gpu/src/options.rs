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
    /// What each name means, one line each (`--help`).
    const HELP: &'static [&'static str];
    /// The other names each value is accepted under (shell completions).
    const ALIASES: &'static [&'static [&'static str]];
}

/// A [`Choice`] from one table, a line per value: its names (the first canonical), then what it
/// means. From it come `Display` and `Serialize` (the first name), `FromStr` (any of its names, in any case, `-`
/// and `_` ignored: `amp_bf16`, `SGD-Momentum`) and [`Choice`]'s lists; `$what` names the option
/// in the error, which lists the first names.
macro_rules! choice {
    ($ty:ty, $what:literal { $($variant:path => $name:literal $(| $alias:literal)* ; $help:literal),+ $(,)? }) => {
        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(match self { $($variant => $name),+ })
            }
        }
        impl std::str::FromStr for $ty {
            type Err = String;
            fn from_str(s: &str) -> std::result::Result<Self, String> {
                let key = $crate::options::choice_key(s);
                $(
                    if key == $crate::options::choice_key($name)
                        $(|| key == $crate::options::choice_key($alias))*
                    {
                        return Ok($variant);
                    }
                )+
                Err($crate::options::unknown_choice($what, s, <$ty as $crate::options::Choice>::NAMES))
            }
        }
        // JSON spells a value as the text does: its canonical name.
        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl $crate::options::Choice for $ty {
            const NAMES: &'static [&'static str] = &[$($name),+];
            const HELP: &'static [&'static str] = &[$($help),+];
            const ALIASES: &'static [&'static [&'static str]] = &[$(&[$($alias),*]),+];
        }
    };
}
pub(crate) use choice;

/// What a name is compared by: lowercase, without `-` and `_`.
pub(crate) fn choice_key(s: &str) -> String {
    s.chars().filter(|c| !matches!(c, '-' | '_')).map(|c| c.to_ascii_lowercase()).collect()
}

/// `unknown optimizer "lion" (use sgd, momentum, adam or adamw)`.
pub(crate) fn unknown_choice(what: &str, s: &str, names: &[&str]) -> String {
    let list = match names {
        [init @ .., last] if !init.is_empty() => format!("{} or {last}", init.join(", ")),
        _ => names.join(""),
    };
    format!("unknown {what} {s:?} (use {list})")
}

/// Element type of parameters and float inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
        match self {
            Precision::F32 => DType::FLOAT32,
            Precision::F16 => DType::FLOAT16,
            Precision::Bf16 => DType::BFLOAT16,
        }
    }
}

/// Optimizer whose state a training step allocates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

impl Optimizer {
    /// The `torch.optim` class a Python step builds for this optimizer, and the arguments it
    /// gives besides the parameters (torch's foreach implementations are asked for too, as a GPU
    /// runs them): what Python's `estimate(model, optimizer=...)` steps with, and how its
    /// `Estimator` names the optimizer a program made.
    pub fn torch_optimizer(self) -> (&'static str, &'static [(&'static str, f64)]) {
        match self {
            Optimizer::Sgd => ("SGD", &[("lr", 1e-3)]),
            Optimizer::SgdMomentum => ("SGD", &[("lr", 1e-3), ("momentum", 0.9)]),
            Optimizer::Adam => ("Adam", &[]),
            Optimizer::AdamW => ("AdamW", &[]),
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FitDimension {
    /// The first input dimension.
    #[default]
    Batch,
    /// The second input dimension (tokens of a `[batch, seq]` input).
    Seq,
}

choice!(Precision, "dtype" {
    Precision::F32 => "f32" | "float32" | "fp32"; "float32",
    Precision::F16 => "f16" | "float16" | "fp16" | "half"; "float16",
    Precision::Bf16 => "bf16" | "bfloat16"; "bfloat16",
});
choice!(Lifetimes, "lifetimes" {
    Lifetimes::TorchScript => "torchscript" | "ts"; "The TorchScript interpreter's: each value freed right after its last use",
    Lifetimes::Eager => "eager"; "Eager PyTorch's: a local lives until rebound or its forward returns",
});
choice!(Optimizer, "optimizer" {
    Optimizer::Sgd => "sgd"; "Plain SGD: no state",
    Optimizer::SgdMomentum => "momentum" | "sgd-momentum"; "SGD with momentum: one buffer per parameter",
    Optimizer::Adam => "adam"; "Adam: two buffers per parameter, plus a parameter-sized temporary per step",
    Optimizer::AdamW => "adamw"; "AdamW: as Adam",
});
choice!(EstimateDevice, "device to estimate on" {
    EstimateDevice::Meta => "meta"; "Shapes only, fast",
    EstimateDevice::Cpu => "cpu"; "Real compute, to check an estimate",
});
choice!(FitDimension, "dimension to vary" {
    FitDimension::Batch => "batch"; "The first input dimension",
    FitDimension::Seq => "seq" | "sequence"; "The second input dimension (tokens of a [batch, seq] input)",
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_choice_parses_its_names_and_aliases_in_any_spelling_and_shows_its_first_name() {
        for (text, want) in [
            ("momentum", Optimizer::SgdMomentum),
            ("SGD_Momentum", Optimizer::SgdMomentum),
            ("AdamW", Optimizer::AdamW),
        ] {
            assert_eq!(text.parse::<Optimizer>(), Ok(want), "{text}");
        }
        assert_eq!("half".parse::<Precision>(), Ok(Precision::F16));
        assert_eq!("sequence".parse::<FitDimension>(), Ok(FitDimension::Seq));
        assert_eq!(Optimizer::SgdMomentum.to_string(), "momentum");
        assert_eq!(Optimizer::NAMES, ["sgd", "momentum", "adam", "adamw"]);
        for name in Optimizer::NAMES {
            assert_eq!(name.parse::<Optimizer>().map(|o| o.to_string()).as_deref(), Ok(*name));
        }
        assert_eq!(
            "lion".parse::<Optimizer>(),
            Err("unknown optimizer \"lion\" (use sgd, momentum, adam or adamw)".into())
        );
        assert_eq!(
            "".parse::<EstimateDevice>(),
            Err("unknown device to estimate on \"\" (use meta or cpu)".into())
        );
    }
}
