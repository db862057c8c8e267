//! `--trace FILE.json`: a command's per-rank timeline in Chrome's trace-event format
//! (`workbench::trace`), recorded while the command runs and written when it ends. Under mpirun an
//! attention job gathers every process's events into rank 0's file on one time axis (aligned at a
//! barrier); another command's processes each write their own ranks, rank R's to `FILE.rank-R.json`
//! beside rank 0's `FILE`.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use workbench::trace::{self, Recorder};

/// A trace being recorded into a file.
pub struct TraceFile {
    path: PathBuf,
    recorder: Arc<Recorder>,
}

impl TraceFile {
    /// Starts recording when `path` is given (a recorder installed for the commands' rings).
    pub fn start(path: Option<&Path>) -> Option<TraceFile> {
        let path = path?.to_path_buf();
        let recorder = Recorder::new();
        trace::install(recorder.clone());
        Some(TraceFile { path, recorder })
    }

    /// The recorder (for a caller that draws the events itself).
    pub fn recorder(&self) -> &Arc<Recorder> {
        &self.recorder
    }

    /// Stops recording and writes the file: `FILE` by this process when it runs every rank or is
    /// rank 0 of a launch, `FILE.rank-R.json` by launched rank R. Returns the path written.
    pub fn finish(self) -> Result<PathBuf> {
        trace::uninstall();
        let path = match crate::mpi_rank::launched_rank().or_else(mpi_world_rank) {
            Some(rank) if rank > 0 => {
                let stem = self.path.with_extension("");
                PathBuf::from(format!("{}.rank-{rank}.json", stem.display()))
            }
            _ => self.path,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        self.recorder
            .write(&path)
            .with_context(|| format!("writing the trace {}", path.display()))?;
        let events = self.recorder.events().len();
        eprintln!(
            "wrote {events} trace events to {} (open it in ui.perfetto.dev)",
            path.display()
        );
        Ok(path)
    }
}

/// `work` with a trace recorded into `path` when one is given, written when `work` succeeds.
pub fn traced<T>(path: Option<&Path>, work: impl FnOnce() -> Result<T>) -> Result<T> {
    let trace = TraceFile::start(path);
    let result = work();
    match (trace, &result) {
        (Some(trace), Ok(_)) => {
            trace.finish()?;
        }
        (Some(_), Err(_)) => {
            trace::uninstall();
        }
        (None, _) => {}
    }
    result
}

/// This process's rank when mpirun started it, else `None`.
fn mpi_world_rank() -> Option<usize> {
    workbench::transport::launched_by_mpirun()
        .then(|| std::env::var("OMPI_COMM_WORLD_RANK").ok()?.parse().ok())
        .flatten()
}
