//! One sitting of `ringbench train`: the output directory's lock, the newest good checkpoint resumed
//! (or the run found finished), the steps with a resumable checkpoint every `checkpoint_every` steps
//! and when the sitting stops, then the final checkpoint (what `eval-lines` reads), metrics and loss
//! curve.

use super::checkpoint::load_checkpoint;
use super::data::{TrainData, read_conversations};
use super::metrics::{METRICS_FILE, MetricsRow, start_file};
use super::resume::{Checkpoints, FINISHED_FILE, RunState, resumable};
use super::spec::{Prompts, TrainSpec};
use super::start::Start;
use crate::dir_lock::DirLock;
use crate::pretrained::chat_template;
use crate::results::write_whole;
use anyhow::{Context, Result, bail};
use burn::module::AutodiffModule;
use burn::tensor::backend::{AutodiffBackend, Backend};
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::VecDeque;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;
use workbench::model::{Llama, LlamaConfig};
use workbench::train::{
    Example, Progress, Snapshot, StepLog, TrainError, TrainOptions, Trained, Watched, train_from,
};
use workbench::transport::Comm;
use workbench::{HostRead, LayerBackend};

/// Without `checkpoint_every`, a run saves once this long has passed since its last save, or
/// [`AUTO_COST_FACTOR`] times the last save's own duration if that is longer: a save costs at most
/// 2% of the run's time, and a kill loses about a minute.
const AUTO_MIN_SECONDS: f64 = 60.0;
/// See [`AUTO_MIN_SECONDS`].
const AUTO_COST_FACTOR: f64 = 50.0;
/// Steps the stop-loss mean is taken over.
const STOP_WINDOW: usize = 50;

/// Trains `spec` on backend `B` (every rank on `device`): on threads, as this process's rank under
/// mpirun, or over `comm` (NCCL). Rank 0 alone writes files; every rank reads the same checkpoint.
pub(super) fn train_with<B: AutodiffBackend<InnerBackend: HostRead> + LayerBackend>(
    spec: &TrainSpec,
    device: &B::Device,
    comm: Option<Comm>,
    force: bool,
) -> Result<()> {
    // The sitting's memory: everything it allocates from here (models, optimizer state,
    // activations, the ring's buffers) on every rank thread of this process.
    crate::alloc::reset();
    let start_from_model = Start::of(&spec.model)?;
    let (config, tokenizer) = (start_from_model.config(), start_from_model.tokenizer());
    let t = &spec.train;
    let lora = spec.lora.as_ref();
    if let (Some(init), Some(hf), None) = (&t.init, &spec.model.hf, lora) {
        bail!(
            "train.init = {} and model.hf = {} both name starting weights; keep one (with [lora], \
             train.init names an adapter to continue on model.hf)",
            init.display(),
            hf.display()
        );
    }
    if let Some(lora) = lora {
        lora.validate().context("[lora]")?;
        if spec.model.hf.is_none() {
            bail!(
                "[lora] adapts a pretrained model: give model.hf (a Hugging Face directory or GGUF file)"
            );
        }
    }
    let partition = strategies::by_name(&spec.ring.strategy)?;
    let mut options = t.schedule().options(spec.ring.ranks, spec.ring.config()?);
    // Padding is masked out; it only has to be a token of the vocabulary.
    options.pad_token = tokenizer.eos();
    let every = t.checkpoint_every()?;
    // The whole spec is checked before the directory is looked at: a bad one is refused even where
    // a finished run lies.
    strategies::check_ranks(options.ranks)?;
    let prompts = Prompts {
        seed: t.seed,
        batch: t.batch,
        min_lines: t.min_lines,
        num_lines: t.num_lines,
        questions: t.questions,
        lm_weight: t.lm_weight,
    };
    if t.steps == 0 {
        bail!("train.steps = 0 (or --steps 0): train at least 1 step");
    }
    let template = match (&start_from_model, t.chat || t.conversations.is_some()) {
        (_, false) => None,
        (
            Start::Hf {
                dir,
                config,
                tokenizer,
            },
            true,
        ) => Some(chat_template(dir, &tokenizer.tokenizer, config)?),
        (Start::Own { .. }, true) => {
            bail!("train.chat and train.conversations need a model with a chat template (model.hf)")
        }
    };
    let data = match (&t.conversations, &template) {
        (Some(path), Some(chat)) => TrainData::Conversations {
            all: read_conversations(path).context("train.conversations")?,
            batch: t.batch,
            seed: t.seed,
            chat,
            lm_weight: t.lm_weight,
        },
        _ => {
            prompts.check().context("train")?;
            // Every case is made of these strings: a tokenizer that encodes them encodes every
            // step's prompts (checked here, so that no step fails later).
            tokenizer
                .text_ids(&datasets::line_retrieval::every_string())
                .context(
                    "train: the tokenizer cannot encode the line-retrieval prompts' strings",
                )?;
            match &template {
                Some(chat) => TrainData::ChatLines(prompts, chat),
                None => TrainData::Lines(prompts),
            }
        }
    };
    // Step 0's examples are made now: a template or conversation that fails fails here.
    data.batch(tokenizer, 0)
        .context("train: step 0's examples")?;
    let spec_text = toml::to_string(spec)?;
    let rank = match &comm {
        Some(comm) => comm.rank(),
        None => crate::mpi_rank::launcher_rank().unwrap_or(0),
    };
    let writer = rank == 0;
    let _lock = if writer {
        std::fs::create_dir_all(&t.out).with_context(|| format!("creating {}", t.out.display()))?;
        Some(DirLock::take(&t.out)?)
    } else {
        None
    };
    let checkpoints = Checkpoints::of(&t.out);
    if writer {
        checkpoints.remove_unfinished()?;
    }
    let finished_path = t.out.join(FINISHED_FILE);
    let found = if force {
        if writer {
            checkpoints.clear()?;
            let _ = std::fs::remove_file(&finished_path);
        }
        None
    } else {
        if finished_path.exists() {
            let state: RunState = serde_json::from_slice(&std::fs::read(&finished_path)?)
                .map_err(|e| anyhow::anyhow!("{}: {e}", finished_path.display()))?;
            resumable(&state.spec, &spec_text, &finished_path)?;
            println!(
                "{}: finished ({} of {} steps); nothing to do (--force trains it again from step 0)",
                t.out.display(),
                state.steps_done,
                state.steps
            );
            return Ok(());
        }
        let found = checkpoints.latest()?;
        if found.is_none() && t.out.join("model.mpk").exists() {
            bail!(
                "{} holds a trained model but no record of its run (written by an earlier \
                 ringbench): --force trains it again from step 0",
                t.out.display()
            );
        }
        found
    };
    let (model, start, optimizer, rows, elapsed_before) = match &found {
        Some(found) => {
            let ring = resumable(&found.state.spec, &spec_text, &found.dir)?;
            let resumed = Checkpoints::load::<B>(found, config, lora, device)?;
            println!(
                "resuming from step {} of {} ({}){}",
                found.state.steps_done,
                found.state.steps,
                found.dir.display(),
                if ring.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; on another ring ({}): the same losses up to rounding, not bit for bit",
                        ring.join(", ")
                    )
                }
            );
            (
                resumed.model,
                found.state.steps_done,
                Some(resumed.optimizer),
                resumed.metrics,
                found.state.elapsed_seconds,
            )
        }
        None => {
            let model = match (&t.init, lora) {
                (init, Some(lora)) => {
                    start_from_model.adapted::<B>(lora, init.as_deref(), t.seed, device)?
                }
                (None, None) => start_from_model.weights::<B>(t.seed, device)?,
                (Some(dir), None) => start_from::<B>(dir, config, device)?,
            };
            (model, 0, None, Vec::new(), 0.0)
        }
    };
    if writer {
        write_whole(&t.out.join("train.toml"), spec_text.as_bytes())?;
    }
    if start == 0 {
        let what = match lora {
            Some(lora) => format!(
                "LoRA adapters (r = {}, alpha = {}, {} of {} parameters trainable)",
                lora.rank,
                lora.alpha,
                trainable_params(&model),
                config.num_params()
            ),
            None => format!("{} parameters", config.num_params()),
        };
        let data_said = match &data {
            TrainData::Conversations { all, .. } => {
                format!(
                    "{} conversations from {}",
                    all.len(),
                    t.conversations
                        .as_ref()
                        .map_or(String::new(), |p| p.display().to_string())
                )
            }
            TrainData::ChatLines(..) => {
                format!("chat prompts with {}..={} lines", t.min_lines, t.num_lines)
            }
            TrainData::Lines(_) => format!("prompts with {}..={} lines", t.min_lines, t.num_lines),
        };
        println!(
            "training {what}{} on {} ranks ({}), {} steps of {} {data_said}{}",
            t.init
                .as_ref()
                .or(spec.model.hf.as_ref())
                .map(|d| format!(" from {}", d.display()))
                .unwrap_or_default(),
            options.ranks,
            spec.ring.strategy,
            t.steps,
            t.batch,
            match t.questions {
                1 => String::new(),
                q => format!(", {q} questions each"),
            }
        );
    }
    let batch_for = |step: usize| {
        data.batch(tokenizer, step)
            .expect("the tokenizer encoded every string a prompt is made of before step 0")
    };
    let bar = ProgressBar::new(t.steps as u64).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {elapsed_precise} eta {eta} {msg}")
            .context("template")?,
    );
    bar.set_position(start as u64);
    // Only rank 0 writes metrics (another MPI rank must not truncate the file).
    let metrics_file = Mutex::new(if writer {
        Some(start_file(&t.out.join(METRICS_FILE), &rows)?)
    } else {
        None
    });
    let recent: VecDeque<f64> = rows
        .iter()
        .rev()
        .take(STOP_WINDOW)
        .rev()
        .map(|r| r.loss)
        .collect();
    let recent = Mutex::new(recent);
    let rows = Mutex::new(rows);
    let sitting = Instant::now();
    let stop = AtomicBool::new(false);
    let out_of_time = AtomicBool::new(false);
    let on_step = |log: &StepLog| {
        let tokens_per_s = log.tokens as f64 / log.seconds;
        bar.set_message(format!(
            "loss {:.4} lr {:.2e} {:.0} tok/s",
            log.loss, log.lr, tokens_per_s
        ));
        bar.inc(1);
        let row = MetricsRow {
            step: log.step,
            loss: log.loss,
            lr: log.lr,
            tokens_per_second: tokens_per_s,
            elapsed_seconds: elapsed_before + sitting.elapsed().as_secs_f64(),
        };
        if let Some(w) = lock(&metrics_file).as_mut() {
            // The file is a record of the run, not the run: a full disk must not stop training
            // (the checkpoints keep every row, and a failed checkpoint does stop it).
            let _ = w.write(&row);
        }
        lock(&rows).push(row);
        let mut r = lock(&recent);
        r.push_back(log.loss);
        if r.len() > STOP_WINDOW {
            r.pop_front();
        }
        let mean = r.iter().sum::<f64>() / r.len() as f64;
        let late = t.max_minutes > 0.0 && sitting.elapsed().as_secs_f64() > t.max_minutes * 60.0;
        if late {
            out_of_time.store(true, Ordering::Relaxed);
        }
        if (t.stop_loss > 0.0 && r.len() == STOP_WINDOW && mean < t.stop_loss) || late {
            stop.store(true, Ordering::Relaxed);
        }
        if bar.is_hidden() && log.step.is_multiple_of(50) {
            println!(
                "step {} loss {:.4} lr {:.2e} {:.0} tok/s",
                log.step, log.loss, log.lr, tokens_per_s
            );
        }
    };
    // When the last save ended and how long it took (the automatic schedule's clock).
    let last_save = Mutex::new((Instant::now(), 0.0f64));
    let after_step = |snap: &Snapshot<'_, B, Llama<B>>| -> Result<(), TrainError> {
        let (since, took) = *lock(&last_save);
        let due = snap.stopping
            || snap.steps_done == t.steps
            || match every {
                Some(k) => snap.steps_done.is_multiple_of(k),
                None => {
                    since.elapsed().as_secs_f64() >= AUTO_MIN_SECONDS.max(AUTO_COST_FACTOR * took)
                }
            };
        if !due {
            return Ok(());
        }
        let saving = Instant::now();
        let state = RunState {
            steps_done: snap.steps_done,
            steps: t.steps,
            spec: spec_text.clone(),
            elapsed_seconds: elapsed_before + sitting.elapsed().as_secs_f64(),
        };
        let rows = lock(&rows).clone();
        checkpoints
            .save(&state, snap.model, snap.optimizer, &rows)
            .map_err(|e| TrainError::Save {
                steps_done: snap.steps_done,
                message: format!("{e:#}"),
            })?;
        *lock(&last_save) = (Instant::now(), saving.elapsed().as_secs_f64());
        Ok(())
    };
    let run = Watched {
        on_step: &on_step,
        stop: &stop,
        progress: Progress {
            start,
            optimizer,
            after_step: Some(&after_step),
        },
    };
    let comm_is_some = comm.is_some();
    let trained = run_training(comm, model, partition, &options, batch_for, run)?;
    let Some(trained) = trained else {
        return Ok(()); // a rank other than 0 of a launcher: rank 0 writes the checkpoint
    };
    bar.finish();
    let steps_done = start + trained.losses.len();
    let losses: Vec<f64> = lock(&rows).iter().map(|r| r.loss).collect();
    start_from_model.save(&t.out, &trained.model.valid(), lora)?;
    loss_curve(&t.out.join("loss.svg"), &losses)?;
    let minutes = sitting.elapsed().as_secs_f64() / 60.0;
    let peak = peak_per_rank(options.ranks, comm_is_some);
    if out_of_time.load(Ordering::Relaxed) && steps_done < t.steps {
        println!(
            "stopped at step {steps_done} of {} after this sitting's max_minutes = {} ({minutes:.1} \
             min); the model so far is in {}; run the same command to resume; {peak}",
            t.steps,
            t.max_minutes,
            t.out.display()
        );
        return Ok(());
    }
    let state = RunState {
        steps_done,
        steps: t.steps,
        spec: spec_text,
        elapsed_seconds: elapsed_before + sitting.elapsed().as_secs_f64(),
    };
    write_whole(&finished_path, &serde_json::to_vec_pretty(&state)?)?;
    println!(
        "trained {steps_done} steps ({} in this sitting, {minutes:.1} min); final loss {:.4}; \
         checkpoint in {}; {peak}",
        trained.losses.len(),
        losses.last().copied().unwrap_or(f64::NAN),
        t.out.display()
    );
    Ok(())
}

/// Values in the parameters that train (a LoRA run's adapters, and its norms or embedding if
/// they train).
fn trainable_params<B: AutodiffBackend>(model: &Llama<B>) -> usize {
    use burn::module::{Module, ModuleVisitor, Param};
    struct Count(usize);
    impl<B: AutodiffBackend> ModuleVisitor<B> for Count {
        fn visit_float<const D: usize>(&mut self, param: &Param<burn::tensor::Tensor<B, D>>) {
            let v = param.val();
            if v.is_require_grad() {
                self.0 += v.shape().num_elements();
            }
        }
    }
    let mut count = Count(0);
    model.visit(&mut count);
    count.0
}

/// The sitting's peak memory per rank, as its last line says it: the counting allocator's peak
/// since the sitting began, over the rank threads of this process (one under a launcher).
fn peak_per_rank(ranks: usize, over_launcher: bool) -> String {
    if !crate::alloc::active() {
        return "peak memory per rank not measured (the counting allocator is not installed)"
            .into();
    }
    let threads = if over_launcher || crate::mpi_rank::launcher_rank().is_some() {
        1
    } else {
        ranks
    };
    let peak = crate::alloc::stats().peak_above_start as f64 / crate::units::MIB;
    format!(
        "peak memory {:.1} MiB per rank ({peak:.1} MiB over this process's {threads} rank(s))",
        peak / threads as f64
    )
}

/// A poisoned lock only means a step's report panicked; its data stays usable.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Redraws `OUT/loss.svg` from `OUT/metrics.csv` (`ringbench train --replot`): a figure drawn by
/// an older ringbench, without training.
pub fn replot(out: &Path) -> Result<()> {
    let rows = super::metrics::read_rows(&out.join(super::metrics::METRICS_FILE))?;
    if rows.is_empty() {
        bail!(
            "{}: no steps to plot",
            out.join(super::metrics::METRICS_FILE).display()
        );
    }
    let losses: Vec<f64> = rows.iter().map(|r| r.loss).collect();
    loss_curve(&out.join("loss.svg"), &losses)?;
    println!(
        "{}: redrew loss.svg from {} steps",
        out.display(),
        losses.len()
    );
    Ok(())
}

/// The loss curve: the mean over windows of up to 50 steps, so that it is readable at thousands of
/// steps.
fn loss_curve(path: &Path, losses: &[f64]) -> Result<()> {
    let window = losses.len().div_ceil(200).clamp(1, 50);
    let curve = losses
        .chunks(window)
        .enumerate()
        .map(|(i, c)| ((i * window) as f64, c.iter().sum::<f64>() / c.len() as f64))
        .collect();
    let chart = crate::plot::Chart {
        title: "Training loss (weighted next-token cross-entropy)",
        x: crate::plot::Axis::new("step", crate::plot::Scale::Linear),
        y: crate::plot::Axis::new("loss", crate::plot::Scale::Linear),
    };
    crate::plot::line_chart(
        path,
        &chart,
        vec![crate::plot::Series {
            name: format!("mean over {window} steps"),
            points: curve,
        }],
    )
}

/// The weights of the checkpoint in `dir`, which must have the architecture `config` describes
/// (feed-forward chunking and checkpointing may differ: they do not change the weights), rotated
/// as `config` says (a context extension may change RoPE's base and scaling).
fn start_from<B: Backend>(
    dir: &Path,
    config: &LlamaConfig,
    device: &B::Device,
) -> Result<Llama<B>> {
    let (model, found, _) = load_checkpoint::<B>(dir, device)?;
    let comparable = found
        .clone()
        .with_ffn_chunk(config.ffn_chunk)
        .with_checkpoint(config.checkpoint)
        .with_rope_theta(config.rope_theta)
        .with_rope_scaling(config.rope_scaling);
    if &comparable != config {
        bail!(
            "train.init = {}: the checkpoint's model ({found:?}) is not the spec's [model] ({config:?})",
            dir.display()
        );
    }
    Ok(model.with_trunk_of(config))
}

/// Trains as this process's rank over `comm` (NCCL), or, under `mpirun`, over MPI (a failing rank
/// aborts the whole job at once), or else on in-process threads. Only rank 0 gets the model back.
fn run_training<B, F>(
    comm: Option<Comm>,
    model: Llama<B>,
    partition: &dyn strategies::Partition,
    options: &TrainOptions,
    batch_for: F,
    run: Watched<'_, B, Llama<B>>,
) -> Result<Option<Trained<Llama<B>>>>
where
    B: AutodiffBackend<InnerBackend: HostRead> + LayerBackend,
    F: Fn(usize) -> Vec<Example> + Sync,
{
    if let Some(comm) = comm {
        let trained = workbench::train::train_on(comm, model, partition, options, &batch_for, run);
        return Ok(trained?);
    }
    // Under mpirun the run moves into the rank's closure; it comes back unused otherwise.
    let run = Mutex::new(Some(run));
    let ranked = crate::mpi_rank::as_mpi_rank(options.timeout, |comm| {
        let run = lock(&run).take().expect("one MPI rank runs once");
        workbench::train::train_on(comm, model.clone(), partition, options, &batch_for, run)
    })?;
    if let Some((_, trained)) = ranked {
        return Ok(trained);
    }
    let run = lock(&run)
        .take()
        .expect("the run was not used by an MPI rank");
    Ok(Some(train_from(model, partition, options, batch_for, run)?))
}
