//! Writes a synthetic gpu-mem-track log, for the `report` benchmarks and measurements:
//!
//! ```text
//! synthetic_log points N OUT        a training loop: N track points (3 per step)
//! synthetic_log groups N OUT        N track points, each adding one new tensor shape
//! synthetic_log repeat MIB OUT [LOG]  LOG's blocks (default: a 30-step loop) repeated to MIB MiB
//! synthetic_log junk N OUT          a short valid log, then N lines that are not in the format
//! ```
use std::io::{BufWriter, Write};

use gpu_mem_track_log::diff::Sign;
use gpu_mem_track_log::group::TensorClass;
use gpu_mem_track_log::log::format;
use gpu_mem_track_log::log::{
    AtLine, GroupLine, LogHeader, MemoryField, SourceLocation, ALLOCATED, PEAK_ALLOCATED, TENSOR_USED,
};

fn group(sign: Sign, count: u64, shape: &[i64], class: TensorClass) -> GroupLine {
    let bytes = shape.iter().product::<i64>() as f64 * 4.0 * count as f64;
    GroupLine {
        sign,
        count,
        shape: shape.to_vec(),
        memory_mib: bytes / format::MIB,
        class,
        dtype: "torch.float32".into(),
        role: None,
        op: None,
        views: 0,
    }
}

fn at(line: u32, function: &str, allocated_mib: f64, peak_mib: f64) -> AtLine {
    AtLine {
        location: SourceLocation { file: "examples/train.rs".into(), line, function: function.into() },
        fields: vec![
            MemoryField { label: TENSOR_USED.into(), mib: allocated_mib },
            MemoryField { label: ALLOCATED.into(), mib: allocated_mib },
            MemoryField { label: PEAK_ALLOCATED.into(), mib: peak_mib },
        ],
    }
}

fn header() -> String {
    format::header(&LogHeader {
        timestamp: "22-Nov-26-00:35:47".into(),
        fields: vec![
            MemoryField { label: TENSOR_USED.into(), mib: 0.0 },
            MemoryField { label: ALLOCATED.into(), mib: 0.0 },
        ],
    })
}

/// Parameters once, then per step: forward (activations appear), backward (they go, gradients
/// appear at the first step), optimizer step.
fn training_loop(points: usize, out: &mut impl Write) -> std::io::Result<()> {
    let params: [&[i64]; 4] = [&[32, 16, 3, 3], &[64, 1568], &[10, 64], &[64]];
    let acts: [&[i64]; 4] = [&[128, 16, 28, 28], &[128, 32, 14, 14], &[128, 1568], &[128, 64]];
    let mib = |s: &[i64]| s.iter().product::<i64>() as f64 * 4.0 / format::MIB;
    let p_mib: f64 = params.iter().map(|s| mib(s)).sum();
    let a_mib: f64 = acts.iter().map(|s| mib(s)).sum();
    out.write_all(header().as_bytes())?;
    let changes: Vec<GroupLine> =
        params.iter().map(|s| group(Sign::Plus, 1, s, TensorClass::Parameter)).collect();
    out.write_all(format::block(&changes, &at(75, "main", p_mib, p_mib)).as_bytes())?;
    for i in 1..points {
        let step = (i - 1) / 3;
        let grads = if step == 0 { 0.0 } else { p_mib };
        let block = match (i - 1) % 3 {
            0 => {
                let c: Vec<_> = acts.iter().map(|s| group(Sign::Plus, 1, s, TensorClass::Tensor)).collect();
                format::block(&c, &at(39, "train_step", p_mib + grads + a_mib, p_mib + grads + a_mib))
            }
            1 => {
                let mut c: Vec<_> =
                    acts.iter().map(|s| group(Sign::Minus, 1, s, TensorClass::Tensor)).collect();
                if step == 0 {
                    c.extend(params.iter().map(|s| group(Sign::Plus, 1, s, TensorClass::Tensor)));
                }
                format::block(&c, &at(44, "train_step", 2.0 * p_mib, 2.0 * p_mib + a_mib))
            }
            _ => format::block(&[], &at(47, "train_step", 2.0 * p_mib, 2.0 * p_mib)),
        };
        out.write_all(block.as_bytes())?;
    }
    Ok(())
}

fn distinct_groups(points: usize, out: &mut impl Write) -> std::io::Result<()> {
    out.write_all(header().as_bytes())?;
    let mut total = 0.0;
    for i in 0..points {
        let g = group(Sign::Plus, 1, &[i as i64 + 1, 3], TensorClass::Tensor);
        total += g.memory_mib;
        out.write_all(format::block(&[g], &at(20, "grow", total, total)).as_bytes())?;
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: synthetic_log (points N | groups N | repeat MIB | junk N) OUT [LOG]";
    let [mode, n, path, rest @ ..] = &args[..] else { return Err(usage.into()) };
    let n: usize = n.parse().map_err(|_| usage)?;
    let mut out = BufWriter::new(std::fs::File::create(path)?);
    match mode.as_str() {
        "points" => training_loop(n, &mut out)?,
        "groups" => distinct_groups(n, &mut out)?,
        "repeat" => {
            let log = match rest.first() {
                Some(p) => std::fs::read_to_string(p)?,
                None => {
                    let mut v = Vec::new();
                    training_loop(91, &mut v)?;
                    String::from_utf8(v)?
                }
            };
            // The header once, then the blocks over and over.
            let body_at = log.find("\n\n").map_or(0, |i| i + 2);
            let (head, body) = log.split_at(body_at);
            if body.is_empty() {
                return Err("the log has no blocks to repeat".into());
            }
            out.write_all(head.as_bytes())?;
            let mut written = head.len();
            while written < n << 20 {
                out.write_all(body.as_bytes())?;
                written += body.len();
            }
        }
        "junk" => {
            training_loop(10, &mut out)?;
            for i in 0..n {
                writeln!(out, "junk line {i}: this is not a log line at all, {}", "x".repeat(80))?;
            }
        }
        _ => return Err(usage.into()),
    }
    out.flush()?;
    Ok(())
}
