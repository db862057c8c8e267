//! A training run that outlives its sitting: resumable checkpoints under `OUT/resume/step-NNNNNNN/`
//! (the model, AdamW's state, the run's position and spec, the metrics so far, and a manifest of
//! every file's size and CRC-32), each written whole into a temporary directory, synced, and renamed
//! into place; the newest good one found again, a bad one refused naming its file; another spec's
//! refused naming the key that differs.

use super::checkpoint::load_model_file;
use super::metrics::{METRICS_FILE, MetricsRow, csv_bytes, read_rows};
use crate::results::write_whole;
use anyhow::{Context, Result, anyhow, bail};
use burn::module::Module;
use burn::optim::Optimizer;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder, Recorder};
use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};
use std::io::Read;
use std::path::{Path, PathBuf};
use workbench::model::{Llama, LlamaConfig, LoraConfig};
use workbench::train::{OptimizerRecord, TrainOptimizer};

/// The folder of a run's resumable checkpoints, inside its `out`.
pub const RESUME_DIR: &str = "resume";
/// The file that says a run finished, inside its `out` (a [`RunState`]).
pub const FINISHED_FILE: &str = "finished.json";
/// The run's position and spec.
const STATE_FILE: &str = "state.json";
/// Every other file's size and CRC-32; written last, so a checkpoint without it is incomplete.
const MANIFEST_FILE: &str = "manifest.json";
/// The model's weights (Burn's named MessagePack, full precision: the saved bits are the weights').
const MODEL_FILE: &str = "model.mpk";
/// AdamW's moments and step count of every parameter.
const OPTIMIZER_FILE: &str = "optimizer.mpk";
/// Checkpoints kept: the newest and the one before it.
const KEPT: usize = 2;
/// Test hook: `RINGBENCH_TEST_CRASH_IN_SAVE=K` kills the process (SIGKILL: no cleanup) while it
/// writes the checkpoint after step K, between the model file and the optimizer's.
pub const CRASH_IN_SAVE: &str = "RINGBENCH_TEST_CRASH_IN_SAVE";

/// Spec keys that may differ between a checkpoint and the run that resumes it: they change neither
/// a step's loss nor the schedule, only when the run pauses, stops, saves or checks itself.
const FREE_KEYS: &[&str] = &[
    "train.max_minutes",
    "train.checkpoint_every",
    "train.checksum_every",
    "train.stop_loss",
    "train.out",
];

/// Where a run stands: what a checkpoint's `state.json` and a finished run's `finished.json` hold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunState {
    /// Steps done: a run resumed from here starts at this step.
    pub steps_done: usize,
    /// The spec's steps.
    pub steps: usize,
    /// The training spec as TOML (what a resumed run's spec is compared with).
    pub spec: String,
    /// Seconds trained so far, over every sitting.
    pub elapsed_seconds: f64,
}

/// One file of a checkpoint as the manifest records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct FileEntry {
    name: String,
    bytes: u64,
    crc32: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Manifest {
    files: Vec<FileEntry>,
}

/// A checkpoint whose every file matched its manifest.
#[derive(Debug, Clone)]
pub struct Found {
    /// Its folder.
    pub dir: PathBuf,
    /// Where the run stood.
    pub state: RunState,
}

/// What a run resumes with.
pub struct Resumed<B: AutodiffBackend> {
    /// The model after the checkpoint's steps.
    pub model: Llama<B>,
    /// AdamW's state then.
    pub optimizer: OptimizerRecord<Llama<B>, B>,
    /// Every step's metrics row so far.
    pub metrics: Vec<MetricsRow>,
}

fn recorder() -> NamedMpkFileRecorder<FullPrecisionSettings> {
    NamedMpkFileRecorder::<FullPrecisionSettings>::new()
}

/// The checkpoints of the run writing into `out`.
#[derive(Debug, Clone)]
pub struct Checkpoints {
    dir: PathBuf,
}

impl Checkpoints {
    /// The checkpoints of the run whose `out` is `out`.
    pub fn of(out: &Path) -> Checkpoints {
        Checkpoints {
            dir: out.join(RESUME_DIR),
        }
    }

    fn step_dir(&self, steps_done: usize) -> PathBuf {
        self.dir.join(format!("step-{steps_done:07}"))
    }

    /// Writes the run after `state.steps_done` steps, whole or not at all: every file into a
    /// temporary folder, each synced, the manifest last, then the folder renamed into place and the
    /// parent synced; then all but the newest two checkpoints are removed. Returns its folder.
    pub fn save<B: AutodiffBackend>(
        &self,
        state: &RunState,
        model: &Llama<B>,
        optimizer: &TrainOptimizer<Llama<B>, B>,
        metrics: &[MetricsRow],
    ) -> Result<PathBuf> {
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("creating {}", self.dir.display()))?;
        let target = self.step_dir(state.steps_done);
        let temporary = self.dir.join(format!(
            ".step-{:07}.{}.tmp",
            state.steps_done,
            std::process::id()
        ));
        if temporary.exists() {
            std::fs::remove_dir_all(&temporary)?;
        }
        std::fs::create_dir(&temporary)
            .with_context(|| format!("creating {}", temporary.display()))?;
        let written = (|| -> Result<()> {
            let strip = |name: &str| temporary.join(name.trim_end_matches(".mpk"));
            model
                .clone()
                .save_file(strip(MODEL_FILE), &recorder())
                .map_err(|e| anyhow!("{}: {e}", temporary.join(MODEL_FILE).display()))?;
            if std::env::var(CRASH_IN_SAVE).ok() == Some(state.steps_done.to_string()) {
                workbench::transport::kill_this_process();
            }
            recorder()
                .record(optimizer.to_record(), strip(OPTIMIZER_FILE))
                .map_err(|e| anyhow!("{}: {e}", temporary.join(OPTIMIZER_FILE).display()))?;
            std::fs::write(temporary.join(METRICS_FILE), csv_bytes(metrics)?)?;
            std::fs::write(
                temporary.join(STATE_FILE),
                serde_json::to_vec_pretty(state)?,
            )?;
            let mut files = Vec::new();
            for name in [MODEL_FILE, OPTIMIZER_FILE, METRICS_FILE, STATE_FILE] {
                let path = temporary.join(name);
                std::fs::File::open(&path)?.sync_all()?;
                let (bytes, crc32) = size_and_crc(&path)?;
                files.push(FileEntry {
                    name: name.into(),
                    bytes,
                    crc32,
                });
            }
            write_whole(
                &temporary.join(MANIFEST_FILE),
                &serde_json::to_vec_pretty(&Manifest { files })?,
            )?;
            sync_dir(&temporary)?;
            if target.exists() {
                std::fs::remove_dir_all(&target)?;
            }
            std::fs::rename(&temporary, &target)?;
            sync_dir(&self.dir)
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_dir_all(&temporary);
            return Err(e.context(format!("writing checkpoint {}", target.display())));
        }
        for old in self.saved()?.into_iter().skip(KEPT) {
            std::fs::remove_dir_all(&old.1)
                .with_context(|| format!("removing {}", old.1.display()))?;
        }
        Ok(target)
    }

    /// The checkpoint folders, newest first, as (steps done, folder); temporary folders (a save
    /// that never finished) are not among them.
    fn saved(&self) -> Result<Vec<(usize, PathBuf)>> {
        if !self.dir.is_dir() {
            return Ok(Vec::new());
        }
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&self.dir)
            .with_context(|| format!("reading {}", self.dir.display()))?
        {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(steps) = name
                .strip_prefix("step-")
                .and_then(|n| n.parse::<usize>().ok())
            {
                found.push((steps, entry.path()));
            }
        }
        found.sort_by_key(|f| std::cmp::Reverse(f.0));
        Ok(found)
    }

    /// The newest checkpoint whose every file matches its manifest. A checkpoint that does not
    /// (a truncated or altered file, a missing manifest) is refused with one line naming the file
    /// and the next older one is tried; an error when checkpoints exist and none is good.
    pub fn latest(&self) -> Result<Option<Found>> {
        let saved = self.saved()?;
        let mut refused = Vec::new();
        for (_, dir) in &saved {
            match verify(dir) {
                Ok(state) => {
                    return Ok(Some(Found {
                        dir: dir.clone(),
                        state,
                    }));
                }
                Err(e) => {
                    eprintln!("refusing checkpoint {}: {e:#}", dir.display());
                    refused.push(format!("{e:#}"));
                }
            }
        }
        if refused.is_empty() {
            return Ok(None);
        }
        bail!(
            "no good checkpoint in {}: {} refused (above); train with --force to start afresh",
            self.dir.display(),
            refused.len()
        )
    }

    /// Loads `found` onto `device` for a model of `config` (adapted by `lora` in a LoRA run): the
    /// weights (their shapes checked against the config), AdamW's state, the metrics so far.
    pub fn load<B: AutodiffBackend>(
        found: &Found,
        config: &LlamaConfig,
        lora: Option<&LoraConfig>,
        device: &B::Device,
    ) -> Result<Resumed<B>> {
        let model = load_model_file::<B>(&found.dir.join(MODEL_FILE), config, lora, device)?;
        let file = found.dir.join(OPTIMIZER_FILE);
        let optimizer = recorder()
            .load::<OptimizerRecord<Llama<B>, B>>(file.with_extension(""), device)
            .map_err(|e| anyhow!("{}: {e}", file.display()))?;
        let metrics = read_rows(&found.dir.join(METRICS_FILE))?;
        if metrics.len() != found.state.steps_done
            || metrics.iter().enumerate().any(|(i, row)| row.step != i)
        {
            bail!(
                "{}: {} rows for {} steps done",
                found.dir.join(METRICS_FILE).display(),
                metrics.len(),
                found.state.steps_done
            );
        }
        Ok(Resumed {
            model,
            optimizer,
            metrics,
        })
    }

    /// Removes the temporary folders of saves that never finished (a process killed while it
    /// saved); only the directory's lock holder may call it.
    pub fn remove_unfinished(&self) -> Result<()> {
        if !self.dir.is_dir() {
            return Ok(());
        }
        for entry in std::fs::read_dir(&self.dir)? {
            let path = entry?.path();
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            if name.is_some_and(|n| n.starts_with(".step-") && n.ends_with(".tmp")) {
                std::fs::remove_dir_all(&path)
                    .with_context(|| format!("removing {}", path.display()))?;
            }
        }
        Ok(())
    }

    /// Removes every checkpoint (a run started afresh).
    pub fn clear(&self) -> Result<()> {
        if self.dir.exists() {
            std::fs::remove_dir_all(&self.dir)
                .with_context(|| format!("removing {}", self.dir.display()))?;
        }
        Ok(())
    }
}

/// The checkpoint's state after checking every file against the manifest; an error names the file.
fn verify(dir: &Path) -> Result<RunState> {
    let manifest_path = dir.join(MANIFEST_FILE);
    let text = std::fs::read(&manifest_path)
        .with_context(|| format!("{}: missing", manifest_path.display()))?;
    let manifest: Manifest = serde_json::from_slice(&text)
        .map_err(|e| anyhow!("{}: not a manifest: {e}", manifest_path.display()))?;
    for name in [MODEL_FILE, OPTIMIZER_FILE, METRICS_FILE, STATE_FILE] {
        if !manifest.files.iter().any(|f| f.name == name) {
            bail!("{}: does not list {name}", manifest_path.display());
        }
    }
    for entry in &manifest.files {
        let path = dir.join(&entry.name);
        let (bytes, crc32) =
            size_and_crc(&path).with_context(|| format!("{}: unreadable", path.display()))?;
        if bytes != entry.bytes {
            bail!(
                "{}: {bytes} bytes where the manifest says {} (truncated or replaced)",
                path.display(),
                entry.bytes
            );
        }
        if crc32 != entry.crc32 {
            bail!(
                "{}: CRC-32 {crc32:08x} where the manifest says {:08x} (corrupt)",
                path.display(),
                entry.crc32
            );
        }
    }
    let path = dir.join(STATE_FILE);
    serde_json::from_slice(&std::fs::read(&path)?)
        .map_err(|e| anyhow!("{}: not a run state: {e}", path.display()))
}

/// A file's size and CRC-32.
fn size_and_crc(path: &Path) -> Result<(u64, u32)> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = crc32fast::Hasher::new();
    let mut buffer = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    loop {
        let n = file.read(&mut buffer)?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
        bytes += n as u64;
    }
    Ok((bytes, hasher.finalize()))
}

/// Syncs a folder's entries (a rename into it, a file created in it) to disk.
fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing {}", dir.display()))
}

/// Whether the run saved in `saved` (a spec's TOML) may be resumed by `ours`: an error naming the
/// first key whose value differs (and where the checkpoint is), except the keys that change no
/// step (`max_minutes`, `checkpoint_every`, `checksum_every`, `stop_loss`, `out`); the `[ring]`
/// keys that differ are returned (the ring is exact: another ring gives the same losses up to
/// rounding, not bit for bit).
pub fn resumable(saved: &str, ours: &str, at: &Path) -> Result<Vec<String>> {
    let table = |text: &str| -> Result<toml::Table> {
        toml::from_str(text).map_err(|e| anyhow!("{}: the saved spec: {e}", at.display()))
    };
    let (saved, ours) = (table(saved)?, table(ours)?);
    let mut ring = Vec::new();
    let empty = toml::Table::new();
    let sections: std::collections::BTreeSet<&String> = saved.keys().chain(ours.keys()).collect();
    for section in sections {
        let section_of = |t: &'_ toml::Table| -> toml::Table {
            match t.get(section.as_str()) {
                Some(toml::Value::Table(s)) => s.clone(),
                _ => empty.clone(),
            }
        };
        let (a, b) = (section_of(&saved), section_of(&ours));
        let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
        for key in keys {
            let (x, y) = (a.get(key.as_str()), b.get(key.as_str()));
            if x == y {
                continue;
            }
            let name = format!("{section}.{key}");
            let shown =
                |v: Option<&toml::Value>| v.map_or("(absent)".to_owned(), |v| v.to_string());
            if FREE_KEYS.contains(&name.as_str()) {
                continue;
            }
            if section == "ring" {
                ring.push(format!("{name} {} -> {}", shown(x), shown(y)));
                continue;
            }
            bail!(
                "{}: saved by a run whose {name} = {}, but this spec says {}: not resuming \
                 (train with --force to start afresh, or give this spec another train.out)",
                at.display(),
                shown(x),
                shown(y)
            );
        }
    }
    Ok(ring)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_specs_checkpoint_is_refused_naming_the_key() {
        let saved =
            "[model]\nd_model = 32\n[ring]\nranks = 2\n[train]\nsteps = 10\nmax_minutes = 5.0\n";
        let at = Path::new("out/resume/step-0000004");
        assert_eq!(resumable(saved, saved, at).unwrap(), Vec::<String>::new());
        let freer = saved.replace(
            "max_minutes = 5.0",
            "max_minutes = 0.0\ncheckpoint_every = 3",
        );
        assert!(resumable(saved, &freer, at).unwrap().is_empty());
        let ring = resumable(saved, &saved.replace("ranks = 2", "ranks = 4"), at).unwrap();
        assert_eq!(ring, vec!["ring.ranks 2 -> 4".to_owned()]);
        for (ours, key) in [
            (
                saved.replace("d_model = 32", "d_model = 64"),
                "model.d_model = 32",
            ),
            (
                saved.replace("steps = 10", "steps = 20"),
                "train.steps = 10",
            ),
            (
                saved.replace("steps = 10", "steps = 10\nseed = 3"),
                "train.seed = (absent)",
            ),
        ] {
            let error = resumable(saved, &ours, at).unwrap_err().to_string();
            assert!(
                error.contains(key) && error.contains("step-0000004"),
                "{error}"
            );
            assert_eq!(error.lines().count(), 1, "{error}");
        }
    }
}
