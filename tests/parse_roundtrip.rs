//! The log parses back: our logs round-trip byte for byte, the Python tool's logs are read, and
//! no input makes the parser panic.
mod common;

use common::cpu_tracker;
use gpu_mem_track::log::format::{group_mib, MIB};
use gpu_mem_track::log::{
    parse_log, parse_log_bytes, parse_log_file, parse_log_lenient, AtLine, GroupLine, LogBlock, LogHeader,
    MemoryField, ParsedLog, SourceLocation, ALLOCATED, TENSOR_USED,
};
use gpu_mem_track::{track, Sign, TensorClass, TensorRole};
use proptest::prelude::*;
use tch::{Device, Kind, Tensor};

#[test]
fn our_log_round_trips_and_matches_the_track_points() {
    let dir = tempfile::tempdir().unwrap();
    let t = cpu_tracker(dir.path());
    let mut points = vec![track!(t).unwrap()];
    let mut keep = Vec::new();
    for i in 1..6i64 {
        keep.push(Tensor::zeros([i * 100, 3], (Kind::Float, Device::Cpu)));
        keep.push(Tensor::ones([i], (Kind::BFloat16, Device::Cpu)));
        if i % 2 == 0 {
            drop(keep.remove(0));
        }
        points.push(track!(t).unwrap());
    }
    let text = std::fs::read_to_string(t.log_path()).unwrap();
    let log = parse_log(&text).unwrap();
    assert_eq!(log.render(), text, "render(parse(log)) is the log");
    assert_eq!(log.blocks.len(), points.len());
    for (block, point) in log.blocks.iter().zip(&points) {
        assert_eq!(block.changes.len(), point.changes.len());
        assert_eq!(block.at.location.line, point.site.line);
        assert_eq!(block.at.location.function, "our_log_round_trips_and_matches_the_track_points");
        assert_eq!(block.at.location.file, "tests/parse_roundtrip.rs");
        let expected = (point.tensor_bytes as f64 / MIB * 10.0).round() / 10.0;
        assert_eq!(block.at.field(TENSOR_USED), Some(expected));
        for (line, change) in block.changes.iter().zip(&point.changes) {
            assert_eq!(line.sign, change.sign);
            assert_eq!(line.count, change.count);
            assert_eq!(line.shape, change.key.shape.to_vec());
            assert_eq!(group_mib(line.memory_mib), group_mib(change.bytes as f64 / MIB));
        }
    }
    assert!(log.blocks[1].changes.iter().any(|c| c.dtype == "torch.bfloat16"));
}

#[test]
fn reads_a_log_written_by_pytorch_memory_utils() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/pytorch_memory_utils.txt");
    let log = parse_log_file(path).unwrap();
    assert_eq!(log.header.timestamp, "30-Apr-21-20:25:29");
    assert_eq!(log.blocks.len(), 4);
    let b = &log.blocks[1];
    assert_eq!(b.changes.len(), 7);
    assert_eq!(b.changes[4].count, 3);
    assert_eq!(b.changes[4].shape, vec![256, 256, 3, 3]);
    assert_eq!(b.changes[4].memory_mib, 6.75);
    assert_eq!(b.changes[6].shape, Vec::<i64>::new());
    assert_eq!(b.changes[0].class, TensorClass::Parameter);
    assert_eq!(b.at.field(ALLOCATED), Some(76.4));
    // Its set-difference bug: a group going 1 -> 2 prints `+ 2` and `- 1`; both are read as written.
    let b = &log.blocks[2];
    assert_eq!((b.changes[0].sign, b.changes[0].count), (Sign::Plus, 2));
    assert_eq!((b.changes[1].sign, b.changes[1].count), (Sign::Minus, 1));
    assert_eq!(b.changes[1].dtype, "torch.float32", "trailing space of `-` lines is dropped");
    assert_eq!(log.blocks[3].at.location.function, "train");
    assert_eq!(log.blocks[3].line_no, 23);
}

#[test]
fn file_errors_name_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.txt");
    let e = parse_log_file(&missing).unwrap_err();
    assert!(matches!(e, gpu_mem_track::LogError::LogRead { .. }));
    assert!(e.to_string().contains("nope.txt"), "{e}");

    let bad = dir.path().join("bad.txt");
    std::fs::write(&bad, "GPU Memory Track | t | Total Tensor Used Memory:0.0    Mb\n\n+ | oops\n").unwrap();
    let e = parse_log_file(&bad).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("bad.txt") && msg.contains("line 3"), "{msg}");

    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    assert!(parse_log_file(&empty).unwrap_err().to_string().contains("empty file"));
}

fn arb_group_line() -> impl Strategy<Value = GroupLine> {
    (
        any::<bool>(),
        1u64..10_000,
        prop::collection::vec(0i64..100_000, 0..5),
        0u64..(1 << 40),
        any::<bool>(),
        prop::sample::select(vec!["torch.float32", "torch.int64", "torch.bool", "torch.bfloat16"]),
        prop::option::of("aten::[a-z_]{1,30}(\\.[a-z]{1,8})?"),
        -3i64..4,
        prop::option::of(prop::sample::select(vec![
            "gradient",
            "optimizer state",
            "internal to aten::max_pool2d",
            "inductor buffer",
        ])),
    )
        .prop_map(|(plus, count, shape, bytes, param, dtype, op, views, role)| GroupLine {
            sign: if plus { Sign::Plus } else { Sign::Minus },
            count,
            shape,
            // What the writer prints, read back: the parser must reproduce it exactly.
            memory_mib: group_mib(bytes as f64 / MIB).parse().unwrap(),
            class: if param { TensorClass::Parameter } else { TensorClass::Tensor },
            dtype: dtype.to_owned(),
            role: role.and_then(TensorRole::from_label),
            op,
            views,
        })
}

fn arb_field(label: &'static str) -> impl Strategy<Value = MemoryField> {
    (0u64..(1 << 45))
        .prop_map(move |b| MemoryField { label: label.into(), mib: ((b as f64 / MIB) * 10.0).round() / 10.0 })
}

fn arb_block() -> impl Strategy<Value = LogBlock> {
    (
        prop::collection::vec(arb_group_line(), 0..6),
        "[a-z/_ ]{1,30}\\.rs",
        1u32..100_000,
        "[a-zA-Z_:{}<>]{1,40}",
        arb_field(TENSOR_USED),
        arb_field(ALLOCATED),
        prop::option::of(arb_field("Reserved Memory")),
        prop::collection::vec("[a-zA-Z0-9 .:%()*,!|-]{0,80}", 0..4),
    )
        .prop_map(|(changes, file, line, function, a, b, c, notes)| LogBlock {
            changes,
            notes,
            at: AtLine {
                location: SourceLocation { file, line, function },
                fields: [Some(a), Some(b), c].into_iter().flatten().collect(),
            },
            line_no: 0,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn rendered_logs_parse_back_to_the_same_values(blocks in prop::collection::vec(arb_block(), 0..8)) {
        let log = ParsedLog {
            header: LogHeader { timestamp: "01-Jan-26-00:00:00".into(), fields: vec![MemoryField { label: TENSOR_USED.into(), mib: 0.0 }] },
            blocks,
            trailing_changes: vec![],
        };
        let text = log.render();
        let mut back = parse_log(&text).unwrap();
        for b in &mut back.blocks { b.line_no = 0; }
        prop_assert_eq!(&back, &log);
        prop_assert_eq!(back.render(), text);
    }

    #[test]
    fn the_parser_never_panics_on_garbage(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        let _ = parse_log_bytes(&bytes);
        let _ = parse_log_lenient(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn the_parser_never_panics_on_near_misses(lines in prop::collection::vec(
        prop::sample::select(vec![
            "+ |", "- | 1 * Size:", "+ | 1 * Size:(3,) | Memory: 1 M | <class 'x'> |", "At ", "At x line : f",
            "At x line 3: f Total Tensor Used Memory:", "At f Total Tensor Used Memory:1Mb", "Mb", ":", " | ", "",
            "+ | 1 * Size:((3,) | Memory: 1 M | <class 'x'> | d", "+ | -1 * Size:(3,) | Memory: 1 M | <class 'x'> | d",
        ]), 0..12)) {
        let text = format!("GPU Memory Track | t | Total Tensor Used Memory:0.0 Mb\n{}", lines.join("\n"));
        let _ = parse_log(&text);
        let (log, _errors) = parse_log_lenient(&text);
        prop_assert!(log.is_some());
    }
}
