//! The public paths of `log` that other crates of the workspace (and users) name keep resolving,
//! with their signatures, whichever file of `src/log/` holds the item.
#![allow(unused_imports)]

use gpu_mem_track_log::log::format::{
    at_line, block, block_with_notes, group_line, group_mib, header, note_line, python_tuple, MIB,
};
use gpu_mem_track_log::log::oom::{
    human_bytes, Holder, OomReport, OomSummary, FRAGMENTED_SHARE, MAX_HOLDERS, OOM_MARK,
};
use gpu_mem_track_log::log::writer::{
    launcher_rank, log_file_stem, parse_log_file_name, validate_prefix, LogFileName, LogWriter as W,
    FILE_SUFFIX, TIMESTAMP_FORMAT,
};
use gpu_mem_track_log::log::{
    parse_log, parse_log_bytes, parse_log_file, parse_log_lenient, AtField, AtLine, GroupLine, LogBlock,
    LogEvent, LogHeader, LogParseError, LogReader, LogWriter, MemoryField, ParsedLog, SourceLocation,
    ALLOCATED, ALLOC_RETRIES, DEVICE_FREE, DEVICE_TOTAL, DEVICE_USED, MAX_BLOCK_CHANGES, MAX_BLOCK_NOTES,
    MAX_LINE_BYTES, MEMORY_LIMIT, NVML_USED, PEAK_ALLOCATED, PEAK_NVML_USED, REQUESTED, RESERVED,
    TENSOR_USED, UNATTRIBUTED, WORKSPACE,
};

#[test]
fn writers_keep_their_signatures() {
    let _: fn(&LogHeader) -> String = header;
    let _: fn(&GroupLine) -> String = group_line;
    let _: fn(&AtLine) -> String = at_line;
    let _: fn(&str) -> String = note_line;
    let _: fn(&[GroupLine], &AtLine) -> String = block;
    let _: fn(&[GroupLine], &[String], &AtLine) -> String = block_with_notes;
    let _: fn(&[i64]) -> String = python_tuple;
    let _: fn(f64) -> String = group_mib;
    let _: fn(&str) -> Result<ParsedLog, LogParseError> = parse_log;
    let _: fn(&[u8]) -> Result<ParsedLog, LogParseError> = parse_log_bytes;
    let _: fn(&str) -> (Option<ParsedLog>, Vec<LogParseError>) = parse_log_lenient;
    assert_eq!(MIB, 1024.0 * 1024.0);
}

#[test]
fn the_labels_are_the_fields_labels() {
    let labels = [
        TENSOR_USED,
        ALLOCATED,
        PEAK_ALLOCATED,
        WORKSPACE,
        UNATTRIBUTED,
        RESERVED,
        DEVICE_FREE,
        ALLOC_RETRIES,
        NVML_USED,
        PEAK_NVML_USED,
        DEVICE_USED,
        DEVICE_TOTAL,
        REQUESTED,
        MEMORY_LIMIT,
    ];
    assert_eq!(labels, AtField::ALL.map(AtField::label));
    // Constants still work as patterns (plot.rs matches on them).
    assert!(matches!(AtField::PeakAllocated.label(), PEAK_ALLOCATED));
}
