//! A small, iterative pickle reader for the data PyTorch memory snapshots hold (dicts, lists,
//! tuples, strings, numbers; protocols 0 to 5 as Python's `pickle` writes them).
//!
//! Why not a general decoder: serde-pickle builds and visits nested values recursively, so a
//! 2 MB file of a million nested lists overflows the stack (an abort, not an error), and some
//! opcodes (DUP, PUT of a memo reference) deep-copy values, so a small file can ask for huge
//! memory. Here every value is a node of one arena and containers hold node indices: no opcode
//! copies a value, nothing recurses (not even dropping), shared and self-containing values are
//! just indices, and memory is linear in the file's length. Declared lengths are checked
//! against the bytes left before anything is sliced, so no allocation is ever sized by them.
//! Objects (GLOBAL, REDUCE, BUILD, ...) are read as opaque [`Node::Other`] values.
use std::collections::HashMap;

/// Why a pickle cannot be read: what is wrong, and at which byte.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} (at byte {at})")]
pub(crate) struct PickleError {
    /// Offset of the opcode.
    pub at: usize,
    /// What is wrong.
    pub what: String,
}

/// Index of a node in [`Pickle::nodes`].
pub(crate) type Id = u32;

/// One value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Node<'a> {
    None,
    Bool(bool),
    /// Integers up to 128 bits (wider ones are [`Node::Other`]).
    Int(i128),
    Float(f64),
    /// `str` (and protocol-0 strings, unescaped as they are: only compared, never shown).
    Text(&'a [u8]),
    Bytes(&'a [u8]),
    List(Vec<Id>),
    Tuple(Vec<Id>),
    Dict(Vec<(Id, Id)>),
    /// A set, an object, a global, a persistent id, a wide integer: kept opaque.
    Other,
}

/// A decoded pickle: its nodes and the one returned by STOP.
#[derive(Debug)]
pub(crate) struct Pickle<'a> {
    nodes: Vec<Node<'a>>,
    /// The value returned by STOP.
    pub root: Id,
}

impl<'a> Pickle<'a> {
    /// The node `id`.
    pub fn node(&self, id: Id) -> &Node<'a> {
        &self.nodes[id as usize]
    }

    /// The items of a list or tuple.
    pub fn items(&self, id: Id) -> Option<&[Id]> {
        match self.node(id) {
            Node::List(v) | Node::Tuple(v) => Some(v),
            _ => None,
        }
    }

    /// The value under the text key `key` of a dict (the last one, as Python keeps).
    pub fn get(&self, dict: Id, key: &str) -> Option<Id> {
        match self.node(dict) {
            Node::Dict(entries) => {
                entries.iter().rev().find(|(k, _)| self.text(*k) == Some(key)).map(|&(_, v)| v)
            }
            _ => None,
        }
    }

    /// A text value as `str` (`None` for other values and invalid UTF-8).
    pub fn text(&self, id: Id) -> Option<&'a str> {
        match self.node(id) {
            Node::Text(t) => std::str::from_utf8(t).ok(),
            _ => None,
        }
    }

    /// An integer value (booleans count, as in Python).
    pub fn int(&self, id: Id) -> Option<i128> {
        match self.node(id) {
            Node::Int(i) => Some(*i),
            Node::Bool(b) => Some(i128::from(*b)),
            _ => None,
        }
    }
}

/// A cursor over the data, every read bounds-checked.
struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
    /// Offset of the opcode being read, for errors.
    at: usize,
}

impl<'a> Cursor<'a> {
    fn err(&self, what: impl Into<String>) -> PickleError {
        PickleError { at: self.at, what: what.into() }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], PickleError> {
        if n > self.data.len() - self.pos {
            return Err(self.err(format!(
                "the pickle is cut short: {n} bytes declared, {} left",
                self.data.len() - self.pos
            )));
        }
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    /// A little-endian unsigned integer of `n` bytes (n <= 8).
    fn uint(&mut self, n: usize) -> Result<u64, PickleError> {
        Ok(self.take(n)?.iter().rev().fold(0u64, |v, &b| (v << 8) | u64::from(b)))
    }

    /// A length of `n` bytes, then that many bytes.
    fn counted(&mut self, n: usize) -> Result<&'a [u8], PickleError> {
        let len = self.uint(n)?;
        // Larger than any slice can be: certainly more than is left.
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        self.take(len)
    }

    /// Text up to the next newline (protocol 0 arguments), without it.
    fn line(&mut self) -> Result<&'a [u8], PickleError> {
        let rest = &self.data[self.pos..];
        let end = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or_else(|| self.err("the pickle is cut short in a line"))?;
        self.pos += end + 1;
        Ok(rest[..end].strip_suffix(b"\r").unwrap_or(&rest[..end]))
    }
}

/// A little-endian two's-complement integer (LONG1, LONG4); `None` past 128 bits.
fn signed_le(bytes: &[u8]) -> Option<i128> {
    if bytes.is_empty() {
        return Some(0);
    }
    let negative = bytes[bytes.len() - 1] & 0x80 != 0;
    // Sign-extension bytes beyond 16 carry no information.
    let fill = if negative { 0xff } else { 0 };
    let significant = bytes.len() - bytes.iter().rev().take_while(|&&b| b == fill).count();
    if significant > 16 || (significant == 16 && (bytes[15] & 0x80 != 0) != negative) {
        return None;
    }
    let mut buf = [fill; 16];
    buf[..significant.min(bytes.len())].copy_from_slice(&bytes[..significant.min(bytes.len())]);
    Some(i128::from_le_bytes(buf))
}

/// Decodes `data`, which must hold one pickle (bytes after its STOP are ignored, as Python does).
/// Time and memory are linear in `data.len()`.
///
/// # Errors
/// [`PickleError`] for a truncated pickle, an unknown opcode, a stack or memo misuse, a
/// malformed protocol-0 number.
pub(crate) fn parse(data: &[u8]) -> Result<Pickle<'_>, PickleError> {
    let mut c = Cursor { data, pos: 0, at: 0 };
    let mut nodes: Vec<Node<'_>> = Vec::new();
    let mut stack: Vec<Id> = Vec::new();
    let mut marks: Vec<usize> = Vec::new();
    let mut memo: HashMap<u64, Id> = HashMap::new();
    while c.pos < data.len() {
        c.at = c.pos;
        let op = data[c.pos];
        c.pos += 1;
        let at = c.at;
        let underflow = || PickleError { at, what: "malformed pickle: stack underflow".into() };
        let pop_mark = |stack: &mut Vec<Id>, marks: &mut Vec<usize>| -> Result<Vec<Id>, PickleError> {
            let m = marks.pop().ok_or_else(underflow)?;
            // A POP may have taken items below the mark already.
            Ok(stack.split_off(m.min(stack.len())))
        };
        let node = match op {
            b'.' => {
                let root = stack.pop().ok_or_else(underflow)?;
                return Ok(Pickle { nodes, root });
            }
            b'(' => {
                marks.push(stack.len());
                None
            }
            b'0' => {
                stack.pop().ok_or_else(underflow)?;
                None
            }
            b'1' => {
                pop_mark(&mut stack, &mut marks)?;
                None
            }
            // DUP: the same node again, not a copy.
            b'2' => Some(*stack.last().ok_or_else(underflow)?),
            0x80 => {
                c.take(1)?;
                None
            }
            // FRAME: a length hint only; the opcodes that follow are read as usual.
            0x95 => {
                c.take(8)?;
                None
            }
            b'N' => Some(new(&mut nodes, at, Node::None)?),
            0x88 => Some(new(&mut nodes, at, Node::Bool(true))?),
            0x89 => Some(new(&mut nodes, at, Node::Bool(false))?),
            b'J' => Some(new(&mut nodes, at, Node::Int(i128::from(c.uint(4)? as u32 as i32)))?),
            b'K' => Some(new(&mut nodes, at, Node::Int(i128::from(c.uint(1)?)))?),
            b'M' => Some(new(&mut nodes, at, Node::Int(i128::from(c.uint(2)?)))?),
            0x8a => {
                let n = signed_le(c.counted(1)?).map_or(Node::Other, Node::Int);
                Some(new(&mut nodes, at, n)?)
            }
            0x8b => {
                let n = signed_le(c.counted(4)?).map_or(Node::Other, Node::Int);
                Some(new(&mut nodes, at, n)?)
            }
            b'G' => Some(new(&mut nodes, at, Node::Float(f64::from_be_bytes(c.uint(8)?.to_le_bytes())))?),
            b'I' | b'L' => {
                let line = c.line()?;
                let text = std::str::from_utf8(line).unwrap_or("").trim().trim_end_matches('L');
                let n = match text {
                    "00" => Node::Bool(false),
                    "01" => Node::Bool(true),
                    t => t.parse().map(Node::Int).map_err(|_| c.err("malformed protocol-0 integer"))?,
                };
                Some(new(&mut nodes, at, n)?)
            }
            b'F' => {
                let line = c.line()?;
                let f = std::str::from_utf8(line).ok().and_then(|t| t.trim().parse().ok());
                Some(new(&mut nodes, at, Node::Float(f.ok_or_else(|| c.err("malformed protocol-0 float"))?))?)
            }
            0x8c => Some(new(&mut nodes, at, Node::Text(c.counted(1)?))?),
            b'X' => Some(new(&mut nodes, at, Node::Text(c.counted(4)?))?),
            0x8d => Some(new(&mut nodes, at, Node::Text(c.counted(8)?))?),
            b'U' => Some(new(&mut nodes, at, Node::Bytes(c.counted(1)?))?),
            b'T' | b'B' => Some(new(&mut nodes, at, Node::Bytes(c.counted(4)?))?),
            b'C' => Some(new(&mut nodes, at, Node::Bytes(c.counted(1)?))?),
            0x8e | 0x96 => Some(new(&mut nodes, at, Node::Bytes(c.counted(8)?))?),
            b'S' | b'V' => Some(new(&mut nodes, at, Node::Text(c.line()?))?),
            b']' => Some(new(&mut nodes, at, Node::List(Vec::new()))?),
            b')' => Some(new(&mut nodes, at, Node::Tuple(Vec::new()))?),
            b'}' => Some(new(&mut nodes, at, Node::Dict(Vec::new()))?),
            0x8f => Some(new(&mut nodes, at, Node::Other)?),
            b'l' => {
                let items = pop_mark(&mut stack, &mut marks)?;
                Some(new(&mut nodes, at, Node::List(items))?)
            }
            b't' => {
                let items = pop_mark(&mut stack, &mut marks)?;
                Some(new(&mut nodes, at, Node::Tuple(items))?)
            }
            0x85..=0x87 => {
                let n = usize::from(op - 0x84);
                let from = stack.len().checked_sub(n).ok_or_else(underflow)?;
                let items = stack.split_off(from);
                Some(new(&mut nodes, at, Node::Tuple(items))?)
            }
            b'd' => {
                let items = pop_mark(&mut stack, &mut marks)?;
                let pairs = items.chunks_exact(2).map(|p| (p[0], p[1])).collect();
                Some(new(&mut nodes, at, Node::Dict(pairs))?)
            }
            b'a' | b'e' => {
                let items = if op == b'a' {
                    vec![stack.pop().ok_or_else(underflow)?]
                } else {
                    pop_mark(&mut stack, &mut marks)?
                };
                let top = *stack.last().ok_or_else(underflow)?;
                // Appending to an object calls its `append`/`extend`: nothing to keep.
                if let Node::List(v) = &mut nodes[top as usize] {
                    v.extend(items);
                }
                None
            }
            b's' | b'u' => {
                let items = if op == b's' {
                    let from = stack.len().checked_sub(2).ok_or_else(underflow)?;
                    stack.split_off(from)
                } else {
                    pop_mark(&mut stack, &mut marks)?
                };
                let top = *stack.last().ok_or_else(underflow)?;
                if let Node::Dict(d) = &mut nodes[top as usize] {
                    d.extend(items.chunks_exact(2).map(|p| (p[0], p[1])));
                }
                None
            }
            // ADDITEMS (to a set), FROZENSET.
            0x90 => {
                pop_mark(&mut stack, &mut marks)?;
                stack.last().ok_or_else(underflow)?;
                None
            }
            0x91 => {
                pop_mark(&mut stack, &mut marks)?;
                Some(new(&mut nodes, at, Node::Other)?)
            }
            // Memo.
            b'q' | b'r' | b'p' | 0x94 => {
                let key = match op {
                    b'q' => c.uint(1)?,
                    b'r' => c.uint(4)?,
                    b'p' => {
                        let line = c.line()?;
                        memo_key(&c, line)?
                    }
                    _ => memo.len() as u64,
                };
                memo.insert(key, *stack.last().ok_or_else(underflow)?);
                None
            }
            b'h' | b'j' | b'g' => {
                let key = match op {
                    b'h' => c.uint(1)?,
                    b'j' => c.uint(4)?,
                    _ => {
                        let line = c.line()?;
                        memo_key(&c, line)?
                    }
                };
                Some(
                    *memo
                        .get(&key)
                        .ok_or_else(|| c.err(format!("malformed pickle: memo {key} was never set")))?,
                )
            }
            // Objects and globals: their arguments are consumed, the result is opaque.
            b'c' => {
                c.line()?;
                c.line()?;
                Some(new(&mut nodes, at, Node::Other)?)
            }
            0x93 | b'R' | 0x81 => {
                let from = stack.len().checked_sub(2).ok_or_else(underflow)?;
                stack.truncate(from);
                Some(new(&mut nodes, at, Node::Other)?)
            }
            0x92 => {
                let from = stack.len().checked_sub(3).ok_or_else(underflow)?;
                stack.truncate(from);
                Some(new(&mut nodes, at, Node::Other)?)
            }
            // BUILD: sets the state of the object below; nothing to keep.
            b'b' => {
                stack.pop().ok_or_else(underflow)?;
                stack.last().ok_or_else(underflow)?;
                None
            }
            b'i' => {
                c.line()?;
                c.line()?;
                pop_mark(&mut stack, &mut marks)?;
                Some(new(&mut nodes, at, Node::Other)?)
            }
            b'o' => {
                pop_mark(&mut stack, &mut marks)?;
                Some(new(&mut nodes, at, Node::Other)?)
            }
            b'P' => {
                c.line()?;
                Some(new(&mut nodes, at, Node::Other)?)
            }
            b'Q' => {
                stack.pop().ok_or_else(underflow)?;
                Some(new(&mut nodes, at, Node::Other)?)
            }
            0x82 => {
                c.take(1)?;
                Some(new(&mut nodes, at, Node::Other)?)
            }
            0x83 => {
                c.take(2)?;
                Some(new(&mut nodes, at, Node::Other)?)
            }
            0x84 => {
                c.take(4)?;
                Some(new(&mut nodes, at, Node::Other)?)
            }
            0x97 => Some(new(&mut nodes, at, Node::Other)?),
            0x98 => {
                stack.last().ok_or_else(underflow)?;
                None
            }
            _ => return Err(c.err(format!("not a pickle: unknown opcode 0x{op:02x}"))),
        };
        stack.extend(node);
    }
    Err(PickleError { at: data.len(), what: "the pickle is cut short: no STOP opcode".into() })
}

/// Adds a node. Each opcode makes at most one, so ids fit unless the data is over 4 GiB, which
/// is refused rather than wrapped.
fn new<'a>(nodes: &mut Vec<Node<'a>>, at: usize, n: Node<'a>) -> Result<Id, PickleError> {
    let id = Id::try_from(nodes.len()).map_err(|_| PickleError { at, what: "too many values".into() })?;
    nodes.push(n);
    Ok(id)
}

fn memo_key(c: &Cursor<'_>, line: &[u8]) -> Result<u64, PickleError> {
    std::str::from_utf8(line)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .ok_or_else(|| c.err("malformed protocol-0 memo key"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested_lists(n: usize) -> Vec<u8> {
        let mut p = vec![0x80, 2];
        p.extend(std::iter::repeat_n(b']', n));
        p.extend(std::iter::repeat_n(b'a', n - 1));
        p.push(b'.');
        p
    }

    #[test]
    fn a_million_nested_lists_are_read_without_recursion() {
        let p = nested_lists(1_000_000);
        let pickle = parse(&p).unwrap();
        // Walk down iteratively: each list holds the next.
        let (mut id, mut depth) = (pickle.root, 1);
        while let Some(&[inner]) = pickle.items(id) {
            id = inner;
            depth += 1;
        }
        assert_eq!(depth, 1_000_000);
    }

    #[test]
    fn huge_lengths_truncation_and_junk_are_errors() {
        // BINUNICODE8 declaring 2^62 bytes.
        let mut p = vec![0x80, 4, 0x8d];
        p.extend((1u64 << 62).to_le_bytes());
        p.push(b'.');
        let e = parse(&p).unwrap_err();
        assert_eq!(e.at, 2);
        assert!(e.what.contains("cut short"), "{e}");
        assert!(parse(b"\x80\x02]").unwrap_err().what.contains("no STOP"));
        assert!(parse(b"\xff").unwrap_err().what.contains("unknown opcode 0xff"));
        assert!(parse(b"a.").unwrap_err().what.contains("underflow"));
        assert!(parse(b"h\x05.").unwrap_err().what.contains("memo 5"));
    }

    #[test]
    fn self_containing_and_shared_values_cost_nothing_extra() {
        // A list appended with itself 1000 times; then DUP 1000 times.
        let mut p = vec![0x80, 2, b']', b'q', 0];
        for _ in 0..1000 {
            p.extend([b'h', 0, b'a']);
        }
        p.extend([b'2'; 1000]);
        p.extend([b'0'; 1000]);
        p.push(b'.');
        let pickle = parse(&p).unwrap();
        assert_eq!(pickle.items(pickle.root).unwrap().len(), 1000);
        assert_eq!(pickle.nodes.len(), 1);
    }

    #[test]
    fn integers_of_every_width() {
        assert_eq!(signed_le(&[0xff]), Some(-1));
        assert_eq!(signed_le(&[0x00, 0x80]), Some(-32768));
        assert_eq!(
            signed_le(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00]),
            Some(u64::MAX as i128)
        );
        assert_eq!(signed_le(&[1; 17]), None);
        let mut wide = vec![5];
        wide.extend([0; 40]);
        assert_eq!(signed_le(&wide), Some(5));
        // {'a': 1, 'b': -2, 'c': 'x'} as Python's protocol 2 writes it.
        let p = b"\x80\x02}q\x00(X\x01\x00\x00\x00aq\x01K\x01X\x01\x00\x00\x00bq\x02J\xfe\xff\xff\xffX\x01\x00\x00\x00cq\x03X\x01\x00\x00\x00xq\x04u.";
        let pickle = parse(p).unwrap();
        let get = |k| pickle.get(pickle.root, k).unwrap();
        assert_eq!(pickle.int(get("a")), Some(1));
        assert_eq!(pickle.int(get("b")), Some(-2));
        assert_eq!(pickle.text(get("c")), Some("x"));
    }
}
