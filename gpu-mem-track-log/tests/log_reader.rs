//! `LogReader` reads what `parse_log_lenient` reads, block by block, and tolerates damaged input:
//! CRLF, NUL bytes, lines that are not UTF-8, a cut-off last line, over-long lines, no header.
use std::path::Path;

use gpu_mem_track_log::log::{
    parse_log_lenient, LogEvent, LogParseError, LogReader, ParsedLog, MAX_LINE_BYTES,
};
use gpu_mem_track_log::Error;

const FIXTURE: &str = include_str!("../../tests/fixtures/pytorch_memory_utils.txt");

/// Everything a reader gives, as the lenient parser's result.
fn read_all(bytes: &[u8]) -> Result<(ParsedLog, Vec<LogParseError>), Error> {
    let mut log: Option<ParsedLog> = None;
    let mut errors = Vec::new();
    for event in LogReader::new(bytes) {
        match event? {
            LogEvent::Header(header) => {
                log = Some(ParsedLog { header, blocks: vec![], trailing_changes: vec![] })
            }
            LogEvent::Block(b) => log.as_mut().expect("header first").blocks.push(b),
            LogEvent::Skipped(e) => errors.push(e),
            LogEvent::Trailing(t) => log.as_mut().expect("header first").trailing_changes = t,
        }
    }
    Ok((log.expect("a header or an error"), errors))
}

#[test]
fn reader_matches_the_lenient_parser() {
    let cut = &FIXTURE[..FIXTURE.find("- | 2 * Size").unwrap() + 30];
    for text in [FIXTURE, cut, &format!("{FIXTURE}junk\n+ | x\n")] {
        let (log, errors) = parse_log_lenient(text);
        let (read, read_errors) = read_all(text.as_bytes()).unwrap();
        assert_eq!(Some(read), log);
        assert_eq!(read_errors, errors);
    }
}

#[test]
fn crlf_nul_invalid_utf8_and_a_cut_last_line_are_tolerated() {
    let crlf = FIXTURE.replace('\n', "\r\n");
    let (log, errors) = read_all(crlf.as_bytes()).unwrap();
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(log.blocks.len(), 4);

    let mut bytes = FIXTURE.as_bytes().to_vec();
    bytes.extend_from_slice(b"\0\0\0\n\xff\xfe not utf-8 \xc3\n+ | 1 * Size:(4,) | Memo");
    let (log, errors) = read_all(&bytes).unwrap();
    assert_eq!(log.blocks.len(), 4);
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert_eq!(errors[0].line, 25);
    assert!(errors[1].text.contains('\u{fffd}'), "read lossily: {:?}", errors[1].text);
    assert_eq!(errors[2].line, 27);
}

#[test]
fn over_long_lines_are_skipped_and_quoted_briefly() {
    let mut text = FIXTURE.to_owned();
    text.push_str(&"x".repeat(MAX_LINE_BYTES * 2 + 5));
    text.push('\n');
    text.push_str(&"y".repeat(10_000));
    text.push('\n');
    let (log, errors) = read_all(text.as_bytes()).unwrap();
    assert_eq!(log.blocks.len(), 4);
    assert_eq!(errors.len(), 2);
    assert!(errors[0].reason.contains("longer than"), "{}", errors[0]);
    for e in &errors {
        assert!(e.to_string().len() < 400, "{} bytes", e.to_string().len());
    }
    assert_eq!(errors[1].line, 26);
}

#[test]
fn no_header_is_one_error_naming_the_file() {
    for bytes in [&b""[..], b"\n\n  \n", b"hello\nGPU Memory Track | t | \n", b"\xff\xfe\0\0"] {
        let events: Vec<_> = LogReader::new(bytes).with_path("/x/not-a-log.txt").collect();
        assert_eq!(events.len(), 1, "{bytes:?}");
        let Err(e @ Error::LogParse(_)) = &events[0] else { panic!("{:?}", events[0]) };
        assert!(e.to_string().starts_with("/x/not-a-log.txt:line "), "{e}");
    }
    let first_line_too_long = vec![b'G'; MAX_LINE_BYTES + 10];
    let events: Vec<_> = LogReader::new(&first_line_too_long[..]).collect();
    assert!(matches!(&events[..], [Err(Error::LogParse(_))]), "{events:?}");
}

#[test]
fn read_errors_end_the_stream_as_log_read() {
    struct Failing;
    impl std::io::Read for Failing {
        fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("disk on fire"))
        }
    }
    let events: Vec<_> =
        LogReader::new(std::io::BufReader::new(Failing)).with_path(Path::new("a.txt")).collect();
    assert!(
        matches!(&events[..], [Err(Error::LogRead { path, .. })] if path == Path::new("a.txt")),
        "{events:?}"
    );
}
