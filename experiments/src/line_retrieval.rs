//! `ringbench train`, `ringbench eval-lines` and `ringbench gen-lines`: the LongChat line-retrieval task.

use anyhow::{Context, Result, bail};
use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
use burn::backend::{Autodiff, Flex};
use burn::config::Config;
use burn::module::Module;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use datasets::tokenizer::{BOS, EOS};
use datasets::{Case, SplitMix64, Tokenizer, WordSplit, generate, read_jsonl, score_reply};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use workbench::RingBackend;
use workbench::model::{Llama, LlamaConfig};
use workbench::train::{Decoding, Example, StepLog, TrainOptions, greedy, train};
use workbench::{BackwardScheme, Direction, Kernel, RingConfig};

/// One row of `metrics.csv`.
#[derive(Debug, Serialize)]
struct MetricsRow {
    step: usize,
    loss: f64,
    lr: f64,
    tokens_per_second: f64,
    elapsed_seconds: f64,
}

/// `experiments/line_retrieval.toml`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainSpec {
    pub model: ModelSpec,
    pub ring: RingSpec,
    pub train: LineTrainSection,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    pub d_model: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub ffn_multiple_of: usize,
    pub rope_theta: f64,
    pub ffn_chunk: usize,
    /// Recompute activations in the backward instead of storing them (Burn's balanced checkpointing).
    #[serde(default)]
    pub checkpointing: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RingSpec {
    pub ranks: usize,
    pub strategy: String,
    pub forward: String,
    pub backward: String,
    pub kernel: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LineTrainSection {
    pub steps: usize,
    pub batch: usize,
    pub lr: f64,
    pub warmup_steps: usize,
    pub min_lr_ratio: f64,
    pub weight_decay: f32,
    pub grad_clip: Option<f32>,
    pub seed: u64,
    /// Loss weight of the prompt's own next-token predictions (the answer and EOS weigh 1). A small
    /// language-modelling weight teaches copying (the asked name repeats an earlier one) early.
    #[serde(default)]
    pub lm_weight: f32,
    /// Each training prompt has between `min_lines` and `num_lines` lines.
    pub min_lines: usize,
    pub num_lines: usize,
    pub checksum_every: usize,
    /// Where the checkpoint, metrics and the copy of this spec go.
    pub out: PathBuf,
    /// Stop early once the loss averaged over the last 50 steps is below this (0: never).
    pub stop_loss: f64,
    /// Wall-clock limit in minutes (0: none).
    pub max_minutes: f64,
}

impl RingSpec {
    pub fn config(&self) -> Result<RingConfig> {
        Ok(RingConfig {
            causal: true,
            forward: self.forward.parse::<Direction>()?,
            backward: self.backward.parse::<BackwardScheme>()?,
            kernel: self.kernel.parse::<Kernel>()?,
            scale: None,
            lockstep: false,
        })
    }
}

impl ModelSpec {
    pub fn config(&self, vocab: usize) -> LlamaConfig {
        LlamaConfig::new(vocab)
            .with_d_model(self.d_model)
            .with_layers(self.layers)
            .with_heads(self.heads)
            .with_kv_heads(self.kv_heads)
            .with_ffn_multiple_of(self.ffn_multiple_of)
            .with_rope_theta(self.rope_theta)
            .with_ffn_chunk(self.ffn_chunk)
    }
}

pub fn load_spec(path: &Path) -> Result<TrainSpec> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    toml::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{}: {}", path.display(), e.to_string().replace('\n', " ")))
}

/// How training prompts are drawn: `batch` fresh cases per step, each of `min_lines..=num_lines`
/// lines with names from the training word list.
#[derive(Debug, Clone, Copy)]
pub struct Prompts {
    /// Seeds every step's cases.
    pub seed: u64,
    /// Prompts per step.
    pub batch: usize,
    /// Fewest lines in a prompt (at least 1).
    pub min_lines: usize,
    /// Most lines in a prompt.
    pub num_lines: usize,
    /// Loss weight of the prompt's own tokens ([`example`]).
    pub lm_weight: f32,
}

impl Prompts {
    /// An error naming the line counts unless `1 <= min_lines <= num_lines`.
    pub fn check(&self) -> Result<()> {
        if self.min_lines == 0 || self.min_lines > self.num_lines {
            bail!(
                "min_lines = {} must be in 1..=num_lines = {}",
                self.min_lines,
                self.num_lines
            );
        }
        Ok(())
    }

    /// The examples of training step `step` (the same on every rank and every run).
    pub fn batch(&self, tokenizer: &Tokenizer, step: usize) -> Vec<Example> {
        let mut rng =
            SplitMix64::new(self.seed ^ (step as u64).wrapping_mul(0x2545_F491_4F6C_DD1D));
        (0..self.batch)
            .map(|_| {
                let lines =
                    rng.range_inclusive(self.min_lines as u64, self.num_lines as u64) as usize;
                let case = generate(&mut rng, lines, WordSplit::Train)
                    .expect("line counts checked by Prompts::check");
                example(tokenizer, &case, self.lm_weight)
            })
            .collect()
    }
}

/// `[BOS] prompt answer [EOS]`: the answer and EOS weigh 1, the prompt's tokens `lm_weight`.
pub fn example(tokenizer: &Tokenizer, case: &Case, lm_weight: f32) -> Example {
    let mut tokens = vec![BOS];
    tokens.extend(tokenizer.encode(&case.prompt));
    let prompt_len = tokens.len();
    tokens.extend(tokenizer.encode(&case.expected_number.to_string()));
    tokens.push(EOS);
    // weights[i] weighs predicting tokens[i + 1].
    let weights = (0..tokens.len() - 1)
        .map(|i| if i + 1 >= prompt_len { 1.0 } else { lm_weight })
        .collect();
    Example { tokens, weights }
}

fn recorder() -> NamedMpkFileRecorder<FullPrecisionSettings> {
    NamedMpkFileRecorder::<FullPrecisionSettings>::new()
}

/// Writes `model.mpk`, `config.json` and `tokenizer.json` into `dir`.
fn save_checkpoint<B: Backend>(
    dir: &Path,
    model: &Llama<B>,
    config: &LlamaConfig,
    tokenizer: &Tokenizer,
) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    model
        .clone()
        .save_file(dir.join("model"), &recorder())
        .context("saving model")?;
    config
        .save(dir.join("config.json"))
        .context("saving config")?;
    tokenizer.save(&dir.join("tokenizer.json"))?;
    Ok(())
}

/// Loads a checkpoint written by `ringbench train`, checking it against its config.
pub fn load_checkpoint(dir: &Path) -> Result<(Llama<Flex>, LlamaConfig, Tokenizer)> {
    if !dir.is_dir() {
        bail!(
            "{}: no such checkpoint directory (ringbench train writes one)",
            dir.display()
        );
    }
    let config = LlamaConfig::load(dir.join("config.json"))
        .map_err(|e| anyhow::anyhow!("{}: {e}", dir.join("config.json").display()))?;
    config.validate()?;
    let tokenizer = Tokenizer::load(&dir.join("tokenizer.json"))?;
    if tokenizer.vocab_size() != config.vocab {
        bail!(
            "{}: tokenizer has {} tokens but config.json says vocab = {}",
            dir.display(),
            tokenizer.vocab_size(),
            config.vocab
        );
    }
    let file = dir.join("model.mpk");
    let fresh = config.init::<Flex>(&Default::default());
    let expected = param_shapes(&fresh);
    let model = fresh
        .load_file(dir.join("model"), &recorder(), &Default::default())
        .map_err(|e| {
            anyhow::anyhow!(
                "{}: checkpoint does not match config.json: {e}",
                file.display()
            )
        })?;
    // Loading replaces parameters whatever their shapes: compare them with what the config builds.
    let found = param_shapes(&model);
    if let Some((want, got)) = expected.iter().zip(&found).find(|(a, b)| a != b) {
        bail!(
            "{}: checkpoint does not match config.json: a parameter has shape {got:?} where the config gives {want:?}",
            file.display()
        );
    }
    if expected.len() != found.len() {
        bail!(
            "{}: checkpoint does not match config.json: {} parameters, config gives {}",
            file.display(),
            found.len(),
            expected.len()
        );
    }
    Ok((model, config, tokenizer))
}

/// Shapes of every float parameter, in module order.
fn param_shapes<B: Backend, M: Module<B>>(module: &M) -> Vec<Vec<usize>> {
    struct Shapes(Vec<Vec<usize>>);
    impl<B: Backend> burn::module::ModuleVisitor<B> for Shapes {
        fn visit_float<const D: usize>(
            &mut self,
            param: &burn::module::Param<burn::tensor::Tensor<B, D>>,
        ) {
            self.0.push(param.val().dims().to_vec());
        }
    }
    let mut shapes = Shapes(Vec::new());
    module.visit(&mut shapes);
    shapes.0
}

#[derive(Debug, clap::Args)]
pub struct TrainArgs {
    #[arg(long)]
    pub config: PathBuf,
}

pub fn run_train(args: &TrainArgs) -> Result<()> {
    let spec = load_spec(&args.config)?;
    if spec.model.checkpointing {
        train_with::<Autodiff<Flex, BalancedCheckpointing>>(&spec)
    } else {
        train_with::<Autodiff<Flex>>(&spec)
    }
}

fn train_with<B: AutodiffBackend + RingBackend>(spec: &TrainSpec) -> Result<()> {
    let tokenizer = Tokenizer::line_retrieval();
    let config = spec.model.config(tokenizer.vocab_size());
    config.validate()?;
    let t = &spec.train;
    let partition = strategies::by_name(&spec.ring.strategy)?;
    let options = TrainOptions {
        ranks: spec.ring.ranks,
        ring: spec.ring.config()?,
        steps: t.steps,
        lr: t.lr,
        warmup_steps: t.warmup_steps,
        min_lr_ratio: t.min_lr_ratio,
        weight_decay: t.weight_decay,
        grad_clip: t.grad_clip,
        checksum_every: t.checksum_every,
        pad_token: EOS,
        timeout: Duration::from_secs(600),
    };
    std::fs::create_dir_all(&t.out)?;
    std::fs::write(t.out.join("train.toml"), toml::to_string(spec)?)?;
    B::seed(&Default::default(), t.seed);
    let model = config.init::<B>(&Default::default());
    println!(
        "training {} parameters on {} ranks ({}), {} steps of {} prompts with {}..={} lines",
        config.num_params(),
        options.ranks,
        spec.ring.strategy,
        t.steps,
        t.batch,
        t.min_lines,
        t.num_lines
    );
    let prompts = Prompts {
        seed: t.seed,
        batch: t.batch,
        min_lines: t.min_lines,
        num_lines: t.num_lines,
        lm_weight: t.lm_weight,
    };
    prompts.check().context("train")?;
    let batch_for = |step: usize| prompts.batch(&tokenizer, step);
    let bar = ProgressBar::new(t.steps as u64).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {elapsed_precise} eta {eta} {msg}")
            .context("template")?,
    );
    // Created by the first step's report, which only rank 0 makes (other MPI ranks must not truncate it).
    let metrics: std::sync::Mutex<Option<csv::Writer<std::fs::File>>> = std::sync::Mutex::new(None);
    let start = Instant::now();
    let recent = std::sync::Mutex::new(std::collections::VecDeque::new());
    let stop = std::sync::atomic::AtomicBool::new(false);
    let on_step = |log: &StepLog| {
        let tokens_per_s = log.tokens as f64 / log.seconds;
        bar.set_message(format!(
            "loss {:.4} lr {:.2e} {:.0} tok/s",
            log.loss, log.lr, tokens_per_s
        ));
        bar.inc(1);
        let mut w = metrics.lock().expect("metrics lock");
        if w.is_none() {
            *w = csv::Writer::from_path(t.out.join("metrics.csv")).ok();
        }
        if let Some(w) = w.as_mut() {
            let _ = w.serialize(MetricsRow {
                step: log.step,
                loss: log.loss,
                lr: log.lr,
                tokens_per_second: tokens_per_s,
                elapsed_seconds: start.elapsed().as_secs_f64(),
            });
            let _ = w.flush();
        }
        let mut r = recent.lock().expect("recent lock");
        r.push_back(log.loss);
        if r.len() > 50 {
            r.pop_front();
        }
        let mean = r.iter().sum::<f64>() / r.len() as f64;
        let late = t.max_minutes > 0.0 && start.elapsed().as_secs_f64() > t.max_minutes * 60.0;
        if (t.stop_loss > 0.0 && r.len() == 50 && mean < t.stop_loss) || late {
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        if bar.is_hidden() && log.step.is_multiple_of(50) {
            println!(
                "step {} loss {:.4} lr {:.2e} {:.0} tok/s",
                log.step, log.loss, log.lr, tokens_per_s
            );
        }
    };
    let Some(trained) = run_training(model, partition, &options, batch_for, on_step, &stop)? else {
        return Ok(()); // a rank other than 0 under mpirun: rank 0 writes the checkpoint
    };
    bar.finish();
    save_checkpoint(&t.out, &trained.model, &config, &tokenizer)?;
    // Mean loss over windows of up to 50 steps, so that the curve is readable at thousands of steps.
    let window = trained.losses.len().div_ceil(200).clamp(1, 50);
    let curve = trained
        .losses
        .chunks(window)
        .enumerate()
        .map(|(i, c)| ((i * window) as f64, c.iter().sum::<f64>() / c.len() as f64))
        .collect();
    crate::plot::line_chart(
        &t.out.join("loss.svg"),
        "Training loss (weighted next-token cross-entropy)",
        "step",
        "loss",
        &[crate::plot::Series {
            name: format!("mean over {window} steps"),
            points: curve,
        }],
    )?;
    println!(
        "trained {} steps in {:.1} min; final loss {:.4}; checkpoint in {}",
        trained.losses.len(),
        start.elapsed().as_secs_f64() / 60.0,
        trained.losses.last().copied().unwrap_or(f64::NAN),
        t.out.display()
    );
    Ok(())
}

/// Trains on in-process threads, or, under `mpirun`, as this process's rank (then only rank 0 gets
/// the model back; a failing rank aborts the whole job at once).
fn run_training<B, F, L>(
    model: Llama<B>,
    partition: &dyn strategies::Partition,
    options: &TrainOptions,
    batch_for: F,
    on_step: L,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<Option<workbench::train::Trained<workbench::model::Llama<B>>>>
where
    B: AutodiffBackend + RingBackend,
    F: Fn(usize) -> Vec<Example> + Sync,
    L: Fn(&StepLog) + Sync,
{
    let ranked = crate::mpi_rank::as_mpi_rank(options.timeout, |comm| {
        let model = model.clone();
        workbench::train::train_on(comm, model, partition, options, &batch_for, &on_step, stop)
    })?;
    if let Some((_, trained)) = ranked {
        return Ok(trained);
    }
    Ok(Some(train(
        model, partition, options, batch_for, on_step, stop,
    )?))
}

#[derive(Debug, clap::Args)]
pub struct EvalArgs {
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// LongChat test cases (JSONL with prompt, expected_number, num_lines).
    #[arg(long)]
    pub cases: PathBuf,
    #[arg(long, default_value_t = 1)]
    pub ranks: usize,
    #[arg(long, default_value = "zigzag")]
    pub strategy: String,
    /// Prompts decoded together.
    #[arg(long, default_value_t = 25)]
    pub batch: usize,
    /// Writes the CSV here; with `--plot`, an SVG of accuracy against the number of lines too.
    #[arg(long)]
    pub out: PathBuf,
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

#[derive(Debug, Clone, Serialize)]
pub struct AccuracyRow {
    pub num_lines: usize,
    pub cases: usize,
    pub correct: usize,
    pub accuracy: f64,
}

pub fn run_eval(args: &EvalArgs) -> Result<Vec<AccuracyRow>> {
    let (model, _, tokenizer) = load_checkpoint(&args.checkpoint)?;
    let cases = read_jsonl(&args.cases)?;
    let partition = strategies::by_name(&args.strategy)?;
    let rows = accuracy(
        &model, &tokenizer, &cases, partition, args.ranks, args.batch,
    )?;
    let mut w = csv::Writer::from_path(&args.out)
        .with_context(|| format!("writing {}", args.out.display()))?;
    println!("num_lines,cases,correct,accuracy");
    for r in &rows {
        w.serialize(r)?;
        println!(
            "{},{},{},{:.4}",
            r.num_lines, r.cases, r.correct, r.accuracy
        );
    }
    w.flush()?;
    if let Some(plot) = &args.plot {
        crate::plot::line_chart(
            plot,
            "Line retrieval: exact match vs number of lines",
            "lines in the prompt",
            "accuracy",
            &[crate::plot::Series {
                name: format!("checkpoint {}", args.checkpoint.display()),
                points: rows
                    .iter()
                    .map(|r| (r.num_lines as f64, r.accuracy))
                    .collect(),
            }],
        )?;
    }
    Ok(rows)
}

/// Exact-match accuracy per number of lines of greedy replies to `cases`, decoded `batch` prompts at a
/// time on `ranks` ranks.
pub fn accuracy<B: RingBackend>(
    model: &Llama<B>,
    tokenizer: &Tokenizer,
    cases: &[Case],
    partition: &dyn strategies::Partition,
    ranks: usize,
    batch: usize,
) -> Result<Vec<AccuracyRow>> {
    let bar = ProgressBar::new(cases.len() as u64);
    let mut tally: BTreeMap<usize, (usize, usize)> = BTreeMap::new();
    for chunk in cases.chunks(batch.max(1)) {
        let prompts: Vec<Vec<u32>> = chunk
            .iter()
            .map(|c| {
                std::iter::once(BOS)
                    .chain(tokenizer.encode(&c.prompt))
                    .collect()
            })
            .collect();
        let decoding = Decoding {
            max_new: 8,
            stop: EOS,
            pad: EOS,
            partition,
            ranks: ranks,
            timeout: Duration::from_secs(600),
        };
        let replies = greedy(model, &prompts, &decoding)?;
        for (case, reply) in chunk.iter().zip(replies) {
            let text = tokenizer.decode(&reply)?;
            let entry = tally.entry(case.num_lines).or_default();
            entry.0 += 1;
            entry.1 += usize::from(score_reply(&text) == Some(case.expected_number));
        }
        bar.inc(chunk.len() as u64);
    }
    bar.finish_and_clear();
    let rows: Vec<AccuracyRow> = tally
        .into_iter()
        .map(|(num_lines, (cases, correct))| AccuracyRow {
            num_lines,
            cases,
            correct,
            accuracy: correct as f64 / cases as f64,
        })
        .collect();
    Ok(rows)
}

#[derive(Debug, clap::Args)]
pub struct GenArgs {
    /// Line counts to generate, e.g. 4,8,12.
    #[arg(long, value_delimiter = ',')]
    pub num_lines: Vec<usize>,
    /// Cases per line count.
    #[arg(long, default_value_t = 200)]
    pub cases: usize,
    /// Word lists: eval (never seen in training), train or all.
    #[arg(long, default_value = "eval")]
    pub split: String,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long)]
    pub out: PathBuf,
}

pub fn run_gen(args: &GenArgs) -> Result<()> {
    let split = match args.split.as_str() {
        "eval" => WordSplit::Eval,
        "train" => WordSplit::Train,
        "all" => WordSplit::All,
        other => bail!("unknown --split '{other}'; expected eval, train or all"),
    };
    let mut rng = SplitMix64::new(args.seed);
    let mut out = String::new();
    for &n in &args.num_lines {
        for _ in 0..args.cases {
            let case = generate(&mut rng, n, split)?;
            out += &serde_json::to_string(&serde_json::json!({
                "prompt": case.prompt,
                "expected_number": case.expected_number,
                "num_lines": case.num_lines,
            }))?;
            out.push('\n');
        }
    }
    std::fs::write(&args.out, out).with_context(|| format!("writing {}", args.out.display()))?;
    println!(
        "wrote {} cases to {}",
        args.num_lines.len() * args.cases,
        args.out.display()
    );
    Ok(())
}
