//! Kind `train`: training runs compared across the ring's axes. Every point of strategy × forward
//! direction × backward scheme × ranks × seed trains the same model on the same batches; ring
//! attention is exact, so every run's losses must equal the sweep's first run with the same seed.
//! Loss curves go to `curves.csv` and `curves.svg` beside the table.

mod point;

use super::axes::RingAxes;
use super::experiment::{Card, Check, Column, Experiment, Plan, Point, PointContext};
use crate::line_retrieval::{ModelSpec, Prompts, Schedule, accuracy};
use crate::plot::{Axis, Chart, Scale, Series, line_chart};
use crate::results::{Record, Table};
use crate::spec::SpecText;
use crate::units::MIB;
use anyhow::{Result, anyhow};
use burn::backend::{Autodiff, Flex};
use burn::module::AutodiffModule;
use datasets::{SplitMix64, Tokenizer, WordSplit, generate};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::time::Instant;
use strategies::Partition;
use workbench::dtype::{Dtype, Precision};
use workbench::model::lazy::seeded;
use workbench::train::{Progress, StepLog, Watched, train, train_on};
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
    /// Element types of the ring's operands and blocks (`"f32"`, `"bf16"`; its merge stays f32);
    /// absent: f32, not a column.
    dtypes: Option<Vec<String>>,
    /// Head × context parallelism: ranks in a group splitting the heads (Ulysses), the rest ring;
    /// absent: 1, not a column. A degree runs on the rank counts it divides; one that does not
    /// split the model's heads is an error.
    ulysses: Option<Vec<usize>>,
}

/// What the model learns (`name = "line-retrieval"`; the fields of `experiments/line_retrieval.toml`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Task {
    name: String,
    min_lines: usize,
    num_lines: usize,
    /// Lines asked about in each training prompt; default 1.
    #[serde(default = "crate::line_retrieval::one_question")]
    questions: usize,
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
    /// `None` when the sweep has no dtypes axis (then f32).
    dtype: Option<Dtype>,
    /// `None` when the sweep has no ulysses axis (then 1).
    ulysses: Option<usize>,
}

struct TrainPlan {
    runs: Vec<Run>,
    task: Task,
    model: ModelSpec,
    train: TrainSection,
    /// The losses of each seed's (and element type's) first run, once known.
    baselines: BTreeMap<(u64, Option<Dtype>), Vec<f64>>,
}

const KEYS: &[&str] = &[
    "strategy", "forward", "backward", "ranks", "seed", "dtype", "ulysses",
];

const CARD: Card = Card {
    name: "train",
    about: "training runs compared across strategy x direction x scheme x ranks: losses, speed, memory",
    sweep_keys: &[
        "strategies",
        "forward",
        "backward",
        "ranks",
        "seeds",
        "dtypes",
        "ulysses",
    ],
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

    /// A bf16 run rounds P and dS, whose rounding depends on how the ring tiles the scores (another
    /// N, another CPU's sums): its losses are read as ratios, like measurements.
    fn check(&self, reference: &Record, column: &Column) -> Check {
        match column.name {
            "first_loss" | "final_loss" | "max_rel_loss_diff"
                if reference.get("dtype") == Some("bf16") =>
            {
                Check::Measured
            }
            _ => column.check,
        }
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
        point::prompts(&parsed.task, &parsed.train, 0)
            .check()
            .map_err(|e| {
                let key = if parsed.task.questions == 0 {
                    "questions"
                } else if parsed.task.num_lines > datasets::name_pool(datasets::WordSplit::Train) {
                    "num_lines"
                } else {
                    "min_lines"
                };
                spec.error("task", key, &e.to_string())
            })?;
        if let Some(&bad) = parsed.task.eval_lines.iter().find(|&&n| n == 0) {
            return Err(spec.error(
                "task",
                "eval_lines",
                &format!("line counts must be at least 1, got {bad}"),
            ));
        }
        let pool = datasets::name_pool(datasets::WordSplit::Eval);
        if let Some(&bad) = parsed.task.eval_lines.iter().find(|&&n| n > pool) {
            return Err(spec.error(
                "task",
                "eval_lines",
                &format!(
                    "{bad} lines is more than the {pool} distinct line names the evaluation words give"
                ),
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
        let dtypes: Vec<Option<Dtype>> = match &s.dtypes {
            None => vec![None],
            some => spec
                .parsed::<Dtype>("sweep", "dtypes", spec.list("sweep", "dtypes", some)?)?
                .into_iter()
                .map(Some)
                .collect(),
        };
        let config = parsed
            .model
            .config(Tokenizer::line_retrieval().vocab_size())
            .map_err(|e| spec.error("model", "hf", &e.to_string()))?;
        // The window's two keys point at their own lines; the config's other faults at the heads.
        let key = match (parsed.model.window, parsed.model.window_every) {
            (Some(0), _) => "window",
            (_, Some(0)) => "window_every",
            _ => "heads",
        };
        config
            .validate()
            .map_err(|e| spec.error("model", key, &e.to_string()))?;
        let ulysses: Vec<Option<usize>> = match &s.ulysses {
            None => vec![None],
            some => {
                let degrees = spec.list("sweep", "ulysses", some)?;
                for &u in degrees {
                    // The heads' rule, on a rank count the degree divides.
                    workbench::ring::ulysses::check_heads(u, u, config.heads, config.kv_heads)
                        .map_err(|e| spec.error("sweep", "ulysses", &e.to_string()))?;
                }
                degrees.iter().map(|&u| Some(u)).collect()
            }
        };
        let mut runs = Vec::new();
        for &seed in seeds {
            for &dtype in &dtypes {
                for &ranks in ranks {
                    for &degree in &ulysses {
                        if !ranks.is_multiple_of(degree.unwrap_or(1)) {
                            continue;
                        }
                        for &strategy in &strategies {
                            for &forward in &forward {
                                for &backward in &backward {
                                    runs.push(Run {
                                        strategy,
                                        forward,
                                        backward,
                                        ranks,
                                        seed,
                                        dtype,
                                        ulysses: degree,
                                    });
                                }
                            }
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
