//! `report_file LOG [--json] [--top N]`: what `gpu-mem-track report` prints for one log, read
//! with the streaming [`analyse_file`] (for measuring time and memory on large logs).
use gpu_mem_track_log::report::{analyse_file, combine, render_text};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else { return Err("usage: report_file LOG [--json] [--top N]".into()) };
    let json = args.iter().any(|a| a == "--json");
    let top =
        args.iter().position(|a| a == "--top").and_then(|i| args.get(i + 1)).map_or(Ok(10), |t| t.parse())?;
    let report = combine(vec![analyse_file(path.as_ref(), top)?]);
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render_text(&report));
    }
    Ok(())
}
