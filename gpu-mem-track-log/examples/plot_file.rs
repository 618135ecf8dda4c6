//! `plot_file LOG OUT.{svg,png} [TITLE]`: what `gpu-mem-track plot` draws, read with the
//! streaming [`plot_log_file`] (for measuring time and memory on long logs).
//!
//! `plot_file --generate N LOG` writes a synthetic training-loop log of N track points first
//! (its own generator, so the measurement depends on nothing else).
use std::io::{BufWriter, Write};
use std::path::Path;

use gpu_mem_track_log::plot::plot_log_file;

/// A training loop of `points` track points, three per step (forward, backward, step), with a
/// slow leak, a noisy activation size and one spike, so every kind of shape is drawn.
fn generate(points: usize, out: &Path) -> std::io::Result<()> {
    let mut w = BufWriter::new(std::fs::File::create(out)?);
    writeln!(
        w,
        "GPU Memory Track | 01-Jan-24-00:00:00 | Total Tensor Used Memory:0.0    Mb Total Allocated Memory:0.0    Mb\n"
    )?;
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
        writeln!(
            w,
            "+ | 1 * Size:(128, 16, 28, 28)    | Memory: 6.125 M | <class 'torch.Tensor'> | torch.float32\n"
        )?;
        writeln!(
            w,
            "At {:<50} Total Tensor Used Memory:{used:<7.1}Mb Total Allocated Memory:{allocated:<7.1}Mb Peak Allocated Memory:{peak:<7.1}Mb\n",
            format!("examples/train.rs line {line}: {function}")
        )?;
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
