//! `report` over generated logs: a training loop with many track points, and 20 000 track points
//! that each add a new tensor shape (quadratic in the old leak check: 377 s).
use std::path::Path;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use gpu_mem_track_log::log::parse_log;
use gpu_mem_track_log::report::{analyse, analyse_reader};

const HEADER: &str = "GPU Memory Track | 01-Jan-24-00:00:00 | Total Tensor Used Memory:0.0    Mb Total Allocated Memory:0.0    Mb\n\n";

fn at(line: u32, mib: f64) -> String {
    format!(
        "\nAt {:<50} Total Tensor Used Memory:{mib:<7.1}Mb Total Allocated Memory:{mib:<7.1}Mb Peak Allocated Memory:{mib:<7.1}Mb\n\n",
        format!("examples/train.rs line {line}: train_step")
    )
}

/// Forward (four activations appear), backward (they go), optimizer step: 3 points per step.
fn training_loop(points: usize) -> String {
    let acts = ["(128, 16, 28, 28)", "(128, 32, 14, 14)", "(128, 1568)", "(128, 64)"];
    let mut s = HEADER.to_owned();
    s += "+ | 1 * Size:(64, 1568)           | Memory: 0.3828 M | <class 'torch.nn.parameter.Parameter'> | torch.float32\n";
    s += &at(75, 0.4);
    for i in 1..points {
        match i % 3 {
            1 => {
                for a in acts {
                    s += &format!(
                        "+ | 1 * Size:{a:<20} | Memory: 6.125 M | <class 'torch.Tensor'> | torch.float32\n"
                    );
                }
                s += &at(39, 10.4);
            }
            2 => {
                for a in acts {
                    s += &format!(
                        "- | 1 * Size:{a:<20} | Memory: 6.125 M | <class 'torch.Tensor'> | torch.float32\n"
                    );
                }
                s += &at(44, 0.8);
            }
            _ => s += &at(47, 0.8),
        }
    }
    s
}

fn distinct_groups(points: usize) -> String {
    let mut s = HEADER.to_owned();
    for i in 0..points {
        s += &format!(
            "+ | 1 * Size:({}, 3) | Memory: 0.0 M | <class 'torch.Tensor'> | torch.float32\n",
            i + 1
        );
        s += &at(20, i as f64 / 100.0);
    }
    s
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("report");
    g.sample_size(10);
    for (name, text) in [
        ("training_loop_30000_points", training_loop(30_000)),
        ("distinct_groups_20000", distinct_groups(20_000)),
    ] {
        g.throughput(Throughput::Bytes(text.len() as u64));
        g.bench_with_input(BenchmarkId::new("analyse_reader", name), &text, |b, text| {
            b.iter(|| analyse_reader(Path::new("x.txt"), text.as_bytes(), 10).unwrap())
        });
        let log = parse_log(&text).unwrap();
        g.bench_with_input(BenchmarkId::new("analyse_parsed", name), &log, |b, log| {
            b.iter(|| analyse(Path::new("x.txt"), log, Vec::new(), 10))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
