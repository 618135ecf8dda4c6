//! Text of each kind of log line, byte-compatible with Pytorch-Memory-Utils' `gpu_mem_track.py`
//! except for its number truncation, which is fixed here.
use std::fmt::Write as _;

use super::{AtLine, GroupLine, LogHeader, MemoryField};

/// Bytes per MiB: the Python tool divides by 1024² although it prints `Mb`/`M`.
pub const MIB: f64 = 1024.0 * 1024.0;

/// A shape as Python prints a tuple: `()`, `(512,)`, `(64, 3, 3)`.
pub fn python_tuple(shape: &[i64]) -> String {
    match shape {
        [] => "()".to_owned(),
        [one] => format!("({one},)"),
        _ => {
            let mut s = String::with_capacity(shape.len() * 5 + 2);
            s.push('(');
            for (i, d) in shape.iter().enumerate() {
                if i > 0 {
                    s.push_str(", ");
                }
                let _ = write!(s, "{d}");
            }
            s.push(')');
            s
        }
    }
}

/// A group line's memory: rounded to 4 decimals with trailing zeros trimmed to one (`0.1406`,
/// `63.0`); values too small for that print with two significant digits (`1.3e-05`), as Python's
/// `{:.2g}` does.
pub fn group_mib(mib: f64) -> String {
    let mib = mib.abs();
    let fixed = format!("{mib:.4}");
    let trimmed = trim_zeros(&fixed);
    if trimmed != "0.0" || mib == 0.0 {
        return trimmed;
    }
    let mut exp = mib.log10().floor() as i32;
    let mut mant = (mib / 10f64.powi(exp) * 10.0).round() / 10.0;
    if mant >= 10.0 {
        mant /= 10.0;
        exp += 1;
    }
    let m = format!("{mant:.1}");
    let m = m.strip_suffix(".0").unwrap_or(&m);
    format!("{m}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs())
}

fn trim_zeros(fixed: &str) -> String {
    let t = fixed.trim_end_matches('0');
    if t.ends_with('.') {
        format!("{t}0")
    } else {
        t.to_owned()
    }
}

/// ` Label:12.3   Mb` (Python's `{x:<7.1f}`), with the leading space.
fn push_field(out: &mut String, f: &MemoryField) {
    let _ = write!(out, " {}:{:<7.1}Mb", f.label, f.mib);
}

/// The header line and the blank line after it.
pub fn header(h: &LogHeader) -> String {
    let mut out = format!("GPU Memory Track | {} |", h.timestamp);
    for f in &h.fields {
        push_field(&mut out, f);
    }
    out.push_str("\n\n");
    out
}

/// One `+`/`-` line with its newline; ` | <op>` last when the line names its op.
pub fn group_line(g: &GroupLine) -> String {
    let mut out = format!(
        "{} | {} * Size:{:<20} | Memory: {} M | {:<20} | {}",
        g.sign.as_char(),
        g.count,
        python_tuple(&g.shape),
        group_mib(g.memory_mib),
        g.class.to_string(),
        g.dtype
    );
    if let Some(op) = &g.op {
        out.push_str(" | ");
        out.push_str(op);
    }
    out.push('\n');
    out
}

/// One `! ` line (a sentence of an out-of-memory block) with its newline. Line breaks in `text`
/// become spaces, so a note stays one line.
pub fn note_line(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 3);
    out.push_str("! ");
    out.extend(text.chars().map(|c| if c == '\n' || c == '\r' { ' ' } else { c }));
    out.push('\n');
    out
}

/// The `At` line without newline.
pub fn at_line(at: &AtLine) -> String {
    let place = at.location.to_string();
    let mut out = format!("At {place:<50}");
    for f in &at.fields {
        push_field(&mut out, f);
    }
    out
}

/// A whole block as one string: group lines, blank line, `At` line, blank line.
pub fn block(changes: &[GroupLine], at: &AtLine) -> String {
    block_with_notes(changes, &[], at)
}

/// A whole block with `! ` lines between the blank line and the `At` line (an out-of-memory
/// block; [`block`] when `notes` is empty).
pub fn block_with_notes(changes: &[GroupLine], notes: &[String], at: &AtLine) -> String {
    let mut out = String::with_capacity(changes.len() * 100 + notes.len() * 100 + 160);
    for g in changes {
        out.push_str(&group_line(g));
    }
    out.push('\n');
    for n in notes {
        out.push_str(&note_line(n));
    }
    out.push_str(&at_line(at));
    out.push_str("\n\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tuples_print_like_python() {
        assert_eq!(python_tuple(&[]), "()");
        assert_eq!(python_tuple(&[512]), "(512,)");
        assert_eq!(python_tuple(&[64, 64, 3, 3]), "(64, 64, 3, 3)");
    }

    #[test]
    fn group_memory_is_rounded_not_truncated() {
        assert_eq!(group_mib(64.0 * 64.0 * 9.0 * 4.0 / MIB), "0.1406");
        assert_eq!(group_mib(63.0), "63.0");
        assert_eq!(group_mib(240.0), "240.0");
        assert_eq!(group_mib(1.125), "1.125");
        // 14 bytes: the Python tool's str(x)[:6] prints "1.3351".
        assert_eq!(group_mib(14.0 / MIB), "1.3e-05");
        assert_eq!(group_mib(1.0 / MIB), "9.5e-07");
        assert_eq!(group_mib(0.0), "0.0");
        // 0.00004 MiB rounds to 0.0000 at 4 decimals: falls back to 2 significant digits.
        assert_eq!(group_mib(0.00004), "4e-05");
        assert_eq!(group_mib(0.00005), "0.0001");
        assert_eq!(group_mib(0.123456), "0.1235");
    }

    #[test]
    fn at_line_pads_place_and_numbers_like_python() {
        let at = AtLine {
            location: super::super::SourceLocation {
                file: "main.py".into(),
                line: 10,
                function: "<module>".into(),
            },
            fields: vec![MemoryField { label: "Total Tensor Used Memory".into(), mib: 0.0 }],
        };
        assert_eq!(
            at_line(&at),
            "At main.py line 10: <module>                          Total Tensor Used Memory:0.0    Mb"
        );
    }
}
