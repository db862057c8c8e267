//! Checks that cannot run on this machine say so where the test command adds up its total: each
//! one appends a line to the file `RINGBENCH_SKIPPED` names (scripts/test.sh sets it and prints the
//! count in its closing line), besides telling stderr. A skipped check never passes in silence.

use std::io::Write;

/// The variable naming the file skipped checks are listed in.
pub const SKIPPED_FILE_VAR: &str = "RINGBENCH_SKIPPED";

/// Records that `check` did not run here, and why.
pub fn record(check: &str, why: &str) {
    eprintln!("skipped: {check}: {why}");
    let Some(path) = std::env::var_os(SKIPPED_FILE_VAR) else {
        return;
    };
    let line = format!("{check}: {why}\n");
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        panic!(
            "recording the skip of {check} in {}: {e}",
            path.to_string_lossy()
        );
    }
}
