//! `torch.export` programs (`.pt2`, an `ExportedProgram` saved by `torch.export.save`): read from
//! the archive's JSON, checked, and turned into what the estimator's C++ runs
//! (`gpu-mem-track-estimate-sys/csrc/exported_program.cpp`): placeholders with their recorded sizes
//! and dtypes (the weights are never read) and ATen calls, each value freed after its last use.
//!
//! Everything here is outside input: a malformed program is an [`Error::Input`] naming what is
//! wrong, never a panic. Dynamic shapes are taken for the first user input only (the run's input
//! replaces it); higher-order ops (`torch.cond`, wrapped subgraphs) are refused by name.
use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;

use crate::error::{Error, Result};

/// Whether a model file is a `torch.export` archive (by its `.pt2` extension) rather than
/// TorchScript.
pub(crate) fn is_exported_program(path: &Path) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case("pt2"))
}

/// A placeholder's role (`gmt_exported_role`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    UserInput = 0,
    Parameter = 1,
    Buffer = 2,
    Constant = 3,
}

/// A program input: what the C++ makes for it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Placeholder {
    pub name: String,
    pub role: Role,
    pub sizes: Vec<i64>,
    pub strides: Vec<i64>,
    /// c10::ScalarType.
    pub dtype: i32,
    pub requires_grad: bool,
    /// Some size was symbolic (a dynamic dimension): `sizes` holds 1 there.
    pub dynamic: bool,
}

/// A node argument, as `gmt_exported_arg` carries it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Arg {
    None,
    Tensor(i64),
    Tensors(Vec<i64>),
    OptionalTensors(Vec<i64>),
    Int(i64),
    Ints(Vec<i64>),
    Float(f64),
    Floats(Vec<f64>),
    Bool(bool),
    Bools(Vec<bool>),
    Str(String),
    ScalarType(i32),
    MemoryFormat(i32),
    Layout(i32),
    Device(String, i64),
}

/// One ATen call.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    /// `aten::conv2d`.
    pub op: String,
    /// `default`, `Tensor`, ...
    pub overload: String,
    pub args: Vec<(String, Arg)>,
    /// (return index, list element or -1, value).
    pub outputs: Vec<[i64; 3]>,
    /// Values whose last use this node is.
    pub frees: Vec<i64>,
    /// Values defined once it has run.
    pub values: i64,
}

/// A program ready for the C++.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Program {
    pub placeholders: Vec<Placeholder>,
    pub nodes: Vec<Node>,
    /// The user outputs (what a training step sums into its loss).
    pub outputs: Vec<i64>,
}

impl Program {
    /// The first user input, which the run's input replaces.
    pub(crate) fn first_input(&self) -> Option<&Placeholder> {
        self.placeholders.iter().find(|p| p.role == Role::UserInput)
    }
}

/// The program of an archive's JSON (`models/*.json`); `path` names the file in errors.
///
/// # Errors
/// [`Error::Input`] for JSON that is not a `torch.export` program, or one this estimator cannot run
/// (what and where).
pub(crate) fn parse(json: &str, path: &Path) -> Result<Program> {
    let bad = |what: String| Error::Input(format!("{}: {what}", path.display()));
    let root: Value =
        serde_json::from_str(json).map_err(|e| bad(format!("not a torch.export program ({e})")))?;
    let graph_module =
        root.get("graph_module").ok_or_else(|| bad("no graph_module: not a torch.export program".into()))?;
    let graph = field(graph_module, "graph").map_err(&bad)?;
    let signature = field(graph_module, "signature").map_err(&bad)?;
    let mut b =
        Builder { ids: HashMap::new(), next: 0, tensor_values: field(graph, "tensor_values").map_err(&bad)? };
    let placeholders = b.placeholders(graph, signature).map_err(&bad)?;
    let nodes_json = array(graph, "nodes").map_err(&bad)?;
    let mut nodes = Vec::with_capacity(nodes_json.len());
    for (i, n) in nodes_json.iter().enumerate() {
        nodes.push(b.node(n).map_err(|e| bad(format!("node {i}: {e}")))?);
    }
    let outputs = b.outputs(graph, signature).map_err(&bad)?;
    let mut program = Program { placeholders, nodes, outputs };
    free_after_last_use(&mut program);
    Ok(program)
}

fn field<'a>(v: &'a Value, name: &str) -> std::result::Result<&'a Value, String> {
    v.get(name).ok_or_else(|| format!("no `{name}`"))
}

fn array<'a>(v: &'a Value, name: &str) -> std::result::Result<&'a Vec<Value>, String> {
    field(v, name)?.as_array().ok_or_else(|| format!("`{name}` is not a list"))
}

fn int(v: &Value, what: &str) -> std::result::Result<i64, String> {
    v.as_i64().ok_or_else(|| format!("{what}: not an integer ({v})"))
}

/// The one key of a JSON union (`{"as_tensor": ...}`) and its value.
fn union(v: &Value) -> std::result::Result<(&str, &Value), String> {
    let o = v.as_object().ok_or_else(|| format!("expected an object, found {v}"))?;
    let mut it = o.iter();
    match (it.next(), it.next()) {
        (Some((k, v)), None) => Ok((k.as_str(), v)),
        _ => Err(format!("expected one of a union's fields, found {}", o.len())),
    }
}

/// A `SymInt` that must be concrete (`{"as_int": 4}`).
fn sym_int(v: &Value, what: &str) -> std::result::Result<i64, String> {
    match union(v)? {
        ("as_int", n) => int(n, what),
        (kind, _) => Err(format!(
            "{what} is symbolic ({kind}): export with static shapes, or give it as the first input"
        )),
    }
}

/// torch.export's ScalarType codes (torch/_export/serde/schema.py) as c10's.
fn scalar_type(code: i64) -> std::result::Result<i32, String> {
    Ok(match code {
        1 => 0,   // uint8
        2 => 1,   // int8
        3 => 2,   // int16
        4 => 3,   // int32
        5 => 4,   // int64
        6 => 5,   // float16
        7 => 6,   // float32
        8 => 7,   // float64
        9 => 8,   // complex32
        10 => 9,  // complex64
        11 => 10, // complex128
        12 => 11, // bool
        13 => 15, // bfloat16
        28 => 27, // uint16
        29 => 24, // float8_e4m3fn
        30 => 23, // float8_e5m2
        31 => 26, // float8_e4m3fnuz
        32 => 25, // float8_e5m2fnuz
        34 => 28, // uint32
        35 => 29, // uint64
        other => return Err(format!("dtype code {other} is not one this estimator knows")),
    })
}

fn memory_format(code: i64) -> std::result::Result<i32, String> {
    Ok(match code {
        1 => 0, // contiguous
        2 => 2, // channels_last
        3 => 3, // channels_last_3d
        4 => 1, // preserve
        other => return Err(format!("memory format code {other} is not one this estimator knows")),
    })
}

fn layout(code: i64) -> std::result::Result<i32, String> {
    match code {
        7 => Ok(0), // strided
        other => Err(format!("layout code {other}: only strided tensors are estimated")),
    }
}

struct Builder<'a> {
    ids: HashMap<String, i64>,
    next: i64,
    tensor_values: &'a Value,
}

impl Builder<'_> {
    fn define(&mut self, name: &str) -> std::result::Result<i64, String> {
        if self.ids.contains_key(name) {
            return Err(format!("value `{name}` is defined twice"));
        }
        let id = self.next;
        self.next += 1;
        self.ids.insert(name.to_owned(), id);
        Ok(id)
    }

    fn use_of(&self, name: &Value) -> std::result::Result<i64, String> {
        let name = name
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("a tensor without a name: {name}"))?;
        self.ids.get(name).copied().ok_or_else(|| format!("value `{name}` is used before it is defined"))
    }

    fn placeholders(
        &mut self,
        graph: &Value,
        signature: &Value,
    ) -> std::result::Result<Vec<Placeholder>, String> {
        let inputs = array(graph, "inputs")?;
        let specs = array(signature, "input_specs")?;
        if inputs.len() != specs.len() {
            return Err(format!("{} graph inputs but {} input specs", inputs.len(), specs.len()));
        }
        let mut out = Vec::with_capacity(inputs.len());
        let mut first_user = true;
        for (input, spec) in inputs.iter().zip(specs) {
            let (kind, _) = union(spec)?;
            let role = match kind {
                "user_input" => Role::UserInput,
                "parameter" => Role::Parameter,
                "buffer" => Role::Buffer,
                "tensor_constant" => Role::Constant,
                other => return Err(format!("an input of kind `{other}`, which this estimator cannot make")),
            };
            let (arg, value) = union(input)?;
            if arg != "as_tensor" {
                return Err(format!("a {kind} that is not a tensor ({arg}): export with tensor inputs only"));
            }
            let name = value.get("name").and_then(Value::as_str).ok_or("an input without a name")?.to_owned();
            let meta = field(self.tensor_values, &name)
                .map_err(|_| format!("no tensor_values entry for input `{name}`"))?;
            let dtype = scalar_type(int(field(meta, "dtype")?, "dtype")?)?;
            // The first user input is replaced by the run's own input: its sizes may be symbolic.
            let free_sizes = role == Role::UserInput && first_user;
            let mut dynamic = false;
            let mut dims = |key: &str| -> std::result::Result<Vec<i64>, String> {
                array(meta, key)?
                    .iter()
                    .map(|d| match sym_int(d, &name) {
                        Err(_) if free_sizes => {
                            dynamic = true;
                            Ok(1)
                        }
                        r => r,
                    })
                    .collect()
            };
            let (sizes, strides) = (dims("sizes")?, dims("strides")?);
            if sizes.len() != strides.len() || sizes.iter().any(|&s| s < 0) || strides.iter().any(|&s| s < 0)
            {
                return Err(format!("input `{name}`: sizes {sizes:?} and strides {strides:?} do not fit"));
            }
            if let Some(l) = meta.get("layout") {
                layout(int(l, "layout")?)?;
            }
            let requires_grad = meta.get("requires_grad").and_then(Value::as_bool).unwrap_or(false);
            if role == Role::UserInput {
                first_user = false;
            }
            self.define(&name)?;
            out.push(Placeholder { name, role, sizes, strides, dtype, requires_grad, dynamic });
        }
        Ok(out)
    }

    fn node(&mut self, n: &Value) -> std::result::Result<Node, String> {
        let target = field(n, "target")?.as_str().ok_or("a target that is not a string")?;
        let (op, overload) = op_of(target)?;
        let mut args = Vec::new();
        for input in array(n, "inputs")? {
            let name = field(input, "name")?.as_str().ok_or("an argument name that is not a string")?;
            let arg =
                self.arg(field(input, "arg")?).map_err(|e| format!("{target}, argument `{name}`: {e}"))?;
            args.push((name.to_owned(), arg));
        }
        let mut outputs = Vec::new();
        for (ret, o) in array(n, "outputs")?.iter().enumerate() {
            let ret = i64::try_from(ret).map_err(|_| "too many outputs")?;
            match union(o)? {
                ("as_tensor", t) => {
                    let name = t.get("name").and_then(Value::as_str).ok_or("an output without a name")?;
                    outputs.push([ret, -1, self.define(name)?]);
                }
                ("as_tensors", ts) => {
                    for (j, t) in ts.as_array().ok_or("as_tensors is not a list")?.iter().enumerate() {
                        let name = t.get("name").and_then(Value::as_str).ok_or("an output without a name")?;
                        let j = i64::try_from(j).map_err(|_| "too many outputs")?;
                        outputs.push([ret, j, self.define(name)?]);
                    }
                }
                ("as_none", _) => {}
                (kind, _) => {
                    return Err(format!("{target} returns a {kind}, which this estimator cannot follow"))
                }
            }
        }
        Ok(Node { op, overload, args, outputs, frees: Vec::new(), values: self.next })
    }

    fn arg(&self, a: &Value) -> std::result::Result<Arg, String> {
        let ints = |v: &Value| -> std::result::Result<Vec<i64>, String> {
            v.as_array().ok_or("not a list")?.iter().map(|x| int(x, "list element")).collect()
        };
        let (kind, v) = union(a)?;
        Ok(match kind {
            "as_none" => Arg::None,
            "as_tensor" => Arg::Tensor(self.use_of(v)?),
            "as_tensors" => Arg::Tensors(
                v.as_array()
                    .ok_or("not a list")?
                    .iter()
                    .map(|t| self.use_of(t))
                    .collect::<std::result::Result<_, _>>()?,
            ),
            "as_optional_tensors" => Arg::OptionalTensors(
                v.as_array()
                    .ok_or("not a list")?
                    .iter()
                    .map(|t| match union(t)? {
                        ("as_tensor", t) => self.use_of(t),
                        ("as_none", _) => Ok(-1),
                        (k, _) => Err(format!("an optional tensor of kind {k}")),
                    })
                    .collect::<std::result::Result<_, _>>()?,
            ),
            "as_optional_tensor" => match union(v)? {
                ("as_tensor", t) => Arg::Tensor(self.use_of(t)?),
                ("as_none", _) => Arg::None,
                (k, _) => return Err(format!("an optional tensor of kind {k}")),
            },
            "as_int" => Arg::Int(int(v, "int")?),
            "as_ints" => Arg::Ints(ints(v)?),
            "as_sym_int" => Arg::Int(sym_int(v, "an int argument")?),
            "as_sym_ints" => Arg::Ints(
                v.as_array()
                    .ok_or("not a list")?
                    .iter()
                    .map(|x| sym_int(x, "an int argument"))
                    .collect::<std::result::Result<_, _>>()?,
            ),
            "as_float" => Arg::Float(v.as_f64().ok_or("not a number")?),
            "as_floats" => Arg::Floats(
                v.as_array()
                    .ok_or("not a list")?
                    .iter()
                    .map(|x| x.as_f64().ok_or("not a number"))
                    .collect::<std::result::Result<_, _>>()?,
            ),
            "as_sym_float" => match union(v)? {
                ("as_float", f) => Arg::Float(f.as_f64().ok_or("not a number")?),
                (k, _) => return Err(format!("a symbolic float ({k})")),
            },
            "as_bool" => Arg::Bool(v.as_bool().ok_or("not a bool")?),
            "as_bools" => Arg::Bools(
                v.as_array()
                    .ok_or("not a list")?
                    .iter()
                    .map(|x| x.as_bool().ok_or("not a bool"))
                    .collect::<std::result::Result<_, _>>()?,
            ),
            "as_sym_bool" => match union(v)? {
                ("as_bool", b) => Arg::Bool(b.as_bool().ok_or("not a bool")?),
                (k, _) => return Err(format!("a symbolic bool ({k})")),
            },
            "as_string" => Arg::Str(v.as_str().ok_or("not a string")?.to_owned()),
            "as_scalar_type" => Arg::ScalarType(scalar_type(int(v, "dtype")?)?),
            "as_memory_format" => Arg::MemoryFormat(memory_format(int(v, "memory format")?)?),
            "as_layout" => Arg::Layout(layout(int(v, "layout")?)?),
            "as_device" => Arg::Device(
                field(v, "type")?.as_str().ok_or("a device type that is not a string")?.to_owned(),
                v.get("index").and_then(Value::as_i64).unwrap_or(-1),
            ),
            other => return Err(format!("an argument of kind `{other}`, which this estimator cannot pass")),
        })
    }

    fn outputs(&self, graph: &Value, signature: &Value) -> std::result::Result<Vec<i64>, String> {
        let outputs = array(graph, "outputs")?;
        let specs = array(signature, "output_specs")?;
        let mut out = Vec::new();
        for (i, o) in outputs.iter().enumerate() {
            let user = specs
                .get(i)
                .map(union)
                .transpose()?
                .is_none_or(|(k, _)| k == "user_output" || k == "loss_output");
            if let (true, ("as_tensor", t)) = (user, union(o)?) {
                out.push(self.use_of(t)?);
            }
        }
        Ok(out)
    }
}

/// `torch.ops.aten.conv2d.default` as (`aten::conv2d`, `default`).
fn op_of(target: &str) -> std::result::Result<(String, String), String> {
    let rest = target.strip_prefix("torch.ops.").ok_or_else(|| {
        format!("`{target}` is not an operator call (torch.ops.*): this estimator runs ATen graphs")
    })?;
    let mut parts = rest.splitn(3, '.');
    match (parts.next(), parts.next(), parts.next()) {
        (Some("higher_order"), Some(op), _) => {
            Err(format!("higher-order op `{op}` (control flow or a wrapped subgraph) is not supported"))
        }
        (Some(ns), Some(op), Some(overload)) if !ns.is_empty() && !op.is_empty() && !overload.is_empty() => {
            Ok((format!("{ns}::{op}"), overload.to_owned()))
        }
        _ => Err(format!("`{target}` is not namespace.op.overload")),
    }
}

/// Each node frees the values it is the last to use (and those it defines that nothing uses);
/// placeholders and the program's outputs are never freed.
fn free_after_last_use(p: &mut Program) {
    let first_defined = i64::try_from(p.placeholders.len()).unwrap_or(i64::MAX);
    let mut last: HashMap<i64, usize> = HashMap::new();
    for (i, n) in p.nodes.iter().enumerate() {
        for o in &n.outputs {
            last.insert(o[2], i);
        }
        for (_, a) in &n.args {
            let used: &[i64] = match a {
                Arg::Tensor(id) => std::slice::from_ref(id),
                Arg::Tensors(ids) | Arg::OptionalTensors(ids) => ids,
                _ => &[],
            };
            for &id in used {
                last.insert(id, i);
            }
        }
    }
    for out in &p.outputs {
        last.remove(out);
    }
    let mut frees: Vec<(usize, i64)> =
        last.into_iter().filter(|&(id, _)| id >= first_defined && id >= 0).map(|(id, at)| (at, id)).collect();
    frees.sort_unstable();
    for (at, id) in frees {
        p.nodes[at].frees.push(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SMALL: &str = r#"{"graph_module": {"graph": {
        "inputs": [{"as_tensor": {"name": "p_w"}}, {"as_tensor": {"name": "x"}}],
        "outputs": [{"as_tensor": {"name": "relu"}}],
        "nodes": [
          {"target": "torch.ops.aten.linear.default", "inputs": [
             {"name": "input", "arg": {"as_tensor": {"name": "x"}}, "kind": 1},
             {"name": "weight", "arg": {"as_tensor": {"name": "p_w"}}, "kind": 1}],
           "outputs": [{"as_tensor": {"name": "linear"}}]},
          {"target": "torch.ops.aten.relu.default", "inputs": [
             {"name": "self", "arg": {"as_tensor": {"name": "linear"}}, "kind": 1}],
           "outputs": [{"as_tensor": {"name": "relu"}}]}],
        "tensor_values": {
          "p_w": {"dtype": 7, "sizes": [{"as_int": 4}, {"as_int": 8}], "strides": [{"as_int": 8}, {"as_int": 1}], "requires_grad": true, "layout": 7},
          "x": {"dtype": 7, "sizes": [{"as_expr": {"expr_str": "s0"}}, {"as_int": 8}], "strides": [{"as_int": 8}, {"as_int": 1}], "layout": 7}}},
      "signature": {
        "input_specs": [{"parameter": {"arg": {"name": "p_w"}, "parameter_name": "w"}}, {"user_input": {"arg": {"as_tensor": {"name": "x"}}}}],
        "output_specs": [{"user_output": {"arg": {"as_tensor": {"name": "relu"}}}}]}}}"#;

    #[test]
    fn a_small_program_reads_with_its_roles_dtypes_and_frees() {
        let p = parse(SMALL, Path::new("m.pt2")).unwrap();
        assert_eq!(p.placeholders[0].role, Role::Parameter);
        assert_eq!((p.placeholders[0].dtype, p.placeholders[0].sizes.clone()), (6, vec![4, 8]));
        assert!(p.placeholders[0].requires_grad);
        // The first user input may be symbolic: the run's input replaces it.
        assert_eq!(p.first_input().map(|i| (i.name.as_str(), i.dynamic)), Some(("x", true)));
        assert!(!p.placeholders[0].dynamic);
        assert_eq!((p.nodes[0].op.as_str(), p.nodes[0].overload.as_str()), ("aten::linear", "default"));
        assert_eq!(p.nodes[0].args[0], ("input".into(), Arg::Tensor(1)));
        // `linear` (value 2) is last used by relu; relu (3) is the output, never freed.
        assert_eq!((p.nodes[0].frees.clone(), p.nodes[1].frees.clone()), (vec![], vec![2]));
        assert_eq!(p.outputs, vec![3]);
    }

    #[test]
    fn what_cannot_run_is_named() {
        let cases = [
            (
                SMALL.replace("torch.ops.aten.relu.default", "torch.ops.higher_order.cond"),
                "higher-order op `cond`",
            ),
            (SMALL.replace("torch.ops.aten.relu.default", "_operator.getitem"), "not an operator call"),
            (
                SMALL.replace(r#"{"as_int": 4}, {"as_int": 8}]"#, r#"{"as_expr": {}}, {"as_int": 8}]"#),
                "symbolic",
            ),
            (
                SMALL.replace(r#""name": "linear"}}, "kind""#, r#""name": "nope"}}, "kind""#),
                "`nope` is used before",
            ),
            (
                SMALL.replace(
                    r#""dtype": 7, "sizes": [{"as_int": 4}"#,
                    r#""dtype": 99, "sizes": [{"as_int": 4}"#,
                ),
                "dtype code 99",
            ),
            ("{}".to_owned(), "no graph_module"),
            ("not json".to_owned(), "not a torch.export program"),
        ];
        for (json, expected) in cases {
            let e = parse(&json, Path::new("m.pt2")).unwrap_err().to_string();
            assert!(e.contains(expected) && e.contains("m.pt2"), "{expected:?} not in {e:?}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]
        /// Truncated, spliced and arbitrary inputs give an error or a program, never a panic.
        #[test]
        fn malformed_programs_never_panic(cut in 0usize..2000, insert in ".{0,12}", at in 0usize..2000, junk in ".{0,64}") {
            let mut s: String = SMALL.chars().take(cut).collect();
            let at = at.min(s.len());
            if s.is_char_boundary(at) {
                s.insert_str(at, &insert);
            }
            let _ = parse(&s, Path::new("m.pt2"));
            let _ = parse(&junk, Path::new("m.pt2"));
            let spliced = SMALL.replacen("4", &insert, 1);
            let _ = parse(&spliced, Path::new("m.pt2"));
        }
    }
}
