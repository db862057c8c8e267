//! Where a sweep's points run: in this process (its ranks on threads), or each point as one job of
//! `ranks` processes started by a launcher (Open MPI's `mpirun`, SLURM's `srun`), under a deadline,
//! and what a job that failed says about why.

use crate::results::{Record, Table};
use crate::spec::SpecText;
use anyhow::{Context, Result, anyhow};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// `--launcher`: what starts a point's ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LauncherName {
    /// In this process, the ranks on threads (one machine).
    Threads,
    /// One job of processes a point, started by Open MPI's `mpirun` (a hostfile reaches other machines).
    Mpirun,
    /// One job of processes a point, started by SLURM's `srun` (inside an allocation or a batch job).
    Srun,
}

impl LauncherName {
    /// Its name in specs and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            LauncherName::Threads => "threads",
            LauncherName::Mpirun => "mpirun",
            LauncherName::Srun => "srun",
        }
    }
}

/// The spec's `[launcher]` table. Not part of the settings hash: where points run does not change
/// what they compute.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LauncherSection {
    /// The launcher this spec runs with when the command line names none (default: threads).
    name: Option<LauncherName>,
    /// The mpirun command before ringbench's own arguments; `{ranks}` and `{nodes}` are filled
    /// from the point (default: `["mpirun", "--oversubscribe", "--bind-to", "none", "-n",
    /// "{ranks}"]`, and `--allow-run-as-root` as root).
    mpirun: Option<Vec<String>>,
    /// The srun command likewise (default: `["srun", "--mpi=pmix", "-n", "{ranks}"]`).
    srun: Option<Vec<String>>,
    /// Seconds a point's job may take before it is stopped and recorded as failed (default 3600).
    deadline_seconds: Option<f64>,
    /// Ranks a node holds: `{nodes}` is ranks divided by it, rounded up (default: every rank on one
    /// node).
    ranks_per_node: Option<usize>,
}

/// The environment variable that makes a launched point's rank die by SIGKILL (`INDEX:RANK`): the
/// fault tests' crashed rank.
pub const KILL_POINT: &str = "RINGBENCH_KILL_POINT";
/// The environment variable that makes a launched point's rank hang (`INDEX:RANK`): the fault tests'
/// stalled rank.
pub const HANG_POINT: &str = "RINGBENCH_HANG_POINT";

/// The share of the deadline a launched rank waits for a peer: a rank that goes silent is named by
/// its peers' timeout before the deadline stops the job.
const RANK_TIMEOUT_SHARE: f64 = 0.75;

/// How a run's points are started.
#[derive(Debug, Clone)]
pub struct Launcher {
    /// Which launcher.
    pub name: LauncherName,
    /// The command prefix, placeholders unfilled.
    prefix: Vec<String>,
    /// How long a point's job may take.
    pub deadline: Duration,
    ranks_per_node: Option<usize>,
}

/// One point to run as a job of processes.
#[derive(Debug, Clone, Copy)]
pub struct PointJob<'a> {
    /// The spec file.
    pub spec: &'a Path,
    /// The point's index in the plan.
    pub index: usize,
    /// Its ranks: the job's processes.
    pub ranks: usize,
    /// The results directory (the job reads its results.csv for baselines).
    pub dir: &'a Path,
    /// The spec's settings hash, which the job checks before it computes.
    pub spec_hash: &'a str,
}

impl Launcher {
    /// The launcher `cli` names, else the spec's `[launcher] name`, else threads; its command from
    /// the spec's `[launcher]` table or the default.
    pub fn of(spec: &SpecText, cli: Option<LauncherName>) -> Result<Launcher> {
        let section: LauncherSection = spec.launcher_section()?.unwrap_or_default();
        let name = cli.or(section.name).unwrap_or(LauncherName::Threads);
        let words = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
        let prefix = match name {
            LauncherName::Threads => Vec::new(),
            LauncherName::Mpirun => section.mpirun.clone().unwrap_or_else(|| {
                // Unbound: a rank's kernels use a thread pool, and Open MPI would pin a job of one
                // or two processes to one core each (measured: 1.8x slower on one rank).
                let mut default: Vec<String> =
                    words(&["mpirun", "--oversubscribe", "--bind-to", "none"]);
                // Open MPI refuses root unless told; containers and CI runners are often root.
                #[cfg(unix)]
                if unsafe { libc::geteuid() } == 0 {
                    default.push("--allow-run-as-root".into());
                }
                default.extend(words(&["-n", "{ranks}"]));
                default
            }),
            LauncherName::Srun => section
                .srun
                .clone()
                .unwrap_or_else(|| words(&["srun", "--mpi=pmix", "-n", "{ranks}"])),
        };
        #[cfg(not(feature = "mpi"))]
        if name != LauncherName::Threads {
            anyhow::bail!(
                "--launcher {}: a launched point's processes talk over MPI, and this ringbench was \
                 built without the `mpi` feature (cargo build --release --features mpi)",
                name.name()
            );
        }
        if name != LauncherName::Threads && prefix.is_empty() {
            return Err(spec.error("launcher", name.name(), "the command is empty"));
        }
        let deadline = section.deadline_seconds.unwrap_or(3600.0);
        if !(deadline.is_finite() && deadline > 0.0) {
            return Err(spec.error(
                "launcher",
                "deadline_seconds",
                &format!("must be a number of seconds above 0, got {deadline}"),
            ));
        }
        if section.ranks_per_node == Some(0) {
            return Err(spec.error("launcher", "ranks_per_node", "must be at least 1, got 0"));
        }
        let launcher = Launcher {
            name,
            prefix,
            deadline: Duration::from_secs_f64(deadline),
            ranks_per_node: section.ranks_per_node,
        };
        // An unknown placeholder is an error now, not at the first point.
        launcher
            .command(1)
            .map_err(|e| spec.error("launcher", name.name(), &e.to_string()))?;
        Ok(launcher)
    }

    /// Whether points run in this process.
    pub fn in_process(&self) -> bool {
        self.name == LauncherName::Threads
    }

    /// What carries a launched point's ring: the `transport` column of its rows.
    pub fn transport(&self) -> &'static str {
        match self.name {
            LauncherName::Threads => "threads",
            LauncherName::Mpirun | LauncherName::Srun => "mpi",
        }
    }

    /// The prefix with `{ranks}` and `{nodes}` filled for a job of `ranks` processes.
    fn command(&self, ranks: usize) -> Result<Vec<String>> {
        let nodes = self.ranks_per_node.map_or(1, |r| ranks.div_ceil(r));
        self.prefix
            .iter()
            .map(|word| {
                let filled = word
                    .replace("{ranks}", &ranks.to_string())
                    .replace("{nodes}", &nodes.to_string());
                match filled.find('{') {
                    Some(at) if filled[at..].contains('}') => Err(anyhow!(
                        "'{word}': unknown placeholder (known: {{ranks}}, {{nodes}})"
                    )),
                    _ => Ok(filled),
                }
            })
            .collect()
    }

    /// Where a traced point's rank 0 writes its timeline beside the rows it writes to `rows`.
    pub fn trace_of(job: &PointJob) -> PathBuf {
        point_trace(
            &job.dir
                .join(".launch")
                .join(format!("point-{}.csv", job.index)),
        )
    }

    /// Runs one point as a job of processes: its rows as rank 0 wrote them, or why it failed (the
    /// rank and its error line, a signal, or the deadline). The job's output goes to a log in
    /// `DIR/.launch/`, removed when the job succeeds and named in the reason when it fails.
    pub fn launch(&self, job: &PointJob) -> Result<Result<Vec<Record>, String>> {
        let scratch = job.dir.join(".launch");
        std::fs::create_dir_all(&scratch)
            .with_context(|| format!("creating {}", scratch.display()))?;
        let log_path = scratch.join(format!("point-{}.log", job.index));
        let rows_path = scratch.join(format!("point-{}.csv", job.index));
        let _ = std::fs::remove_file(&rows_path);
        let _ = std::fs::remove_file(point_trace(&rows_path));
        let exe = std::env::current_exe().context("finding the ringbench executable")?;
        let argv = self.command(job.ranks)?;
        let log = std::fs::File::create(&log_path)
            .with_context(|| format!("creating {}", log_path.display()))?;
        let mut command = Command::new(&argv[0]);
        command
            .args(&argv[1..])
            .arg(&exe)
            .arg("point")
            .arg(absolute(job.spec)?)
            .args(["--index", &job.index.to_string()])
            .arg("--dir")
            .arg(absolute(job.dir)?)
            .arg("--out")
            .arg(absolute(&rows_path)?)
            .args(["--spec-hash", job.spec_hash])
            // Peers give up on a silent rank, naming it, before the deadline stops the job.
            .args([
                "--rank-timeout",
                &(self.deadline.as_secs_f64() * RANK_TIMEOUT_SHARE).to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // Its own process group, so that a job past its deadline is stopped whole.
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut child = command
            .spawn()
            .with_context(|| format!("starting '{}' (is it installed?)", argv[0]))?;
        let start = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break Some(status);
            }
            if start.elapsed() > self.deadline {
                stop_group(&mut child);
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let text = std::fs::read_to_string(&log_path).unwrap_or_default();
        let failed = |reason: String| {
            Ok(Err(format!(
                "{reason} (log: {})",
                log_path.file_name().map_or(String::new(), |n| format!(
                    ".launch/{}",
                    n.to_string_lossy()
                ))
            )))
        };
        let Some(status) = status else {
            return failed(format!(
                "no result within the deadline of {} s: its processes were stopped",
                self.deadline.as_secs_f64()
            ));
        };
        if !status.success() || !rows_path.exists() {
            return failed(failure_reason(&text, status, self.name));
        }
        let rows = Table::read(&rows_path)?.rows;
        let _ = std::fs::remove_file(&rows_path);
        let _ = std::fs::remove_file(&log_path);
        let _ = std::fs::remove_dir(&scratch);
        Ok(Ok(rows))
    }
}

fn absolute(path: &Path) -> Result<PathBuf> {
    std::path::absolute(path).with_context(|| format!("resolving {}", path.display()))
}

/// Stops a job's whole process group: SIGTERM (mpirun and srun pass it to their ranks), then,
/// after 5 s, SIGKILL.
fn stop_group(child: &mut std::process::Child) {
    #[cfg(unix)]
    {
        let group = child.id() as libc::pid_t;
        unsafe { libc::kill(-group, libc::SIGTERM) };
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = child.try_wait() {
                // Ranks the launcher left behind go too.
                unsafe { libc::kill(-group, libc::SIGKILL) };
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        unsafe { libc::kill(-group, libc::SIGKILL) };
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Why a job failed, in one line, from its output: a rank's own error line (`error: MPI rank R:
/// ...`), else the launcher's line about a rank that died (Open MPI: `process rank R ... exited on
/// signal S`; srun: `task R: Killed`), else the output's last line and the exit status.
pub fn failure_reason(log: &str, status: ExitStatus, launcher: LauncherName) -> String {
    let lines = || log.lines().map(str::trim).filter(|l| !l.is_empty());
    if let Some((_, said)) = lines().find_map(|l| l.split_once("error: MPI rank ")) {
        // `R: message`; a transport error already starts with `rank R:`.
        let (rank, message) = said.split_once(':').unwrap_or((said, ""));
        let message = message.trim_start();
        return match message.starts_with(&format!("rank {rank}:")) {
            true => message.to_owned(),
            false => format!("rank {rank}: {message}"),
        };
    }
    // "mpirun noticed that process rank 2 with PID 77 on node n exited on signal 9 (Killed)."
    if let Some(line) = lines().find(|l| l.contains("process rank") && l.contains("on signal")) {
        let rank = word_after(line, "process rank ");
        let signal = line
            .split_once("on signal ")
            .map_or("", |(_, s)| s.trim_end_matches('.'));
        return format!("rank {rank} died on signal {signal} ({})", launcher.name());
    }
    // "srun: error: host: task 2: Killed"
    if let Some(line) = lines().find(|l| l.starts_with("srun: error:") && l.contains(": task ")) {
        let task = line.split_once(": task ").map_or("", |(_, t)| t);
        return format!("rank {task} ({})", launcher.name());
    }
    let last = lines()
        .rfind(|l| !l.starts_with("--------"))
        .unwrap_or("no output");
    format!("{} exited with {status}: {last}", launcher.name())
}

fn word_after<'a>(line: &'a str, prefix: &str) -> &'a str {
    line.split_once(prefix)
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .unwrap_or("?")
}

/// `INDEX:RANK` from a fault variable (tests), if it names this point.
pub fn fault_here(variable: &str, index: usize) -> Option<usize> {
    let value = std::env::var(variable).ok()?;
    let (point, rank) = value.split_once(':')?;
    (point.trim().parse::<usize>().ok()? == index)
        .then(|| rank.trim().parse().ok())
        .flatten()
}

/// The timeline file beside a launched point's rows file.
pub fn point_trace(rows: &Path) -> PathBuf {
    rows.with_extension("trace.json")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    /// The reason names the rank once, from the first rank's own line, the launcher's line about a
    /// dead rank, or the last line.
    #[test]
    fn a_failed_jobs_reason_names_its_rank() {
        let failed = ExitStatus::from_raw(1 << 8);
        for (log, reason) in [
            (
                "noise\nerror: MPI rank 2: rank 2: no message from rank 1 within 7.5 s\n",
                "rank 2: no message from rank 1 within 7.5 s",
            ),
            (
                "error: MPI rank 3: point 9 asked for; the spec has 4\n",
                "rank 3: point 9 asked for; the spec has 4",
            ),
            (
                "-----\nmpirun noticed that process rank 2 with PID 0 on node vm exited on signal 9 (Killed).\n-----\n",
                "rank 2 died on signal 9 (Killed) (mpirun)",
            ),
            ("srun: error: vm: task 1: Killed\n", "rank 1: Killed (srun)"),
            (
                "something\nlast words\n",
                "mpirun exited with exit status: 1: last words",
            ),
        ] {
            let launcher = match log.starts_with("srun") {
                true => LauncherName::Srun,
                false => LauncherName::Mpirun,
            };
            assert_eq!(failure_reason(log, failed, launcher), reason, "{log}");
        }
    }
}
