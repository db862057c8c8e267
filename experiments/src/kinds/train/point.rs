//! One point of the `train` kind: a training run of the line-retrieval model, its losses against the
//! sweep's first run of the same seed, its speed and memory, and its accuracy when asked.

use super::*;

#[derive(Debug, Serialize)]
struct Row {
    strategy: &'static str,
    forward: String,
    backward: String,
    ranks: usize,
    seed: u64,
    /// Empty unless the sweep has a dtypes axis.
    dtype: Option<String>,
    /// Empty unless the sweep has a ulysses axis.
    ulysses: Option<usize>,
    task: String,
    steps: usize,
    first_loss: f64,
    final_loss: f64,
    /// Largest |loss − first run's loss| / |first run's loss| over the steps, against the sweep's
    /// first run with the same seed.
    max_rel_loss_diff: f64,
    tokens_per_s: f64,
    engine_peak_mib_per_rank: f64,
    wall_seconds: f64,
}

pub(super) fn prompts(task: &Task, train: &TrainSection, seed: u64) -> Prompts {
    Prompts {
        seed,
        batch: train.batch,
        min_lines: task.min_lines,
        num_lines: task.num_lines,
        questions: task.questions,
        lm_weight: task.lm_weight,
    }
}

fn key(run: &Run) -> Record {
    let mut key = Record::new([
        ("strategy", run.strategy.name().to_string()),
        ("forward", run.forward.to_string()),
        ("backward", run.backward.to_string()),
        ("ranks", run.ranks.to_string()),
        ("seed", run.seed.to_string()),
    ]);
    if let Some(dtype) = run.dtype {
        key.0.push(("dtype".into(), dtype.to_string()));
    }
    if let Some(ulysses) = run.ulysses {
        key.0.push(("ulysses".into(), ulysses.to_string()));
    }
    key
}

impl Plan for TrainPlan {
    fn points(&self) -> Vec<Point> {
        self.runs.iter().map(|r| Point::single(key(r))).collect()
    }

    fn processes(&self, index: usize) -> Option<usize> {
        Some(self.runs[index].ranks)
    }

    /// A run and the sweep's first run of its seed and element type (its loss baseline) share a
    /// shard.
    fn shard_group(&self, point: &Point) -> Record {
        Record(
            point
                .key
                .0
                .iter()
                .filter(|(c, _)| c == "seed" || c == "dtype")
                .cloned()
                .collect(),
        )
    }

    fn compute(&mut self, index: usize, context: &PointContext) -> Result<Vec<Record>> {
        let run = self.runs[index];
        let tokenizer = Tokenizer::line_retrieval();
        let config = self.model.config(tokenizer.vocab_size())?;
        let t = &self.train;
        let ring = RingConfig {
            causal: true,
            forward: run.forward,
            backward: run.backward,
            kernel: Kernel::Fused,
            scale: None,
            window: None,
            softcap: None,
            lockstep: false,
            precision: Precision {
                dtype: run.dtype.unwrap_or_default(),
                merge: Dtype::F32,
            },
        };
        let schedule = Schedule {
            steps: t.steps,
            lr: t.lr,
            warmup_steps: t.warmup_steps,
            min_lr_ratio: t.min_lr_ratio,
            weight_decay: t.weight_decay,
            grad_clip: t.grad_clip,
            pack: t.pack,
            checksum_every: 0,
        };
        let options = workbench::train::TrainOptions {
            ulysses: run.ulysses.unwrap_or(1),
            ..schedule.options(run.ranks, ring)
        };
        let prompts = prompts(&self.task, t, run.seed);
        let device = Default::default();
        let model = seeded::<Train, _>(run.seed, &device, || config.init::<Train>(&device));
        let tokens = Mutex::new(0usize);
        let engine_peak = Mutex::new(0u64);
        let start = Instant::now();
        let batch_for = |step| {
            prompts
                .batch(&tokenizer, step)
                .expect("the piece tokenizer encodes any text")
        };
        let on_step = |log: &StepLog| {
            *tokens.lock().expect("tokens") += log.tokens;
            let mut peak = engine_peak.lock().expect("peak");
            *peak = (*peak).max(log.engine_peak_bytes);
            context.bar.set_message(format!(
                "{} step {} loss {:.4}",
                key(&run).id(KEYS),
                log.step,
                log.loss
            ));
        };
        let never = AtomicBool::new(false);
        // In a process launched as one rank of the point's job, this rank's share of the run; rank 0
        // alone gets the model back and writes the row (and the curves).
        let trained = match crate::mpi_rank::world_comm(options.timeout)? {
            Some(comm) => {
                let watched = Watched {
                    on_step: &on_step,
                    stop: &never,
                    progress: Progress::default(),
                };
                match train_on(comm, model, run.strategy, &options, batch_for, watched)? {
                    Some(trained) => trained,
                    None => return Ok(Vec::new()),
                }
            }
            None => train(model, run.strategy, &options, batch_for, on_step, &never)?,
        };
        let wall = start.elapsed().as_secs_f64();
        let losses = trained.losses;
        let curves_path = context.dir.join(CURVES);
        let mut curves = Table::read(&curves_path)?;
        // The sweep's first run with this seed and element type is the baseline (from this run or
        // an earlier one).
        let first = self
            .runs
            .iter()
            .find(|r| r.seed == run.seed && r.dtype == run.dtype)
            .expect("this run's seed");
        let baseline = match self.baselines.get(&(run.seed, run.dtype)) {
            Some(b) => b.clone(),
            None if std::ptr::eq(first, &self.runs[index]) => losses.clone(),
            None => {
                let first_key = key(first);
                let b: Vec<f64> = curves
                    .rows
                    .iter()
                    .filter(|r| r.matches(&first_key))
                    .map(|r| r.num("loss"))
                    .collect();
                if b.len() != losses.len() {
                    return Err(anyhow!(
                        "the baseline run {} has {} losses in {}, this run {}: rerun with --force",
                        first_key.id(KEYS),
                        b.len(),
                        curves_path.display(),
                        losses.len()
                    ));
                }
                b
            }
        };
        self.baselines
            .insert((run.seed, run.dtype), baseline.clone());
        // A NaN loss is an infinite difference (`worst`), not none.
        let max_rel_loss_diff = reference::compare::worst(
            losses
                .iter()
                .zip(&baseline)
                .map(|(l, b)| (l - b).abs() / b.abs().max(f64::MIN_POSITIVE)),
        );
        curves.replace(
            &key(&run),
            losses
                .iter()
                .enumerate()
                .map(|(step, loss)| {
                    let mut r = key(&run);
                    r.0.push(("step".into(), step.to_string()));
                    r.0.push(("loss".into(), loss.to_string()));
                    r
                })
                .collect(),
        );
        curves.write_csv(&curves_path)?;
        let mut record = Record::of(&Row {
            strategy: run.strategy.name(),
            forward: run.forward.to_string(),
            backward: run.backward.to_string(),
            ranks: run.ranks,
            seed: run.seed,
            dtype: run.dtype.map(|d| d.to_string()),
            ulysses: run.ulysses,
            task: self.task.name.clone(),
            steps: losses.len(),
            first_loss: losses.first().copied().unwrap_or(f64::NAN),
            final_loss: losses.last().copied().unwrap_or(f64::NAN),
            max_rel_loss_diff,
            tokens_per_s: *tokens.lock().expect("tokens") as f64 / wall,
            engine_peak_mib_per_rank: *engine_peak.lock().expect("peak") as f64 / MIB,
            wall_seconds: wall,
        })?;
        if self.task.eval_cases > 0 {
            let model = trained.model.valid();
            let mut rng = SplitMix64::new(run.seed ^ 0xE7A1);
            for &lines in &self.task.eval_lines {
                let cases = (0..self.task.eval_cases)
                    .map(|_| generate(&mut rng, lines, WordSplit::Eval))
                    .collect::<Result<Vec<_>, _>>()?;
                context
                    .bar
                    .set_message(format!("{} eval {lines} lines", key(&run).id(KEYS)));
                let decoding = crate::line_retrieval::decoding(run.strategy, run.ranks, 25);
                let rows = accuracy(&model, &tokenizer, &cases, &decoding)?;
                let acc = rows.first().map_or(f64::NAN, |r| r.accuracy);
                record
                    .0
                    .push((format!("accuracy_{lines}_lines"), acc.to_string()));
            }
        }
        Ok(vec![record])
    }
}
