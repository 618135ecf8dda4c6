//! `plot_file LOG OUT.{svg,png} [TITLE]`: what `gpu-mem-track plot` draws, read with the
//! streaming [`plot_log_file`] (for measuring time and memory on long logs).
//!
//! `plot_file --generate N LOG` writes a synthetic training-loop log of N track points first
//! (its own generator, so the measurement depends on nothing else).
use std::io::{BufWriter, Write};
use std::path::Path;

use gpu_mem_track_log::diff::Sign;
use gpu_mem_track_log::group::TensorClass;
use gpu_mem_track_log::log::format;
use gpu_mem_track_log::log::{
    AtLine, GroupLine, LogHeader, MemoryField, SourceLocation, ALLOCATED, PEAK_ALLOCATED, TENSOR_USED,
};
use gpu_mem_track_log::plot::plot_log_file;

/// A training loop of `points` track points, three per step (forward, backward, step), with a
/// slow leak, a noisy activation size and one spike, so every kind of shape is drawn. The lines
/// are the log crate's own (`format::header`, `format::block`), as the tracker writes them.
fn generate(points: usize, out: &Path) -> std::io::Result<()> {
    let mut w = BufWriter::new(std::fs::File::create(out)?);
    let zero = |label: &str| MemoryField { label: label.into(), mib: 0.0 };
    let header = LogHeader {
        timestamp: "01-Jan-24-00:00:00".into(),
        fields: vec![zero(TENSOR_USED), zero(ALLOCATED)],
    };
    w.write_all(format::header(&header).as_bytes())?;
    let activation = GroupLine {
        sign: Sign::Plus,
        count: 1,
        shape: vec![128, 16, 28, 28],
        memory_mib: 6.125,
        class: TensorClass::Tensor,
        dtype: "torch.float32".into(),
        role: None,
        op: None,
        views: 0,
    };
    let mut peak = 0.0f64;
    // A small xorshift: noise without a dependency.
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for i in 0..points {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let noise = (seed % 1000) as f64 / 100.0;
        let leak = i as f64 * 200.0 / points.max(1) as f64;
        let (line, function, used) = match i % 3 {
            0 => (39, "forward", 400.0 + noise + leak),
            1 => (44, "backward", 250.0 + noise / 2.0 + leak),
            _ => (51, "step", 120.0 + leak),
        };
        let used = if i == points * 2 / 3 { used + 900.0 } else { used };
        let allocated = used + 64.0;
        peak = peak.max(allocated);
        let at = AtLine {
            location: SourceLocation { file: "examples/train.rs".into(), line, function: function.into() },
            fields: vec![
                MemoryField { label: TENSOR_USED.into(), mib: used },
                MemoryField { label: ALLOCATED.into(), mib: allocated },
                MemoryField { label: PEAK_ALLOCATED.into(), mib: peak },
            ],
        };
        w.write_all(format::block(std::slice::from_ref(&activation), &at).as_bytes())?;
    }
    w.flush()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--generate") {
        let (Some(n), Some(out)) = (args.get(1), args.get(2)) else {
            return Err("usage: plot_file --generate N LOG".into());
        };
        return Ok(generate(n.parse()?, out.as_ref())?);
    }
    let (Some(log), Some(out)) = (args.first(), args.get(1)) else {
        return Err("usage: plot_file LOG OUT.{svg,png} [TITLE] | plot_file --generate N LOG".into());
    };
    let title = args.get(2).cloned().unwrap_or_else(|| log.clone());
    let start = std::time::Instant::now();
    for w in plot_log_file(log.as_ref(), &title, out.as_ref())? {
        eprintln!("warning: {w}");
    }
    eprintln!("wrote {out} in {:.2} s", start.elapsed().as_secs_f64());
    Ok(())
}
