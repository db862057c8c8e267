//! Kind `train`: training runs compared across the ring's axes. Every point of strategy × forward
//! direction × backward scheme × ranks × seed trains the same model on the same batches; ring
//! attention is exact, so every run's losses must equal the sweep's first run with the same seed.
//! Loss curves go to `curves.csv` and `curves.svg` beside the table.

use super::axes::RingAxes;
use super::experiment::{Card, Check, Column, Experiment, Plan, Point, PointContext};
use crate::line_retrieval::{ModelSpec, Prompts, accuracy};
use crate::plot::{Axis, Chart, Scale, Series, line_chart};
use crate::results::{Record, Table};
use crate::spec::SpecText;
use crate::units::MIB;
use anyhow::{Result, anyhow};
use burn::backend::{Autodiff, Flex};
use burn::module::AutodiffModule;
use datasets::tokenizer::EOS;
use datasets::{SplitMix64, Tokenizer, WordSplit, generate};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};
use strategies::Partition;
use workbench::model::lazy::seeded;
use workbench::train::{TrainOptions, train};
use workbench::{BackwardScheme, Direction, Kernel, RingConfig};

type Train = Autodiff<Flex>;

/// The kind.
pub struct TrainKind;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Spec {
    sweep: Sweep,
    task: Task,
    model: ModelSpec,
    train: TrainSection,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Sweep {
    /// Default: every registered strategy.
    strategies: Option<Vec<String>>,
    /// Default: `["cw"]`.
    forward: Option<Vec<String>>,
    /// Default: `["kv"]`.
    backward: Option<Vec<String>>,
    ranks: Option<Vec<usize>>,
    /// Default: `[0]`.
    seeds: Option<Vec<u64>>,
}

/// What the model learns (`name = "line-retrieval"`; the fields of `experiments/line_retrieval.toml`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Task {
    name: String,
    min_lines: usize,
    num_lines: usize,
    #[serde(default)]
    lm_weight: f32,
    /// Line counts evaluated after training (fresh cases, names never seen in training).
    #[serde(default)]
    eval_lines: Vec<usize>,
    /// Cases per evaluated line count.
    #[serde(default)]
    eval_cases: usize,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TrainSection {
    steps: usize,
    batch: usize,
    lr: f64,
    #[serde(default)]
    warmup_steps: usize,
    #[serde(default = "one")]
    min_lr_ratio: f64,
    #[serde(default)]
    weight_decay: f32,
    grad_clip: Option<f32>,
    /// Pack each step's prompts into one sequence of documents.
    #[serde(default)]
    pack: bool,
}

fn one() -> f64 {
    1.0
}

#[derive(Debug, Clone, Copy)]
struct Run {
    strategy: &'static dyn Partition,
    forward: Direction,
    backward: BackwardScheme,
    ranks: usize,
    seed: u64,
}

#[derive(Debug, Serialize)]
struct Row {
    strategy: &'static str,
    forward: String,
    backward: String,
    ranks: usize,
    seed: u64,
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

struct TrainPlan {
    runs: Vec<Run>,
    task: Task,
    model: ModelSpec,
    train: TrainSection,
    /// Each seed's first run's losses, once known.
    baselines: BTreeMap<u64, Vec<f64>>,
}

const KEYS: &[&str] = &["strategy", "forward", "backward", "ranks", "seed"];

const CARD: Card = Card {
    name: "train",
    about: "training runs compared across strategy x direction x scheme x ranks: losses, speed, memory",
    sweep_keys: &["strategies", "forward", "backward", "ranks", "seeds"],
    key_columns: KEYS,
    columns: &[
        Column::exact("task"),
        Column::exact("steps"),
        Column::exact("engine_peak_mib_per_rank"),
        // Another CPU's kernels sum in another order: the same kind of rounding as another rank
        // count's, whose losses the training tests hold within 1e-4 relative.
        Column {
            name: "first_loss",
            check: Check::Within(1e-4),
        },
        Column {
            name: "final_loss",
            check: Check::Within(1e-4),
        },
        // The bound the training-equality tests assert across strategies, ranks and schemes.
        Column {
            name: "max_rel_loss_diff",
            check: Check::AtMost(1e-4),
        },
        Column::measured("tokens_per_s"),
        Column::measured("wall_seconds"),
    ],
};

impl Experiment for TrainKind {
    fn card(&self) -> &'static Card {
        &CARD
    }

    fn plan(&self, spec: &SpecText) -> Result<Box<dyn Plan>> {
        let parsed: Spec = spec.parse()?;
        let s = &parsed.sweep;
        if parsed.task.name != "line-retrieval" {
            return Err(spec.error(
                "task",
                "name",
                &format!("unknown task '{}'; known: line-retrieval", parsed.task.name),
            ));
        }
        prompts(&parsed.task, &parsed.train, 0)
            .check()
            .map_err(|e| spec.error("task", "min_lines", &e.to_string()))?;
        if let Some(&bad) = parsed.task.eval_lines.iter().find(|&&n| n == 0) {
            return Err(spec.error(
                "task",
                "eval_lines",
                &format!("line counts must be at least 1, got {bad}"),
            ));
        }
        if parsed.train.batch == 0 {
            return Err(spec.error("train", "batch", "must be at least 1, got 0"));
        }
        let RingAxes {
            strategies,
            forward,
            backward,
        } = RingAxes::parse(spec, &s.strategies, &s.forward, &s.backward)?;
        let ranks = spec.ranks("sweep", &s.ranks)?;
        let seeds = &spec.list_or("sweep", "seeds", &s.seeds, vec![0])?;
        let config = parsed
            .model
            .config(Tokenizer::line_retrieval().vocab_size());
        config
            .validate()
            .map_err(|e| spec.error("model", "heads", &e.to_string()))?;
        let mut runs = Vec::new();
        for &seed in seeds {
            for &ranks in ranks {
                for &strategy in &strategies {
                    for &forward in &forward {
                        for &backward in &backward {
                            runs.push(Run {
                                strategy,
                                forward,
                                backward,
                                ranks,
                                seed,
                            });
                        }
                    }
                }
            }
        }
        Ok(Box::new(TrainPlan {
            runs,
            task: parsed.task,
            model: parsed.model,
            train: parsed.train,
            baselines: BTreeMap::new(),
        }))
    }

    fn side_files(&self) -> &'static [&'static str] {
        &[CURVES, "curves.svg"]
    }

    fn figure(&self, _: &Table, dir: &Path) -> Result<()> {
        let curves = Table::read(&dir.join(CURVES))?;
        let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
        for row in &curves.rows {
            series
                .entry(row.id(KEYS).replace(',', " "))
                .or_default()
                .push((row.num("step"), row.num("loss")));
        }
        if series.is_empty() {
            return Ok(());
        }
        let chart = Chart {
            title: "Training loss per run (exact ring attention: the curves coincide)",
            x: Axis::new("step", Scale::Linear),
            y: Axis::new("loss", Scale::Linear),
        };
        line_chart(&dir.join("curves.svg"), &chart, Series::sorted(series))
    }
}

const CURVES: &str = "curves.csv";

fn prompts(task: &Task, train: &TrainSection, seed: u64) -> Prompts {
    Prompts {
        seed,
        batch: train.batch,
        min_lines: task.min_lines,
        num_lines: task.num_lines,
        lm_weight: task.lm_weight,
    }
}

fn key(run: &Run) -> Record {
    Record::new([
        ("strategy", run.strategy.name().to_string()),
        ("forward", run.forward.to_string()),
        ("backward", run.backward.to_string()),
        ("ranks", run.ranks.to_string()),
        ("seed", run.seed.to_string()),
    ])
}

impl Plan for TrainPlan {
    fn points(&self) -> Vec<Point> {
        self.runs.iter().map(|r| Point::single(key(r))).collect()
    }

    fn compute(&mut self, index: usize, context: &PointContext) -> Result<Vec<Record>> {
        let run = self.runs[index];
        let tokenizer = Tokenizer::line_retrieval();
        let config = self.model.config(tokenizer.vocab_size());
        let t = &self.train;
        let options = TrainOptions {
            ranks: run.ranks,
            ring: RingConfig {
                causal: true,
                forward: run.forward,
                backward: run.backward,
                kernel: Kernel::Fused,
                scale: None,
                lockstep: false,
            },
            steps: t.steps,
            lr: t.lr,
            warmup_steps: t.warmup_steps,
            min_lr_ratio: t.min_lr_ratio,
            weight_decay: t.weight_decay,
            grad_clip: t.grad_clip,
            checksum_every: 0,
            pad_token: EOS,
            timeout: Duration::from_secs(600),
            pack: t.pack,
        };
        let prompts = prompts(&self.task, t, run.seed);
        let device = Default::default();
        let model = seeded::<Train, _>(run.seed, &device, || config.init::<Train>(&device));
        let tokens = Mutex::new(0usize);
        let engine_peak = Mutex::new(0u64);
        let start = Instant::now();
        let trained = train(
            model,
            run.strategy,
            &options,
            |step| prompts.batch(&tokenizer, step),
            |log| {
                *tokens.lock().expect("tokens") += log.tokens;
                let mut peak = engine_peak.lock().expect("peak");
                *peak = (*peak).max(log.engine_peak_bytes);
                context.bar.set_message(format!(
                    "{} step {} loss {:.4}",
                    key(&run).id(KEYS),
                    log.step,
                    log.loss
                ));
            },
            &AtomicBool::new(false),
        )?;
        let wall = start.elapsed().as_secs_f64();
        let losses = trained.losses;
        let curves_path = context.dir.join(CURVES);
        let mut curves = Table::read(&curves_path)?;
        // The sweep's first run with this seed is the baseline (from this run or an earlier one).
        let first = self
            .runs
            .iter()
            .find(|r| r.seed == run.seed)
            .expect("this run's seed");
        let baseline = match self.baselines.get(&run.seed) {
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
        self.baselines.insert(run.seed, baseline.clone());
        // A NaN loss is an infinite difference (`worst`), not none.
        let max_rel_loss_diff = ringbench_tests::worst(
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
                let rows = accuracy(&model, &tokenizer, &cases, run.strategy, run.ranks, 25)?;
                let acc = rows.first().map_or(f64::NAN, |r| r.accuracy);
                record
                    .0
                    .push((format!("accuracy_{lines}_lines"), acc.to_string()));
            }
        }
        Ok(vec![record])
    }
}
