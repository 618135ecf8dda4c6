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
    let mut m = Machine {
        c: Cursor { data, pos: 0, at: 0 },
        nodes: Vec::new(),
        stack: Vec::new(),
        marks: Vec::new(),
        memo: HashMap::new(),
    };
    while m.c.pos < data.len() {
        m.c.at = m.c.pos;
        let op = data[m.c.pos];
        m.c.pos += 1;
        if op == b'.' {
            let root = m.pop()?;
            return Ok(Pickle { nodes: m.nodes, root });
        }
        let pushed = match scalar(op, &mut m.c)? {
            Some(value) => Some(m.new_node(value)?),
            None => m.step(op)?,
        };
        m.stack.extend(pushed);
    }
    Err(PickleError { at: data.len(), what: "the pickle is cut short: no STOP opcode".into() })
}

/// The pickle machine's state: the values made so far, its stack, marks and memo.
struct Machine<'a> {
    c: Cursor<'a>,
    nodes: Vec<Node<'a>>,
    stack: Vec<Id>,
    marks: Vec<usize>,
    memo: HashMap<u64, Id>,
}

impl<'a> Machine<'a> {
    fn underflow(&self) -> PickleError {
        PickleError { at: self.c.at, what: "malformed pickle: stack underflow".into() }
    }

    fn pop(&mut self) -> Result<Id, PickleError> {
        self.stack.pop().ok_or_else(|| self.underflow())
    }

    fn top(&self) -> Result<Id, PickleError> {
        self.stack.last().copied().ok_or_else(|| self.underflow())
    }

    /// The top `n` items, taken off the stack.
    fn pop_n(&mut self, n: usize) -> Result<Vec<Id>, PickleError> {
        let from = self.stack.len().checked_sub(n).ok_or_else(|| self.underflow())?;
        Ok(self.stack.split_off(from))
    }

    /// The items above the last mark, taken off the stack with the mark.
    fn pop_mark(&mut self) -> Result<Vec<Id>, PickleError> {
        let m = self.marks.pop().ok_or_else(|| self.underflow())?;
        // A POP may have taken items below the mark already.
        Ok(self.stack.split_off(m.min(self.stack.len())))
    }

    /// Adds a node. Each opcode makes at most one, so ids fit unless the data is over 4 GiB,
    /// which is refused rather than wrapped.
    fn new_node(&mut self, n: Node<'a>) -> Result<Id, PickleError> {
        let id = Id::try_from(self.nodes.len())
            .map_err(|_| PickleError { at: self.c.at, what: "too many values".into() })?;
        self.nodes.push(n);
        Ok(id)
    }

    /// Runs one opcode other than STOP and the scalars; returns what it pushes.
    fn step(&mut self, op: u8) -> Result<Option<Id>, PickleError> {
        match op {
            b'(' => self.marks.push(self.stack.len()),
            b'0' => drop(self.pop()?),
            b'1' => drop(self.pop_mark()?),
            // DUP: the same node again, not a copy.
            b'2' => return self.top().map(Some),
            // PROTO; FRAME (a length hint only: the opcodes that follow are read as usual).
            0x80 => drop(self.c.take(1)?),
            0x95 => drop(self.c.take(8)?),
            b']' | b')' | b'}' | b'l' | b't' | 0x85..=0x87 | b'd' | b'a' | b'e' | b's' | b'u' => {
                return self.container(op)
            }
            b'q' | b'r' | b'p' | 0x94 | b'h' | b'j' | b'g' => return self.memo_op(op),
            _ => return self.object(op),
        }
        Ok(None)
    }

    /// Lists, tuples and dicts: made empty, from marked or counted items, or appended to.
    fn container(&mut self, op: u8) -> Result<Option<Id>, PickleError> {
        let node = match op {
            b']' => Node::List(Vec::new()),
            b')' => Node::Tuple(Vec::new()),
            b'}' => Node::Dict(Vec::new()),
            b'l' => Node::List(self.pop_mark()?),
            b't' => Node::Tuple(self.pop_mark()?),
            0x85..=0x87 => Node::Tuple(self.pop_n(usize::from(op - 0x84))?),
            b'd' => Node::Dict(self.pop_mark()?.chunks_exact(2).map(|p| (p[0], p[1])).collect()),
            b'a' | b'e' => {
                let items = if op == b'a' { vec![self.pop()?] } else { self.pop_mark()? };
                // Appending to an object calls its `append`/`extend`: nothing to keep.
                let top = self.top()? as usize;
                if let Node::List(v) = &mut self.nodes[top] {
                    v.extend(items);
                }
                return Ok(None);
            }
            _ => {
                let items = if op == b's' { self.pop_n(2)? } else { self.pop_mark()? };
                let top = self.top()? as usize;
                if let Node::Dict(d) = &mut self.nodes[top] {
                    d.extend(items.chunks_exact(2).map(|p| (p[0], p[1])));
                }
                return Ok(None);
            }
        };
        self.new_node(node).map(Some)
    }

    /// PUT (remembers the top of the stack under a key) and GET (pushes it again).
    fn memo_op(&mut self, op: u8) -> Result<Option<Id>, PickleError> {
        let key = match op {
            b'q' | b'h' => self.c.uint(1)?,
            b'r' | b'j' => self.c.uint(4)?,
            b'p' | b'g' => {
                let line = self.c.line()?;
                memo_key(&self.c, line)?
            }
            _ => self.memo.len() as u64, // MEMOIZE
        };
        if matches!(op, b'q' | b'r' | b'p' | 0x94) {
            let top = self.top()?;
            self.memo.insert(key, top);
            return Ok(None);
        }
        let id = self.memo.get(&key).copied();
        id.map(Some).ok_or_else(|| self.c.err(format!("malformed pickle: memo {key} was never set")))
    }

    /// Objects, globals, sets and extensions: their arguments are consumed, the result is
    /// opaque (`Node::Other`).
    fn object(&mut self, op: u8) -> Result<Option<Id>, PickleError> {
        match op {
            0x8f => {}
            b'c' => {
                self.c.line()?;
                self.c.line()?;
            }
            0x93 | b'R' | 0x81 => drop(self.pop_n(2)?),
            0x92 => drop(self.pop_n(3)?),
            b'i' => {
                self.c.line()?;
                self.c.line()?;
                self.pop_mark()?;
            }
            b'o' | 0x91 => drop(self.pop_mark()?),
            b'P' => drop(self.c.line()?),
            b'Q' => drop(self.pop()?),
            0x82 => drop(self.c.take(1)?),
            0x83 => drop(self.c.take(2)?),
            0x84 => drop(self.c.take(4)?),
            0x97 => {}
            // ADDITEMS (to a set), BUILD (sets the state of the object below), READONLY_BUFFER:
            // nothing to keep, nothing pushed.
            0x90 => {
                self.pop_mark()?;
                self.top()?;
                return Ok(None);
            }
            b'b' => {
                self.pop()?;
                self.top()?;
                return Ok(None);
            }
            0x98 => {
                self.top()?;
                return Ok(None);
            }
            _ => return Err(self.c.err(format!("not a pickle: unknown opcode 0x{op:02x}"))),
        }
        self.new_node(Node::Other).map(Some)
    }
}

/// The value of a scalar opcode (none, bool, number, text, bytes), its argument read; `None`
/// for other opcodes (nothing read).
fn scalar<'a>(op: u8, c: &mut Cursor<'a>) -> Result<Option<Node<'a>>, PickleError> {
    Ok(Some(match op {
        b'N' => Node::None,
        0x88 => Node::Bool(true),
        0x89 => Node::Bool(false),
        b'J' => Node::Int(i128::from(c.uint(4)? as u32 as i32)),
        b'K' => Node::Int(i128::from(c.uint(1)?)),
        b'M' => Node::Int(i128::from(c.uint(2)?)),
        0x8a => signed_le(c.counted(1)?).map_or(Node::Other, Node::Int),
        0x8b => signed_le(c.counted(4)?).map_or(Node::Other, Node::Int),
        b'G' => Node::Float(f64::from_be_bytes(c.uint(8)?.to_le_bytes())),
        b'I' | b'L' => {
            let line = c.line()?;
            let text = std::str::from_utf8(line).unwrap_or("").trim().trim_end_matches('L');
            match text {
                "00" => Node::Bool(false),
                "01" => Node::Bool(true),
                t => t.parse().map(Node::Int).map_err(|_| c.err("malformed protocol-0 integer"))?,
            }
        }
        b'F' => {
            let line = c.line()?;
            let f = std::str::from_utf8(line).ok().and_then(|t| t.trim().parse().ok());
            Node::Float(f.ok_or_else(|| c.err("malformed protocol-0 float"))?)
        }
        0x8c => Node::Text(c.counted(1)?),
        b'X' => Node::Text(c.counted(4)?),
        0x8d => Node::Text(c.counted(8)?),
        b'U' | b'C' => Node::Bytes(c.counted(1)?),
        b'T' | b'B' => Node::Bytes(c.counted(4)?),
        0x8e | 0x96 => Node::Bytes(c.counted(8)?),
        b'S' | b'V' => Node::Text(c.line()?),
        _ => return Ok(None),
    }))
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
