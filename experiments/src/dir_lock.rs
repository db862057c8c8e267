//! One writer per results directory: an advisory lock (`flock`) on a lock file holding the writing
//! process's id, taken before a run reads its table and released when the run ends. The kernel
//! releases the lock of a process that dies, so a killed run's lock is free for the next run, and
//! two runs taking over one stale lock at once cannot both win. The lock is the truth: the pid in
//! the file only names the holder in the refusal, so a crashed run's pid that the system has since
//! given to an unrelated process does not keep the directory locked.

use anyhow::{Context, Result, bail};
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

/// The lock file's name inside a results directory.
pub const LOCK_FILE: &str = ".ringbench.lock";

/// Tries at taking a lock whose file another holder removed between our open and our lock.
const TRIES: usize = 100;

/// A held lock; dropping it removes the file, then releases the lock.
#[derive(Debug)]
pub struct DirLock {
    path: PathBuf,
    /// The locked file: the lock lasts as long as it is open.
    _file: File,
}

impl DirLock {
    /// Takes `dir`'s lock, or says which process holds it.
    pub fn take(dir: &Path) -> Result<DirLock> {
        let path = dir.join(LOCK_FILE);
        for _ in 0..TRIES {
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .with_context(|| format!("opening {}", path.display()))?;
            match file.try_lock() {
                Ok(()) => {}
                Err(TryLockError::WouldBlock) => {
                    let pid =
                        holder(&mut file).map_or("pid unknown".to_owned(), |p| format!("pid {p}"));
                    bail!(
                        "{} is being written by another ringbench run ({pid}); wait for it to \
                         finish or stop it (lock file {})",
                        dir.display(),
                        path.display()
                    );
                }
                Err(TryLockError::Error(e)) => {
                    return Err(e).with_context(|| format!("locking {}", path.display()));
                }
            }
            // A holder that was releasing removed the file after we opened it: our lock is on a
            // file nobody else will open. Open the path again.
            if !same_file(&file, &path) {
                continue;
            }
            // Ours: a pid in the file is a run that ended without removing it (killed, or
            // crashed), whatever process has that pid now.
            if let Some(stale) = holder(&mut file).filter(|&p| p != std::process::id()) {
                eprintln!(
                    "{}: taking over the lock file of pid {stale}, whose run no longer holds it",
                    dir.display()
                );
            }
            file.set_len(0)
                .and_then(|()| file.rewind())
                .and_then(|()| write!(file, "{}", std::process::id()))
                .and_then(|()| file.flush())
                .with_context(|| format!("writing {}", path.display()))?;
            return Ok(DirLock { path, _file: file });
        }
        bail!(
            "{}: could not take the lock file {} in {TRIES} tries (other runs kept replacing it)",
            dir.display(),
            path.display()
        )
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        // Removed while still locked: a run that opened it meanwhile finds it gone once it gets
        // the lock, and opens the path again.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The process id written in a lock file, if any.
fn holder(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.rewind().ok()?;
    file.read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

/// Whether `path` still names the open `file` (not removed, nor replaced by another file).
#[cfg(unix)]
fn same_file(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Whether `path` still names the open `file`: where there are no inode numbers, whether it exists.
#[cfg(not(unix))]
fn same_file(_file: &File, path: &Path) -> bool {
    path.exists()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Barrier, Mutex};

    fn temp(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("ringbench-lock-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_second_lock_is_refused_and_a_dead_holders_lock_is_taken_over() {
        let dir = temp("second");
        let first = DirLock::take(&dir).unwrap();
        let refused = DirLock::take(&dir).unwrap_err().to_string();
        assert!(
            refused.contains(&format!("pid {}", std::process::id())),
            "{refused}"
        );
        drop(first);
        assert!(!dir.join(LOCK_FILE).exists());
        // A lock file left by a process that no longer runs (nobody holds its lock).
        std::fs::write(dir.join(LOCK_FILE), "0").unwrap();
        let taken = DirLock::take(&dir).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.join(LOCK_FILE)).unwrap(),
            std::process::id().to_string()
        );
        drop(taken);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A crashed run's pid, since reused by an unrelated live process (here a child that sleeps),
    /// does not keep the directory locked: nobody holds the lock, so it is taken.
    #[test]
    fn a_stale_pid_reused_by_a_live_process_is_taken_over() {
        let dir = temp("reused");
        let mut unrelated = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        std::fs::write(dir.join(LOCK_FILE), unrelated.id().to_string()).unwrap();
        let taken = DirLock::take(&dir);
        let _ = unrelated.kill();
        let _ = unrelated.wait();
        let taken = taken.unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.join(LOCK_FILE)).unwrap(),
            std::process::id().to_string()
        );
        drop(taken);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Several takers race for one stale lock, round after round: exactly one wins each round, and
    /// while it holds the lock every other is refused.
    #[test]
    fn takers_racing_for_a_stale_lock_have_one_winner() {
        const TAKERS: usize = 8;
        let dir = temp("race");
        for round in 0..20 {
            std::fs::write(dir.join(LOCK_FILE), "0").unwrap();
            let (start, tried) = (Barrier::new(TAKERS), Barrier::new(TAKERS));
            let won = Mutex::new(0);
            std::thread::scope(|s| {
                for _ in 0..TAKERS {
                    s.spawn(|| {
                        start.wait();
                        let lock = DirLock::take(&dir);
                        if lock.is_ok() {
                            *won.lock().unwrap() += 1;
                        }
                        // Hold it until every taker has tried.
                        tried.wait();
                        drop(lock);
                    });
                }
            });
            assert_eq!(*won.lock().unwrap(), 1, "round {round}");
            assert!(!dir.join(LOCK_FILE).exists(), "round {round}");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }
}
