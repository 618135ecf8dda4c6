//! A write cut short (here by `ulimit -f`, as by a full disk) leaves only whole blocks in the log,
//! and the writer goes on appending once there is room.
use std::process::Command;

use gpu_mem_track_log::log::writer::LogWriter;
use gpu_mem_track_log::Error;

const CHILD: &str = "GMT_SHORT_WRITE_CHILD";

/// A block of about 1 KB ending in its number, so a cut one is easy to see.
fn block(i: usize) -> String {
    let lines: String = (0..20).map(|k| format!("+ | 1 * Size:({k}, {i})  | Memory: 0.25 M\n")).collect();
    format!("{lines}\nAt train.rs line {i}: step    Total Tensor Used Memory:{i}.0    Mb\n\n")
}

#[test]
fn short_writes_leave_whole_blocks() {
    if let Some(dir) = std::env::var_os(CHILD) {
        // In the child: the file size limit is 8 KiB and SIGXFSZ is ignored, so writes past it
        // fail with EFBIG after a partial write.
        let mut w = LogWriter::create(dir.as_ref(), "limited").unwrap();
        let mut failures = 0;
        for i in 0..20 {
            match w.append(&block(i)) {
                Ok(()) => {}
                Err(Error::LogWrite { .. }) => failures += 1,
                Err(e) => panic!("{e}"),
            }
        }
        println!("failures={failures} path={}", w.path().display());
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("sh")
        .arg("-c")
        .arg("trap '' XFSZ; ulimit -f 16; exec \"$0\" --exact short_writes_leave_whole_blocks --nocapture")
        .arg(&exe)
        .env(CHILD, dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let failures: usize = stdout
        .split("failures=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("child output: {stdout}"));
    assert!(failures > 0, "the limit was reached");
    let path = dir.path().read_dir().unwrap().next().unwrap().unwrap().path();
    let text = std::fs::read_to_string(&path).unwrap();
    let whole = 20 - failures;
    assert_eq!(text, (0..whole).map(block).collect::<String>(), "only the blocks that fit, each whole");
    assert!(text.len() <= 16 * 512);
}
