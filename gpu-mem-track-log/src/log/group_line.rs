//! The `+`/`-` line: one group of tensors (same shape, dtype, class and, when the tracker groups
//! by op, op) that appeared or went away since the previous track point.
//!
//! ```text
//! + | 1 * Size:(64, 64, 3, 3)       | Memory: 0.1406 M | <class 'torch.nn.parameter.Parameter'> | torch.float32
//! - | 2 * Size:(40, 3, 512, 512)    | Memory: 240.0 M | <class 'torch.Tensor'> | torch.float32 | aten::convolution
//! + | 1 * Size:(128, 32, 7, 7)      | Memory: 0.7656 M | <class 'torch.Tensor'> | torch.float32 | (+1 views)
//! ```
//!
//! The five fields come first; what follows is optional, in this order: what the tensors are when
//! the tracker knows (`gradient`, `optimizer state`, `internal to aten::max_pool2d`, `inductor
//! buffer`), the op that made them (when the tracker groups by op) and the views of their storages
//! that came or went with them (tensors that add no memory; by default they have no line of their own).
//!
//! Byte-compatible with Pytorch-Memory-Utils except for its number truncation, which is fixed
//! here; its lines (whose `-` lines end in a space and whose numbers are truncated) read back.
use std::fmt::Write as _;

use super::MIB;
use super::{clip, parse_finite};
use crate::diff::Sign;
use crate::group::{TensorClass, TensorRole};

/// One `+`/`-` line.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupLine {
    /// `+` or `-`.
    pub sign: Sign,
    /// Tensors added or removed.
    pub count: u64,
    /// Sizes of each tensor of the group.
    pub shape: Vec<i64>,
    /// Memory added or removed, MiB, as printed.
    pub memory_mib: f64,
    /// Python class.
    pub class: TensorClass,
    /// Python dtype name (`torch.float32`).
    pub dtype: String,
    /// What the tensors are, when the tracker knows (` | gradient`).
    pub role: Option<TensorRole>,
    /// The op that made the tensors (` | aten::convolution`, a column printed only when the
    /// tracker groups by op).
    pub op: Option<String>,
    /// Views of the group's storages that came or went with it (` | (+2 views)`; negative: they
    /// moved the other way); 0 prints no field.
    pub views: i64,
}

/// Whether `l` is a `+`/`-` line (what the reader hands to `GroupLine::parse`).
pub(super) fn is_group_line(l: &str) -> bool {
    l.starts_with("+ |") || l.starts_with("- |")
}

impl GroupLine {
    /// The line of a group's change (its op column only when the group has an op).
    pub fn from_change(c: &crate::diff::GroupChange) -> Self {
        GroupLine {
            sign: c.sign,
            count: c.count,
            shape: c.key.shape.to_vec(),
            memory_mib: c.bytes as f64 / MIB,
            class: c.key.class.clone(),
            dtype: c.key.dtype.torch_name(),
            role: c.key.role.clone(),
            op: c.key.op.as_deref().map(str::to_owned),
            views: c.views,
        }
    }

    /// The line with its newline; ` | <op>` last when the line names its op.
    pub fn render(&self) -> String {
        let mut out = format!(
            "{} | {} * Size:{:<20} | Memory: {} M | {:<20} | {}",
            self.sign.as_char(),
            self.count,
            python_tuple(&self.shape),
            group_mib(self.memory_mib),
            self.class.to_string(),
            self.dtype
        );
        if let Some(role) = &self.role {
            out.push_str(" | ");
            out.push_str(&role.label());
        }
        if let Some(op) = &self.op {
            out.push_str(" | ");
            out.push_str(op);
        }
        if self.views != 0 {
            let _ = write!(out, " | ({:+} views)", self.views);
        }
        out.push('\n');
        out
    }

    /// Reads a `+`/`-` line (without its line ending; one that `is_group_line` accepts); the
    /// error is the reason a log parse error gives.
    pub(super) fn parse(l: &str) -> Result<GroupLine, String> {
        let sign = if l.starts_with('+') { Sign::Plus } else { Sign::Minus };
        let mut parts: Vec<&str> = l[3..].split(" | ").map(str::trim).collect();
        let views = match parts.last().and_then(|p| parse_views(p)) {
            Some(v) if parts.len() > 4 => {
                parts.pop();
                v
            }
            _ => 0,
        };
        // What the tensors are: the field after the five, when it names a role.
        let role = match parts.get(4).and_then(|f| TensorRole::from_label(f)) {
            Some(r) => {
                parts.remove(4);
                Some(r)
            }
            None => None,
        };
        let (count_shape, memory, class, dtype, op) = match parts[..] {
            [a, b, c, d] => (a, b, c, d, None),
            [a, b, c, d, op] if !op.is_empty() => (a, b, c, d, Some(op)),
            _ => {
                return Err(format!(
                    "a group line has 5 `|`-separated columns (then its role, its op and its views, \
                     when printed), this one has {}",
                    parts.len() + 1 + usize::from(views != 0) + usize::from(role.is_some())
                ))
            }
        };
        let (count, shape) = count_shape.split_once(" * Size:").ok_or("expected `N * Size:(...)`")?;
        let count = count.trim().parse::<u64>().map_err(|_| format!("bad tensor count {:?}", clip(count)))?;
        let shape = parse_shape(shape.trim())?;
        let memory = memory
            .strip_prefix("Memory:")
            .and_then(|m| m.trim().strip_suffix('M'))
            .ok_or("expected `Memory: <MiB> M`")?
            .trim();
        let memory_mib =
            parse_finite(memory).ok_or_else(|| format!("bad memory figure {:?}", clip(memory)))?;
        let class = class
            .strip_prefix("<class '")
            .and_then(|c| c.strip_suffix("'>"))
            .ok_or("expected a class like `<class 'torch.Tensor'>`")?;
        if dtype.is_empty() {
            return Err("missing dtype column".into());
        }
        Ok(GroupLine {
            sign,
            count,
            shape,
            memory_mib,
            class: TensorClass::from_python_name(class),
            dtype: dtype.to_owned(),
            role,
            op: op.map(str::to_owned),
            views,
        })
    }
}

/// `(+2 views)`, `(-1 views)`: the views field's count.
fn parse_views(field: &str) -> Option<i64> {
    let n = field.strip_prefix('(')?.strip_suffix(" views)")?;
    if !n.starts_with(['+', '-']) {
        return None;
    }
    n.parse::<i64>().ok().filter(|v| *v != 0)
}

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

/// `()`, `(512,)`, `(64, 3)`; also `torch.Size([64, 3])`.
fn parse_shape(s: &str) -> Result<Vec<i64>, String> {
    let inner = s
        .strip_prefix("torch.Size([")
        .and_then(|x| x.strip_suffix("])"))
        .or_else(|| s.strip_prefix('(').and_then(|x| x.strip_suffix(')')))
        .ok_or_else(|| format!("bad shape {:?}: expected a tuple like (64, 3)", clip(s)))?;
    inner
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| d.parse::<i64>().map_err(|_| format!("bad dimension {:?} in shape {:?}", clip(d), clip(s))))
        .collect()
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
    fn a_line_reads_back_as_written() {
        let g = GroupLine {
            sign: Sign::Minus,
            count: 2,
            shape: vec![40, 3, 512, 512],
            memory_mib: 240.0,
            class: TensorClass::Tensor,
            dtype: "torch.float32".into(),
            role: None,
            op: Some("aten::convolution".into()),
            views: 0,
        };
        let line = g.render();
        assert!(is_group_line(&line));
        assert_eq!(GroupLine::parse(line.trim_end_matches('\n')), Ok(g.clone()));
        let internal = Some(TensorRole::Internal { op: "aten::max_pool2d".into() });
        for (role, op, views, tail) in [
            (None, None, 2, "torch.float32 | (+2 views)\n"),
            (None, Some("aten::convolution"), 2, "torch.float32 | aten::convolution | (+2 views)\n"),
            (None, None, -1, "torch.float32 | (-1 views)\n"),
            (Some(TensorRole::Gradient), None, 0, "torch.float32 | gradient\n"),
            (Some(TensorRole::InductorBuffer), None, 1, "torch.float32 | inductor buffer | (+1 views)\n"),
            (
                Some(TensorRole::OptimizerState),
                Some("aten::mul"),
                0,
                "torch.float32 | optimizer state | aten::mul\n",
            ),
            (
                internal,
                Some("aten::max_pool2d"),
                1,
                "torch.float32 | internal to aten::max_pool2d | aten::max_pool2d | (+1 views)\n",
            ),
        ] {
            let g = GroupLine { role, op: op.map(String::from), views, ..g.clone() };
            let line = g.render();
            assert!(line.ends_with(tail), "{line}");
            // The five fields first: a reader of the Python tool's format splits them off.
            assert_eq!(line.split(" | ").nth(4).map(|d| d.trim_end()), Some("torch.float32"));
            assert_eq!(GroupLine::parse(line.trim_end_matches('\n')), Ok(g));
        }
    }

    #[test]
    fn a_views_field_needs_its_sign_and_an_op_named_like_it_stays_an_op() {
        let base = "+ | 1 * Size:(4,) | Memory: 0.0 M | <class 'torch.Tensor'> | torch.float32";
        let op_like = format!("{base} | (2 views)");
        assert_eq!(GroupLine::parse(&op_like).unwrap().op.as_deref(), Some("(2 views)"));
        assert_eq!(
            GroupLine::parse(&format!("{base} | (+0 views)")).unwrap().op.as_deref(),
            Some("(+0 views)")
        );
        let too_many = format!("{base} | aten::mm | (+1 views) | extra");
        assert!(GroupLine::parse(&too_many).unwrap_err().contains("5 `|`-separated columns"));
        assert_eq!(GroupLine::parse(&format!("{base} | (+9223372036854775808 views)")).unwrap().views, 0);
    }
}
