//! One writer per results directory: a lock file holding the writing process's id, taken before a
//! run reads its table and removed when the run ends (a run that was killed leaves one whose process
//! is gone, which the next run takes over).

use anyhow::{Context, Result, bail};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The lock file's name inside a results directory.
pub const LOCK_FILE: &str = ".ringbench.lock";

/// A held lock; dropping it removes the file.
#[derive(Debug)]
pub struct DirLock {
    path: PathBuf,
}

impl DirLock {
    /// Takes `dir`'s lock, or says which process holds it.
    pub fn take(dir: &Path) -> Result<DirLock> {
        let path = dir.join(LOCK_FILE);
        // Two tries: the second follows the removal of a lock whose process is gone.
        for _ in 0..2 {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(mut file) => {
                    write!(file, "{}", std::process::id())
                        .with_context(|| format!("writing {}", path.display()))?;
                    return Ok(DirLock { path });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => match holder(&path) {
                    Some(pid) if alive(pid) => bail!(
                        "{} is being written by another ringbench run (pid {pid}); wait for it to \
                         finish or stop it (lock file {})",
                        dir.display(),
                        path.display()
                    ),
                    // The process that wrote it is gone (killed, or crashed): its lock is stale.
                    stale => match std::fs::remove_file(&path) {
                        Ok(()) => eprintln!(
                            "{}: taking over the lock of {}, which is no longer running",
                            dir.display(),
                            stale.map_or("a process".to_owned(), |pid| format!("pid {pid}"))
                        ),
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => {
                            return Err(e).with_context(|| format!("removing {}", path.display()));
                        }
                    },
                },
                Err(e) => return Err(e).with_context(|| format!("creating {}", path.display())),
            }
        }
        bail!(
            "{}: could not take the lock file {} (another run took it first)",
            dir.display(),
            path.display()
        )
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The process id in a lock file. A file just created may not hold it yet: read again shortly.
fn holder(path: &Path) -> Option<u32> {
    for _ in 0..20 {
        if let Ok(text) = std::fs::read_to_string(path)
            && let Ok(pid) = text.trim().parse()
        {
            return Some(pid);
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    None
}

/// Whether process `pid` is running. Where `/proc` cannot tell (not Linux), every holder is taken
/// to be alive: the message names the lock file to remove by hand.
fn alive(pid: u32) -> bool {
    pid == std::process::id()
        || !Path::new("/proc/self").exists()
        || Path::new("/proc").join(pid.to_string()).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_and_a_dead_holders_lock_is_taken_over() {
        let dir = std::env::temp_dir().join(format!("ringbench-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let first = DirLock::take(&dir).unwrap();
        let refused = DirLock::take(&dir).unwrap_err().to_string();
        assert!(
            refused.contains(&format!("pid {}", std::process::id())),
            "{refused}"
        );
        drop(first);
        assert!(!dir.join(LOCK_FILE).exists());
        // A lock left by a process that no longer runs (pid 0 is never a user process).
        std::fs::write(dir.join(LOCK_FILE), "0").unwrap();
        if Path::new("/proc/self").exists() {
            let taken = DirLock::take(&dir).unwrap();
            assert_eq!(
                std::fs::read_to_string(dir.join(LOCK_FILE)).unwrap(),
                std::process::id().to_string()
            );
            drop(taken);
        }
        std::fs::remove_dir_all(dir).unwrap();
    }
}
