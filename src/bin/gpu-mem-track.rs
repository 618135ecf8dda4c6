//! The `gpu-mem-track` command line.
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use gpu_mem_track::log::{parse_log_file, ALLOCATED, TENSOR_USED};

#[derive(Parser)]
#[command(name = "gpu-mem-track", version, about = "Where does the GPU memory of a tch program go?")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check that logs parse (ours or Pytorch-Memory-Utils') and print a one-line summary of each.
    Check {
        /// Log files (`*-gpu_mem_track.txt`).
        #[arg(required = true)]
        logs: Vec<PathBuf>,
    },
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Check { logs } => {
            for path in logs {
                let log = parse_log_file(&path)?;
                let peak = log.blocks.iter().max_by(|a, b| {
                    a.at.tensor_used_mib()
                        .partial_cmp(&b.at.tensor_used_mib())
                        .unwrap_or(std::cmp::Ordering::Equal)
                });
                let peak = peak
                    .map(|b| {
                        format!(
                            "peak {TENSOR_USED} {:.1} Mb ({ALLOCATED} {:.1} Mb) at {} line {}: {}",
                            b.at.tensor_used_mib().unwrap_or(0.0),
                            b.at.allocated_mib().unwrap_or(0.0),
                            b.at.location.file,
                            b.at.location.line,
                            b.at.location.function
                        )
                    })
                    .unwrap_or_else(|| "no track points".into());
                println!("{}: {} track points, {}", path.display(), log.blocks.len(), peak);
            }
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).context("gpu-mem-track") {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {:#}", e);
            ExitCode::from(1)
        }
    }
}
