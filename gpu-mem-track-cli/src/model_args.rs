//! The command line of the subcommands that run a model (`estimate`, `fit`, `timeline MODEL`):
//! their clap definitions, needing no libtorch. The `gpu-mem-track-estimate` binary (feature
//! `estimate`) parses them and runs the model; the lean `gpu-mem-track` prints their `--help` from
//! these same definitions, and hands the arguments to that binary.
//!
//! Every named option (optimizer, precision, sharding, ...) is parsed by its type's own `FromStr`
//! ([`gpu_mem_track_gpu::Choice`]), the parser Python's API uses too.
use std::ffi::OsStr;
use std::marker::PhantomData;
use std::path::PathBuf;

use clap::builder::{PossibleValue, TypedValueParser};
use clap::error::ErrorKind;
use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use gpu_mem_track_gpu::options::{EstimateDevice, FitDimension, Lifetimes, Optimizer};
use gpu_mem_track_gpu::profile;
use gpu_mem_track_gpu::sharding::{Parallelism, Shard, TrainingPrecision};
use gpu_mem_track_gpu::Choice;
use gpu_mem_track_log::units::parse_memory_size;

/// The command line of the binary that runs models (`gpu-mem-track-estimate`), named as the
/// `gpu-mem-track` subcommands it serves.
#[derive(Parser)]
#[command(
    name = "gpu-mem-track",
    bin_name = "gpu-mem-track",
    version,
    about = "Where does the GPU memory of a PyTorch training run go, and will it fit? (the commands that run models)"
)]
pub struct ModelCli {
    /// `-q` / `-v`.
    #[command(flatten)]
    pub verbosity: crate::VerbosityArgs,
    /// What to run.
    #[command(subcommand)]
    pub command: ModelCommand,
}

/// The subcommands that run a model.
#[derive(Subcommand)]
pub enum ModelCommand {
    /// Estimate the memory of a model file without a GPU (runs it on the meta device).
    Estimate(EstimateArgs),
    /// The largest batch (or sequence length, `--vary seq`) of a model file that fits a GPU,
    /// for inference or a training step: a search over meta runs, each judged on the high end of
    /// its GPU prediction (nvidia-smi with the largest plausible cuDNN workspaces).
    Fit(FitArgs),
    /// Memory over an estimated run by category (parameters, gradients, optimizer state, input,
    /// activations, temporaries): a stacked-area `.svg`/`.png`, or `.json`. Given a snapshot
    /// `.pickle` (`MemTracker::dump_snapshot`, `estimate --snapshot`, or PyTorch's own) instead
    /// of a model, draws its recorded allocations.
    #[command(mut_arg("input", |a| a.required(false).help(
        "Input shape, batch first: `16x3x224x224` (required for a model, not for a snapshot `.pickle`)"
    )))]
    Timeline(TimelineArgs),
}

/// Prints the help of one of these subcommands (`estimate`, `fit`, `timeline`) on stdout, as its
/// own parser does: the long form for `--help`, the summary for `-h`. False when `subcommand` is
/// none of them.
pub fn print_help(subcommand: &str, long: bool) -> bool {
    let mut cli = ModelCli::command();
    cli.build();
    match cli.find_subcommand_mut(subcommand) {
        Some(command) if long => command.print_long_help().is_ok(),
        Some(command) => command.print_help().is_ok(),
        None => false,
    }
}

/// Inference (no grad) or training steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModeArg {
    /// A no-grad forward.
    Inference,
    /// Forward, backward, optimizer step; twice.
    Train,
}

/// How the estimate is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Method {
    /// Run the model on the meta device.
    Meta,
    /// Analyse the TorchScript graph (inference only).
    Static,
    /// Run both and compare.
    Both,
}

/// The value parser of a [`Choice`]: its own `FromStr` (aliases included), its canonical names
/// listed in `--help` and completions.
#[derive(Clone, Copy)]
pub struct ChoiceParser<T>(PhantomData<T>);

/// [`ChoiceParser`] of `T`, for `#[arg(value_parser = choice::<T>())]`.
pub fn choice<T: Choice>() -> ChoiceParser<T> {
    ChoiceParser(PhantomData)
}

impl<T: Choice> TypedValueParser for ChoiceParser<T> {
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<T, clap::Error> {
        let text = value.to_str().ok_or_else(|| clap::Error::new(ErrorKind::InvalidUtf8).with_cmd(cmd))?;
        text.parse().map_err(|why: String| {
            let arg = arg.map(|a| format!(" for '{a}'")).unwrap_or_default();
            clap::Error::raw(ErrorKind::InvalidValue, format!("invalid value '{text}'{arg}: {why}\n"))
                .with_cmd(cmd)
        })
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        let values = T::NAMES.iter().zip(T::HELP).zip(T::ALIASES);
        Some(Box::new(values.map(|((name, help), aliases)| {
            PossibleValue::new(*name).help(*help).aliases(aliases.iter().copied())
        })))
    }
}

/// The model and run shared by `estimate`, `fit` and `timeline`.
#[derive(clap::Args)]
pub struct ModelArgs {
    /// Model file: a `torch.export` program (`.pt2`, `torch.export.save(torch.export.export(model,
    /// (x,)), "model.pt2")`, exported for the --input shape) or TorchScript (`.pt`,
    /// `torch.jit.script(model).save(...)`, the older format).
    pub model: PathBuf,
    /// Input shape, batch first: `16x3x224x224`.
    #[arg(long, value_parser = parse_shape, required = true)]
    pub input: Option<Shape>,
    /// The input is integer token ids (int64), e.g. for language models.
    #[arg(long)]
    pub ids: bool,
    /// Optimizer for --mode train: sgd, momentum, adam or adamw.
    #[arg(long, value_parser = choice::<Optimizer>(), default_value_t = Optimizer::Adam)]
    pub optimizer: Optimizer,
    /// When values of a TorchScript model are freed: torchscript (after their last use, as a tch
    /// `CModule` runs the model) or eager (as eager Python PyTorch: locals until rebound or
    /// `forward` returns, call inputs until the call returns). A `.pt2` program runs op by op as
    /// eager PyTorch does, each value freed after its last use, whichever is given.
    #[arg(long, value_parser = choice::<Lifetimes>(), default_value_t = Lifetimes::TorchScript)]
    pub lifetimes: Lifetimes,
    /// The dtype the model runs in: fp32, fp16 or bf16 (parameters, gradients, optimizer state,
    /// float inputs and activations), or amp-bf16 / amp-fp16 (mixed precision: low-precision
    /// weights and activations, fp32 master weights and optimizer state; figures per rank).
    /// `--dtype` is another name for it.
    #[arg(long, alias = "dtype", value_parser = choice::<TrainingPrecision>(), default_value_t = TrainingPrecision::Fp32)]
    pub precision: TrainingPrecision,
    /// Data-parallel ranks (GPUs) sharing the model states; figures are per rank.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub world_size: u64,
    /// How ranks share model states: none (DDP), zero1, zero2, or zero3 (FSDP full shard).
    #[arg(long, value_parser = choice::<Shard>(), default_value_t = Shard::None)]
    pub shard: Shard,
    /// inference (no grad) or train (forward, backward, optimizer step; twice).
    #[arg(long, value_enum, default_value_t = ModeArg::Train)]
    pub mode: ModeArg,
}

impl ModelArgs {
    /// The data-parallel job, when one was described (else figures are for one process).
    pub fn parallelism(&self) -> Option<Parallelism> {
        Parallelism::asked(self.world_size, self.shard, self.precision)
    }
}

/// An input shape from the command line.
#[derive(Debug, Clone)]
pub struct Shape(pub Vec<i64>);

/// `16x3x224x224` (also `16,3,224,224`).
fn parse_shape(s: &str) -> Result<Shape, String> {
    let dims: Result<Vec<i64>, _> = s.split(['x', 'X', ',']).map(|d| d.trim().parse::<i64>()).collect();
    match dims {
        Ok(d) if !d.is_empty() && d.iter().all(|&x| x > 0) => Ok(Shape(d)),
        _ => Err(format!("{s:?} is not a shape like 16x3x224x224")),
    }
}

/// The GPU a run is judged on (`estimate`, `fit`).
#[derive(clap::Args)]
pub struct GpuArgs {
    /// The GPU: `auto` (the first GPU CUDA shows this process, as NVML describes it, else `rtx4090`), a preset (`a100-80g`, `h100-80g`,
    /// `rtx4090`, `l4`, `t4`, ...) or a profile `.json`; for `estimate` also `all` (which presets
    /// the run fits), `cuda` (the caching-allocator prediction alone) or `none` (tensor bytes
    /// only). A run that does not fit a GPU is told the first allocation that would raise a CUDA
    /// out-of-memory error there.
    #[arg(long, default_value = profile::AUTO)]
    pub device_profile: String,
    /// Device memory instead of the profile's, e.g. `24GiB`, `16000MiB`, `40GB` (with a
    /// `--device-profile` naming one GPU).
    #[arg(long, value_parser = parse_memory_size)]
    pub gpu_mem: Option<u64>,
}

/// `estimate`: its options.
#[derive(clap::Args)]
pub struct EstimateArgs {
    /// The model and the run.
    #[command(flatten)]
    pub model: ModelArgs,
    /// The GPU the run is judged on.
    #[command(flatten)]
    pub gpu: GpuArgs,
    /// Run on the CPU when an op has no meta kernel (slow: real compute).
    #[arg(long)]
    pub allow_cpu: bool,
    /// meta: run the model on the meta device; static: analyse the TorchScript graph (inference
    /// only); both: run both and compare.
    #[arg(long, value_enum, default_value_t = Method::Meta)]
    pub method: Method,
    /// Where to run: meta (shapes only, fast) or cpu (real compute, to check an estimate).
    #[arg(long, value_parser = choice::<EstimateDevice>(), default_value_t = EstimateDevice::Meta)]
    pub run_on: EstimateDevice,
    /// Also write the simulated trace as a PyTorch memory snapshot (open it in memory_viz).
    #[arg(long)]
    pub snapshot: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `fit`: the options of the search.
#[derive(clap::Args)]
pub struct FitArgs {
    /// The model and the run.
    #[command(flatten)]
    pub model: ModelArgs,
    /// The input dimension to vary: batch (the first) or seq (the second, tokens).
    #[arg(long, value_parser = choice::<FitDimension>(), default_value_t = FitDimension::Batch)]
    pub vary: FitDimension,
    /// The GPU the run must fit.
    #[command(flatten)]
    pub gpu: GpuArgs,
    /// The largest size to try.
    #[arg(long, default_value_t = 1 << 16, value_parser = clap::value_parser!(i64).range(1..=1 << 40))]
    pub max: i64,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `timeline` of a model (or of a snapshot, which the lean binary draws itself).
#[derive(clap::Args)]
pub struct TimelineArgs {
    /// The model and the run.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Draw the run on this GPU, with the cuBLAS and cuBLASLt workspaces its matmuls take (the
    /// `workspace` category): `auto` (the first GPU CUDA shows this process, as NVML describes it, else `rtx4090`), a preset such as
    /// `h100-80g`, a profile `.json`, or `none` (the meta run alone).
    #[arg(long, default_value = profile::AUTO)]
    pub device_profile: String,
    /// Output: `.svg`, `.png`, `.json`, or `.pickle` (a memory snapshot laid out by the
    /// caching allocator model, for memory_viz).
    #[arg(short, long)]
    pub output: PathBuf,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_parsed_by_their_own_from_str_with_its_aliases() {
        let parse = |args: &[&str]| {
            ModelCli::try_parse_from(
                ["gpu-mem-track", "estimate", "m.pt", "--input", "2x3"].iter().chain(args),
            )
        };
        let ModelCommand::Estimate(e) =
            parse(&["--optimizer", "sgd_momentum", "--shard", "fsdp", "--dtype", "amp_bf16"])
                .unwrap()
                .command
        else {
            panic!("not estimate")
        };
        assert_eq!(e.model.optimizer, Optimizer::SgdMomentum);
        assert_eq!(e.model.shard, Shard::Zero3);
        assert_eq!(e.model.precision, TrainingPrecision::AmpBf16);
        assert_eq!(e.model.input.unwrap().0, vec![2, 3]);
        let err = parse(&["--optimizer", "lion"]).err().expect("lion is no optimizer").to_string();
        assert!(err.contains("invalid value 'lion' for '--optimizer <OPTIMIZER>'"), "{err}");
        assert!(err.contains("use sgd, momentum, adam or adamw"), "{err}");
    }

    #[test]
    fn help_lists_each_choice_and_its_default() {
        let mut cli = ModelCli::command();
        cli.build();
        let fit = cli.find_subcommand_mut("fit").unwrap();
        let help = fit.render_long_help().to_string();
        assert!(help.contains("[default: adam]"), "{help}");
        assert!(help.contains("- momentum: SGD with momentum: one buffer per parameter"), "{help}");
        assert!(help.contains("- amp-bf16: Mixed precision"), "{help}");
        let short = fit.render_help().to_string();
        assert!(short.contains("[possible values: sgd, momentum, adam, adamw]"), "{short}");
        assert!(short.contains("fp32, fp16, bf16, amp-bf16, amp-fp16"), "{short}");
        assert!(!print_help("report", true));
    }
}
