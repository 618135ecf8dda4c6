//! Property tests: the parser, the streaming reader and `report` on arbitrary bytes and on
//! mutated real logs never panic, always end, and give bounded output.
use std::path::Path;

use gpu_mem_track_log::log::{parse_log, parse_log_bytes, parse_log_lenient, LogEvent, LogReader};
use gpu_mem_track_log::report::{analyse, analyse_reader, combine, render_text};
use proptest::prelude::*;

const FIXTURE: &str = include_str!("../../tests/fixtures/pytorch_memory_utils.txt");

/// A log of ours: parameters, then a loop whose activations come and go and one list that grows.
fn our_log() -> String {
    let mut s = String::from(
        "GPU Memory Track | 01-Jan-24-00:00:00 | Total Tensor Used Memory:0.0    Mb Total Allocated Memory:0.0    Mb\n\n",
    );
    let at = |line: u32, mib: f64| {
        format!(
            "\nAt {:<50} Total Tensor Used Memory:{mib:<7.1}Mb Total Allocated Memory:{mib:<7.1}Mb Peak Allocated Memory:{mib:<7.1}Mb\n\n",
            format!("examples/train.rs line {line}: train_step")
        )
    };
    s += "+ | 1 * Size:(64, 1568)           | Memory: 0.3828 M | <class 'torch.nn.parameter.Parameter'> | torch.float32\n";
    s += &at(75, 0.4);
    for step in 0..4 {
        s += "+ | 1 * Size:(128, 16, 28, 28)    | Memory: 6.125 M | <class 'torch.Tensor'> | torch.float32\n";
        s += "+ | 1 * Size:()                   | Memory: 0.0 M | <class 'torch.Tensor'> | torch.float32\n";
        s += &at(39, 6.5 + f64::from(step));
        s += "- | 1 * Size:(128, 16, 28, 28)    | Memory: 6.125 M | <class 'torch.Tensor'> | torch.float32\n";
        s += &at(44, 0.4 + f64::from(step));
    }
    s
}

/// Every way of reading `bytes`; panics only if a bound is broken.
fn read_every_way(bytes: &[u8]) {
    let _ = parse_log_bytes(bytes);
    let text = String::from_utf8_lossy(bytes);
    let _ = parse_log(&text);
    let (log, errors) = parse_log_lenient(&text);
    let mut streamed_blocks = 0;
    for event in LogReader::new(bytes) {
        match event {
            Ok(LogEvent::Block(_)) => streamed_blocks += 1,
            Ok(_) => {}
            Err(e) => assert!(e.to_string().len() < 1000, "{e}"),
        }
    }
    let streamed = analyse_reader(Path::new("fuzz.txt"), bytes, 10);
    if let Some(log) = log {
        assert_eq!(streamed_blocks, log.blocks.len());
        let r = analyse(Path::new("fuzz.txt"), &log, errors.iter().map(|e| e.to_string()).collect(), 10);
        let streamed = streamed.expect("a header was found");
        assert_eq!(streamed.points, r.points);
        assert_eq!(streamed.leak_suspects_total, r.leak_suspects_total);
        let c = combine(vec![r, streamed]);
        let text = render_text(&c);
        let json = serde_json::to_string_pretty(&c).unwrap();
        assert!(text.len() < 1 << 20 && json.len() < 1 << 20, "{} / {} bytes", text.len(), json.len());
        assert!(text.lines().all(|l| l.len() < 4096), "a long line");
    } else {
        assert!(streamed.is_err());
    }
}

/// A real log with its lines shuffled, cut, duplicated, blanked or overwritten.
fn mutated(base: &'static str) -> impl Strategy<Value = Vec<u8>> {
    let lines: Vec<&'static str> = base.split_inclusive('\n').collect();
    let n = lines.len();
    prop::collection::vec((0..n, 0..6u8, any::<u8>(), 0..200usize), 1..12).prop_map(move |edits| {
        let mut lines: Vec<Vec<u8>> = lines.iter().map(|l| l.as_bytes().to_vec()).collect();
        for (i, kind, byte, pos) in edits {
            let i = i % lines.len().max(1);
            if lines.is_empty() {
                break;
            }
            match kind {
                0 => {
                    lines.remove(i);
                }
                1 => {
                    let l = lines[i].clone();
                    for _ in 0..(pos % 50) {
                        lines.push(l.clone());
                    }
                }
                2 => {
                    let l = &mut lines[i];
                    let p = pos % l.len().max(1);
                    l.truncate(p);
                }
                3 => {
                    let l = &mut lines[i];
                    let p = pos % l.len().max(1);
                    if p < l.len() {
                        l[p] = byte;
                    }
                }
                4 => {
                    // Numbers that do not fit, or nearly do.
                    let l = String::from_utf8_lossy(&lines[i]).into_owned();
                    let big =
                        ["18446744073709551615", "9223372036854775807", "-1", "0", "1e308", "inf"][pos % 6];
                    lines[i] = l.replacen(|c: char| c.is_ascii_digit(), big, 1).into_bytes();
                }
                _ => {
                    let j = pos % lines.len();
                    lines.swap(i, j);
                }
            }
        }
        lines.concat()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..2000)) {
        read_every_way(&bytes);
    }

    #[test]
    fn arbitrary_bytes_after_a_header(bytes in prop::collection::vec(any::<u8>(), 0..2000)) {
        let mut b = b"GPU Memory Track | t | Total Tensor Used Memory:0.0    Mb\n".to_vec();
        b.extend(bytes);
        read_every_way(&b);
    }

    #[test]
    fn mutated_python_log(bytes in mutated(FIXTURE)) {
        read_every_way(&bytes);
    }

    #[test]
    fn mutated_log_of_ours(bytes in mutated(Box::leak(our_log().into_boxed_str()))) {
        read_every_way(&bytes);
    }

    #[test]
    fn log_like_lines(lines in prop::collection::vec(
        prop_oneof![
            "[+-] \\| [0-9]{1,20} \\* Size:\\(([0-9]{1,12}, ){0,4}\\) \\| Memory: [0-9.e-]{1,8} M \\| <class '[a-z.]{1,12}'> \\| torch\\.(float32|int8|x)",
            "At [a-z./]{1,10} line [0-9]{1,10}: [a-z]{1,5} +(Total Tensor Used Memory|NVML Used Memory|Peak Allocated Memory|Total Allocated Memory):[0-9.]{1,6} +Mb",
            "",
            "[ -~]{0,40}",
        ],
        0..80,
    )) {
        let text = format!("GPU Memory Track | t | Total Tensor Used Memory:0.0    Mb\n{}\n", lines.join("\n"));
        read_every_way(text.as_bytes());
    }
}
