//! How the ranks of one NCCL run meet, and how no wait on them lasts forever, with no GPU involved:
//! NCCL's unique id published by rank 0 in a file named for the run (written whole beside it, then
//! renamed into place, so a reader never sees half of one), awaited by the others up to a deadline;
//! and deadlines around the calls that can block on a peer (joining the communicator, waiting for
//! the stream that runs the collectives).

use crate::error::TransportError;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// NCCL's unique id: 128 bytes.
pub const ID_BYTES: usize = 128;

/// What an id file starts with: a file that does not is not one of ours, or not whole.
const MAGIC: &[u8] = b"ringbench nccl id v1\n";

/// How often a waiting rank looks again.
const POLL: Duration = Duration::from_millis(10);

/// The environment variables, in order, that name one launch of the ranks: ringbench's own, then
/// those of PMIx (Open MPI 5), Open MPI 4, torchrun and Slurm.
pub const RUN_KEY_VARS: [&str; 5] = [
    "RINGBENCH_RUN_ID",
    "PMIX_NAMESPACE",
    "OMPI_MCA_orte_ess_jobid",
    "TORCHELASTIC_RUN_ID",
    "SLURM_JOB_ID",
];

/// This launch's key: the first of [`RUN_KEY_VARS`] that is set and not empty.
pub fn run_key_from_env() -> Option<String> {
    RUN_KEY_VARS
        .iter()
        .find_map(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
}

/// The file one run's ranks meet at: `base` with `.KEY` appended (a fresh name for each run, so
/// that a file an earlier run left behind is never joined), or `base` itself without a key. The
/// key's characters other than ASCII letters, digits, `-` and `_` become `_`.
pub fn id_path(base: &Path, key: Option<&str>) -> PathBuf {
    match key {
        None => base.to_path_buf(),
        Some(key) => {
            let key: String = key
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            let mut name = base.as_os_str().to_os_string();
            name.push(format!(".{key}"));
            PathBuf::from(name)
        }
    }
}

/// Rank 0: writes `id` to `path` whole. It goes into a temporary file beside `path`, is synced,
/// and is renamed into place: a reader finds no file, or the whole id.
pub fn publish_id(path: &Path, id: &[u8; ID_BYTES], rank: usize) -> Result<(), TransportError> {
    let failed = |e: std::io::Error| TransportError::Unavailable {
        rank,
        what: "NCCL id file",
        why: format!("{}: {e}", path.display()),
    };
    let mut temporary = path.as_os_str().to_os_string();
    temporary.push(format!(".tmp-{}", std::process::id()));
    let temporary = PathBuf::from(temporary);
    let mut file = std::fs::File::create(&temporary).map_err(failed)?;
    file.write_all(MAGIC).map_err(failed)?;
    file.write_all(id).map_err(failed)?;
    file.sync_all().map_err(failed)?;
    drop(file);
    std::fs::rename(&temporary, path).map_err(failed)
}

/// The id in `bytes`, if they are a whole id file.
fn parse_id(bytes: &[u8]) -> Option<[u8; ID_BYTES]> {
    let id = bytes.strip_prefix(MAGIC)?;
    id.try_into().ok()
}

/// Any other rank: the id rank 0 publishes at `path`, once it is there whole; a
/// [`TransportError::Timeout`] naming rank 0 when none appears within `timeout`, or an
/// [`TransportError::Unavailable`] when what is there at the deadline is not an id file.
pub fn await_id(
    path: &Path,
    rank: usize,
    timeout: Duration,
) -> Result<[u8; ID_BYTES], TransportError> {
    let deadline = Instant::now() + timeout;
    loop {
        let found = std::fs::read(path);
        if let Ok(bytes) = &found
            && let Some(id) = parse_id(bytes)
        {
            return Ok(id);
        }
        if Instant::now() >= deadline {
            return Err(match found {
                Ok(bytes) => TransportError::Unavailable {
                    rank,
                    what: "NCCL id file",
                    why: format!(
                        "{} holds {} bytes that are not an id ringbench wrote ({} bytes starting \
                         {MAGIC:?})",
                        path.display(),
                        bytes.len(),
                        MAGIC.len() + ID_BYTES,
                    ),
                },
                Err(_) => TransportError::Timeout {
                    rank,
                    peer: 0,
                    seconds: timeout.as_secs_f64(),
                },
            });
        }
        std::thread::sleep(POLL);
    }
}

/// `call`'s value, computed on a thread of its own and waited for at most `timeout`; a
/// [`TransportError::Deadline`] naming `what` when it takes longer. A call that never returns
/// (NCCL's join when a peer never comes) stays blocked on its thread; the rank goes on with the
/// error, and the process ends with it.
pub fn within<T: Send + 'static>(
    timeout: Duration,
    rank: usize,
    what: &'static str,
    call: impl FnOnce() -> T + Send + 'static,
) -> Result<T, TransportError> {
    let (sender, receiver) = mpsc::channel();
    std::thread::Builder::new()
        .name(format!("rank {rank}: {what}"))
        .spawn(move || {
            // The receiver is gone only when the deadline passed: nobody wants the value then.
            let _ = sender.send(call());
        })
        .map_err(|e| TransportError::RankFailed {
            rank,
            message: format!("starting a thread for {what}: {e}"),
        })?;
    receiver
        .recv_timeout(timeout)
        .map_err(|_| TransportError::Deadline {
            rank,
            what,
            seconds: timeout.as_secs_f64(),
        })
}

/// Asks `done` until it says true (or fails), for at most `timeout`: a
/// [`TransportError::Deadline`] naming `what` after that. `done` is asked at least once.
pub fn poll_until(
    timeout: Duration,
    rank: usize,
    what: &'static str,
    mut done: impl FnMut() -> Result<bool, TransportError>,
) -> Result<(), TransportError> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_micros(20);
    loop {
        if done()? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(TransportError::Deadline {
                rank,
                what,
                seconds: timeout.as_secs_f64(),
            });
        }
        // Short at first (a ring step's exchange usually lands within microseconds of the
        // compute), then at most POLL apart.
        std::thread::sleep(pause);
        pause = (pause * 2).min(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "ringbench-rendezvous-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn id(seed: u8) -> [u8; ID_BYTES] {
        std::array::from_fn(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
    }

    #[test]
    fn a_published_id_is_read_back_whole() {
        let dir = scratch("whole");
        let path = dir.join("nccl.id");
        publish_id(&path, &id(7), 0).unwrap();
        assert_eq!(await_id(&path, 1, Duration::from_secs(5)).unwrap(), id(7));
        // Nothing but the id file is left beside it (the temporary was renamed).
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["nccl.id"]);
    }

    #[test]
    fn a_rank_whose_peer_never_writes_the_id_file_ends_within_the_timeout() {
        let dir = scratch("never");
        let timeout = Duration::from_millis(300);
        let began = Instant::now();
        let err = await_id(&dir.join("nccl.id"), 2, timeout).unwrap_err();
        let took = began.elapsed();
        assert_eq!(
            err,
            TransportError::Timeout {
                rank: 2,
                peer: 0,
                seconds: 0.3
            }
        );
        assert_eq!(
            err.to_string(),
            "rank 2: no message from rank 0 within 0.3 s"
        );
        // It waited the timeout, and not much longer (one poll past it, with a wide margin for a
        // loaded machine: the point is that it ends).
        assert!(
            took >= timeout && took < timeout + Duration::from_secs(5),
            "{took:?}"
        );
    }

    #[test]
    fn a_half_written_or_foreign_file_is_never_taken_for_an_id() {
        let dir = scratch("half");
        let path = dir.join("nccl.id");
        let mut whole = MAGIC.to_vec();
        whole.extend_from_slice(&id(3));
        for cut in [0, 5, MAGIC.len(), MAGIC.len() + 64, whole.len() - 1] {
            std::fs::write(&path, &whole[..cut]).unwrap();
            let err = await_id(&path, 1, Duration::from_millis(30)).unwrap_err();
            assert!(
                matches!(
                    err,
                    TransportError::Unavailable {
                        what: "NCCL id file",
                        ..
                    }
                ),
                "{cut} bytes: {err}"
            );
            assert!(
                err.to_string().contains(&format!("holds {cut} bytes")),
                "{err}"
            );
        }
        // The bare 128 bytes an older ringbench wrote, or anything else, are not an id either.
        std::fs::write(&path, id(3)).unwrap();
        assert!(await_id(&path, 1, Duration::from_millis(30)).is_err());
    }

    #[test]
    fn a_reader_racing_the_writer_sees_no_file_or_a_whole_id() {
        let dir = scratch("race");
        let path = dir.join("nccl.id");
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let (path, stop) = (path.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut seen = 0;
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(bytes) = std::fs::read(&path) {
                        assert!(parse_id(&bytes).is_some(), "read {} bytes", bytes.len());
                        seen += 1;
                    }
                }
                seen
            })
        };
        for round in 0..300u32 {
            publish_id(&path, &id(round as u8), 0).unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        let seen = reader.join().unwrap();
        assert!(seen > 0, "the reader never saw the file");
    }

    #[test]
    fn each_run_meets_at_a_file_of_its_own() {
        let base = Path::new("/tmp/out/nccl.id");
        assert_eq!(id_path(base, None), base);
        assert_eq!(
            id_path(base, Some("prterun-host-123@1")),
            Path::new("/tmp/out/nccl.id.prterun-host-123_1")
        );
        assert_ne!(id_path(base, Some("job-1")), id_path(base, Some("job-2")));
    }

    #[test]
    fn a_call_that_never_returns_ends_in_a_deadline_error() {
        let began = Instant::now();
        let err = within(
            Duration::from_millis(200),
            3,
            "joining the NCCL communicator",
            || {
                std::thread::sleep(Duration::from_secs(3600));
            },
        )
        .unwrap_err();
        assert!(began.elapsed() < Duration::from_secs(5));
        assert_eq!(
            err.to_string(),
            "rank 3: joining the NCCL communicator did not finish within 0.2 s (a rank never \
             joined or died)"
        );
        assert_eq!(
            within(Duration::from_secs(5), 0, "a quick call", || 41 + 1),
            Ok(42)
        );
    }

    #[test]
    fn a_wait_that_never_completes_ends_in_a_deadline_error() {
        let mut asked = 0;
        let err = poll_until(
            Duration::from_millis(100),
            1,
            "the receive from rank 0",
            || {
                asked += 1;
                Ok(false)
            },
        )
        .unwrap_err();
        assert!(
            matches!(err, TransportError::Deadline { rank: 1, .. }),
            "{err}"
        );
        assert!(asked > 1);
        let mut countdown = 3;
        poll_until(Duration::from_secs(5), 0, "a wait", || {
            countdown -= 1;
            Ok(countdown == 0)
        })
        .unwrap();
        assert_eq!(countdown, 0);
        // An error while waiting ends the wait at once.
        let failed = TransportError::RankFailed {
            rank: 0,
            message: "boom".into(),
        };
        assert_eq!(
            poll_until(Duration::from_secs(60), 0, "a wait", || Err(failed.clone())),
            Err(failed)
        );
    }
}
