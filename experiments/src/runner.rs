//! `ringbench run SPEC.toml`: an experiment kind swept over a cartesian product, written as
//! `results/NAME/{results.csv, results.md, spec.toml, *.svg}`; rows already present are skipped.

use crate::hardware::{Profile, profile, profile_names};
use crate::measured::{Method, SmallModel, knee_rows, max_context, mfu_row, mib, peak_per_rank};
use crate::plot::{Series, line_chart};
use crate::row::Row;
use crate::simulator::simulate;
use anyhow::{Context, Result, anyhow, bail};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Deserialize;
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use strategies::{Partition, causal_pairs, causal_work_per_rank};
use workbench::Direction;
use workbench::kernels::flops::FORWARD_PER_PAIR_DIM;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// Causal load balance of the partition strategies, simulated on a hardware profile.
    Balance,
    /// Minimal block size for overlap (c_min = F/B) and exposed communication against block size.
    Overlap,
    /// Measured: exposed communication of a thread ring whose link is rate-limited to put F/B at
    /// `measure.set_knee_tokens`.
    Knee,
    /// Measured: per-rank peak memory of a training step and maximum context under a budget.
    Memory,
    /// Measured: model FLOPs utilization of training steps against the machine's matmul rate.
    Mfu,
    /// Analytic: per-device memory and maximum context at the paper's scale beside its Table 3.
    MemoryModel,
}

impl Kind {
    /// Kinds measured on this machine are computed as a whole (their rows depend on each other);
    /// an existing results.csv is kept unless `--force`.
    fn measured(self) -> bool {
        matches!(self, Kind::Knee | Kind::Memory | Kind::Mfu)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    pub kind: Kind,
    #[serde(default)]
    pub description: String,
    pub sweep: Sweep,
    #[serde(default)]
    pub model: ModelShape,
    #[serde(default)]
    pub measure: Measure,
}

/// Settings of the measured kinds.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Measure {
    /// Knee: the block size at which the link is set to take as long as the compute.
    pub set_knee_tokens: Option<usize>,
    /// Timing repeats (median).
    pub repeats: Option<usize>,
    /// Memory: per-rank budget for the maximum-context search.
    pub budget_mib: Option<f64>,
    /// Memory: methods to measure (vanilla, memory-efficient, blockwise-attn+ffn, ring).
    pub methods: Option<Vec<String>>,
    /// Memory: the doubling search stops here.
    pub max_seq: Option<usize>,
    /// MFU: timed training steps (after one warm-up step).
    pub steps: Option<usize>,
    /// The small model of the memory and MFU kinds.
    pub d_model: Option<usize>,
    pub layers: Option<usize>,
    pub heads: Option<usize>,
    pub vocab: Option<usize>,
}

impl Measure {
    fn small_model(&self) -> SmallModel {
        SmallModel {
            d_model: self.d_model.unwrap_or(128),
            layers: self.layers.unwrap_or(2),
            heads: self.heads.unwrap_or(4),
            vocab: self.vocab.unwrap_or(256),
        }
    }
}

/// Every key is a list; a kind uses the keys it needs and ignores none silently (unused keys are
/// rejected so that a typo cannot look like a sweep).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sweep {
    pub strategies: Option<Vec<String>>,
    pub forward: Option<Vec<String>>,
    pub ranks: Option<Vec<usize>>,
    /// Tokens per rank (the ring's block size c).
    pub block_sizes: Option<Vec<usize>>,
    pub profiles: Option<Vec<String>>,
}

/// Attention shape of the simulated model (the paper's defaults: head_dim 128, bf16).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelShape {
    #[serde(default = "default_head_dim")]
    pub head_dim: usize,
    #[serde(default = "default_heads")]
    pub heads: usize,
    #[serde(default = "default_bytes")]
    pub bytes_per_value: usize,
    /// Balance: where tile costs come from.
    #[serde(default)]
    pub tile_costs: TileCosts,
    /// Balance with measured tile costs: the (smaller) attention shape timed on this machine; times
    /// are scaled by the FLOP ratio of the two shapes and by this machine's matmul rate over the
    /// profile's peak.
    #[serde(default = "default_measured_heads")]
    pub measured_heads: usize,
    #[serde(default = "default_measured_head_dim")]
    pub measured_head_dim: usize,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TileCosts {
    /// Visible pairs × FLOPs per pair ÷ the profile's peak FLOP/s.
    #[default]
    Flops,
    /// Each tile timed on this machine in lockstep, scaled to the profile.
    Measured,
}

fn default_measured_heads() -> usize {
    4
}
fn default_measured_head_dim() -> usize {
    64
}

fn default_head_dim() -> usize {
    128
}
/// LLaMA-7B's 32 heads of 128: per-step compute large enough that link latency is negligible, as in
/// the paper's c_min argument.
fn default_heads() -> usize {
    32
}
fn default_bytes() -> usize {
    2
}

impl Default for ModelShape {
    fn default() -> Self {
        Self {
            head_dim: default_head_dim(),
            heads: default_heads(),
            bytes_per_value: default_bytes(),
            tile_costs: TileCosts::default(),
            measured_heads: default_measured_heads(),
            measured_head_dim: default_measured_head_dim(),
        }
    }
}

/// The line of `key =` in the spec text, for error messages.
fn line_of(text: &str, key: &str) -> usize {
    text.lines()
        .position(|l| l.trim_start().starts_with(key) && l.contains('='))
        .map_or(0, |i| i + 1)
}

pub fn load(path: &Path) -> Result<(Spec, String)> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let spec: Spec = toml::from_str(&text).map_err(|e| {
        anyhow!(
            "{}: {}",
            path.display(),
            e.to_string().trim().replace('\n', " ")
        )
    })?;
    Ok((spec, text))
}

/// A required, non-empty sweep list.
fn list<'a, T>(
    path: &Path,
    text: &str,
    key: &str,
    value: &'a Option<Vec<T>>,
    kind: Kind,
) -> Result<&'a [T]> {
    match value {
        None => bail!("{}: kind {kind:?} needs sweep.{key}", path.display()),
        Some(v) if v.is_empty() => bail!(
            "{}:{}: sweep.{key} is empty",
            path.display(),
            line_of(text, key)
        ),
        Some(v) => Ok(v),
    }
}

/// `sweep.ranks`, each checked by the one rank-count rule ([`strategies::check_ranks`]).
fn rank_list<'a>(
    path: &Path,
    text: &str,
    value: &'a Option<Vec<usize>>,
    kind: Kind,
) -> Result<&'a [usize]> {
    let ranks = list(path, text, "ranks", value, kind)?;
    for &n in ranks {
        strategies::check_ranks(n).map_err(|e| {
            anyhow!(
                "{}:{}: sweep.ranks: {e}",
                path.display(),
                line_of(text, "ranks")
            )
        })?;
    }
    Ok(ranks)
}

fn reject_unused(path: &Path, text: &str, sweep: &Sweep, used: &[&str]) -> Result<()> {
    let present = [
        ("strategies", sweep.strategies.is_some()),
        ("forward", sweep.forward.is_some()),
        ("ranks", sweep.ranks.is_some()),
        ("block_sizes", sweep.block_sizes.is_some()),
        ("profiles", sweep.profiles.is_some()),
    ];
    for (key, is_set) in present {
        if is_set && !used.contains(&key) {
            bail!(
                "{}:{}: sweep.{key} is not used by this kind of experiment",
                path.display(),
                line_of(text, key)
            );
        }
    }
    Ok(())
}

fn profiles(path: &Path, text: &str, names: &[String]) -> Result<Vec<&'static Profile>> {
    names
        .iter()
        .map(|n| {
            profile(n).ok_or_else(|| {
                anyhow!(
                    "{}:{}: unknown profile '{n}' in sweep.profiles; known: {}",
                    path.display(),
                    line_of(text, "profiles"),
                    profile_names()
                )
            })
        })
        .collect()
}

fn partitions(path: &Path, text: &str, names: &[String]) -> Result<Vec<&'static dyn Partition>> {
    names
        .iter()
        .map(|n| {
            strategies::by_name(n).map_err(|e| {
                anyhow!(
                    "{}:{}: sweep.strategies: {e}",
                    path.display(),
                    line_of(text, "strategies")
                )
            })
        })
        .collect()
}

/// Tile costs measured on this machine: lockstep seconds per (rank, step) and the matmul rate.
struct MachineTiles {
    seconds: Vec<Vec<f64>>,
    matmul_flops: f64,
}

fn machine_tiles(
    partition: &dyn Partition,
    ranks: usize,
    block: usize,
    m: &ModelShape,
) -> Result<Option<MachineTiles>> {
    if m.tile_costs != TileCosts::Measured {
        return Ok(None);
    }
    let seconds = crate::measured::lockstep_tile_seconds(
        partition,
        ranks,
        block,
        m.measured_heads,
        m.measured_head_dim,
    )?;
    Ok(Some(MachineTiles {
        seconds,
        matmul_flops: crate::bench::matmul_gflops(1024) * 1e9,
    }))
}

/// Simulated forward ring pass of `partition` on `ranks` ranks with `block` tokens each.
fn balance_row(
    partition: &dyn Partition,
    ranks: usize,
    block: usize,
    p: &Profile,
    m: &ModelShape,
    contiguous_makespan: Option<f64>,
) -> Result<(Row, f64)> {
    let measured = machine_tiles(partition, ranks, block, m)?;
    let layout = partition.layout(ranks * block, ranks)?;
    let work = causal_work_per_rank(&layout);
    let mean = work.iter().sum::<u64>() as f64 / ranks as f64;
    let max = *work.iter().max().unwrap_or(&0) as f64;
    let flops_per_pair = (FORWARD_PER_PAIR_DIM * (m.head_dim * m.heads) as u64) as f64;
    let compute: Vec<Vec<f64>> = (0..ranks)
        .map(|r| {
            (0..ranks)
                .map(|s| {
                    if let Some(t) = &measured {
                        // Time on this machine → FLOPs at the model's shape → time on the profile.
                        let shape_ratio = (m.heads * m.head_dim) as f64
                            / (m.measured_heads * m.measured_head_dim) as f64;
                        return t.seconds[r][s] * t.matmul_flops * shape_ratio / p.flops;
                    }
                    let owner = Direction::Cw.owner(r, s, ranks);
                    causal_pairs(&layout.positions[r], &layout.positions[owner]) as f64
                        * flops_per_pair
                        / p.flops
                })
                .collect()
        })
        .collect();
    let link = p.latency_s
        + (2 * block * m.head_dim * m.heads * m.bytes_per_value) as f64 / p.link_bytes_per_s;
    let sim = simulate(&compute, link);
    let contiguous = contiguous_makespan.unwrap_or(sim.makespan);
    let contiguous_max = (2 * ranks - 1) as f64 / ranks as f64 * mean;
    let row = Row {
        keys: vec![
            ("strategy", partition.name().to_string()),
            ("ranks", ranks.to_string()),
            ("block_size", block.to_string()),
            ("profile", p.name.to_string()),
        ],
        values: vec![
            ("tile_costs", format!("{:?}", m.tile_costs).to_lowercase()),
            ("work_max_over_mean", format!("{:.4}", max / mean)),
            ("makespan_ms", format!("{:.4}", sim.makespan * 1e3)),
            (
                "speedup_over_contiguous",
                format!("{:.4}", contiguous / sim.makespan),
            ),
            (
                "theoretical_speedup",
                format!("{:.4}", contiguous_max / max),
            ),
            (
                "contiguous_imbalance_2n_minus_1_over_n",
                format!("{:.4}", (2 * ranks - 1) as f64 / ranks as f64),
            ),
            (
                "overlap_efficiency",
                format!("{:.4}", sim.overlap_efficiency),
            ),
        ],
    };
    Ok((row, sim.makespan))
}

fn overlap_row(p: &Profile, block: usize, m: &ModelShape) -> Row {
    // Balanced full tiles (non-causal) isolate the overlap question.
    let ranks = 8;
    let tile =
        (FORWARD_PER_PAIR_DIM * (block * block * m.head_dim * m.heads) as u64) as f64 / p.flops;
    let link = p.latency_s
        + (2 * block * m.head_dim * m.heads * m.bytes_per_value) as f64 / p.link_bytes_per_s;
    let sim = simulate(&vec![vec![tile; ranks]; ranks], link);
    Row {
        keys: vec![
            ("profile", p.name.to_string()),
            ("block_size", block.to_string()),
        ],
        values: vec![
            ("tflops", format!("{:.0}", p.flops / 1e12)),
            ("link_gb_per_s", format!("{:.1}", p.link_bytes_per_s / 1e9)),
            ("c_min_tokens", format!("{:.0}", p.c_min())),
            ("s_min_tokens", format!("{:.0}", 6.0 * p.c_min())),
            (
                "paper_c_min_tokens",
                p.paper_c_min.map_or("-".into(), |c| format!("{c:.0}")),
            ),
            (
                "c_min_over_paper",
                p.paper_c_min
                    .map_or("-".into(), |c| format!("{:.3}", p.c_min() / c)),
            ),
            (
                "exposed_comm_fraction",
                format!("{:.4}", sim.exposed_comm / sim.makespan),
            ),
        ],
    }
}

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Experiment spec, e.g. experiments/balance.toml.
    pub spec: PathBuf,
    /// Recompute rows already in results.csv.
    #[arg(long)]
    pub force: bool,
    /// Results go to DIR/NAME (NAME is the spec's file stem).
    #[arg(long, default_value = "results")]
    pub results: PathBuf,
}

/// Builds the rows of a spec, skipping ids in `done`.
fn rows(path: &Path, text: &str, spec: &Spec, done: &HashSet<String>) -> Result<Vec<Row>> {
    let s = &spec.sweep;
    let mut out = Vec::new();
    if spec.kind.measured() && !done.is_empty() {
        return Ok(out);
    }
    let m = &spec.measure;
    let required = |key: &str, value: Option<usize>| {
        value.ok_or_else(|| {
            anyhow!(
                "{}: kind {:?} needs measure.{key}",
                path.display(),
                spec.kind
            )
        })
    };
    match spec.kind {
        Kind::Knee => {
            reject_unused(path, text, s, &["ranks", "block_sizes"])?;
            let ranks = rank_list(path, text, &s.ranks, spec.kind)?;
            let blocks = list(path, text, "block_sizes", &s.block_sizes, spec.kind)?;
            let set = required("set_knee_tokens", m.set_knee_tokens)?;
            let bar = ProgressBar::new((ranks.len() * blocks.len()) as u64)
                .with_style(ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}")?);
            for &n in ranks {
                out.extend(knee_rows(
                    n,
                    blocks,
                    set,
                    spec.model.heads,
                    spec.model.head_dim,
                    m.repeats.unwrap_or(3),
                    &bar,
                )?);
            }
            bar.finish_and_clear();
        }
        Kind::Memory => {
            reject_unused(path, text, s, &["ranks", "block_sizes"])?;
            let ranks = rank_list(path, text, &s.ranks, spec.kind)?;
            let blocks = list(path, text, "block_sizes", &s.block_sizes, spec.kind)?;
            let budget = m.budget_mib.ok_or_else(|| {
                anyhow!("{}: kind memory needs measure.budget_mib", path.display())
            })? * 1024.0
                * 1024.0;
            let max_seq = required("max_seq", m.max_seq)?;
            let methods: Vec<Method> = m
                .methods
                .clone()
                .unwrap_or_else(|| vec!["vanilla".into(), "memory-efficient".into(), "blockwise-attn+ffn".into(), "ring".into()])
                .iter()
                .map(|name| {
                    Method::parse(name).ok_or_else(|| {
                        anyhow!(
                            "{}:{}: unknown method '{name}' in measure.methods; known: vanilla, memory-efficient, blockwise-attn+ffn, ring",
                            path.display(),
                            line_of(text, "methods")
                        )
                    })
                })
                .collect::<Result<_>>()?;
            let small = m.small_model();
            // The first step of a process allocates once-only state (thread pools, caches): warm up.
            peak_per_rank(&small, Method::Blockwise, 1, blocks[0], blocks[0])?;
            let bar = ProgressBar::new_spinner();
            let row =
                |kind: &str, method: Method, n: usize, seq: String, values: [String; 4]| Row {
                    keys: vec![
                        ("row_type", kind.to_string()),
                        ("method", method.name().to_string()),
                        ("ranks", n.to_string()),
                        ("seq_len", seq),
                    ],
                    values: vec![
                        ("peak_mib_per_rank", values[0].clone()),
                        ("engine_peak_bytes_per_rank", values[3].clone()),
                        ("budget_mib", mib(budget)),
                        ("max_context_tokens", values[1].clone()),
                        ("max_context_over_one_rank_blockwise", values[2].clone()),
                    ],
                };
            for &c in blocks {
                for &method in &methods {
                    for &n in ranks {
                        let (ranks_used, seq) = (if method == Method::Ring { n } else { 1 }, n * c);
                        bar.set_message(format!("peak {} N={ranks_used} S={seq}", method.name()));
                        let peak = peak_per_rank(&small, method, ranks_used, seq, c)?;
                        out.push(row(
                            "peak",
                            method,
                            ranks_used,
                            seq.to_string(),
                            [
                                mib(peak.allocator),
                                "-".into(),
                                "-".into(),
                                peak.engine.to_string(),
                            ],
                        ));
                    }
                }
            }
            let block_cap = blocks[0];
            let blockwise = max_context(
                &small,
                Method::Blockwise,
                1,
                block_cap,
                budget,
                256,
                max_seq,
            )?;
            for &method in &methods {
                let rank_counts: Vec<usize> = if method == Method::Ring {
                    ranks.to_vec()
                } else {
                    vec![1]
                };
                for n in rank_counts {
                    bar.set_message(format!("max context {} N={n}", method.name()));
                    let cap = if method == Method::Ring {
                        usize::MAX
                    } else {
                        block_cap
                    };
                    let best = if method == Method::Blockwise {
                        blockwise
                    } else {
                        max_context(&small, method, n, cap, budget, 256, max_seq)?
                    };
                    let ratio = match (best, blockwise) {
                        (Some(b), Some(base)) => format!("{:.3}", b as f64 / base as f64),
                        _ => "-".into(),
                    };
                    let shown = best.map_or("<256".into(), |b| b.to_string());
                    out.push(row(
                        "max_context",
                        method,
                        n,
                        "-".into(),
                        ["-".into(), shown, ratio, "-".into()],
                    ));
                }
            }
            bar.finish_and_clear();
        }
        Kind::MemoryModel => {
            reject_unused(path, text, s, &[])?;
            use crate::memory_model::{METHODS, PAPER_TABLE_3, SIZES, max_context_k};
            for (pool, model, paper) in PAPER_TABLE_3 {
                let size = SIZES
                    .iter()
                    .find(|m| m.name == model)
                    .expect("every paper row names a known size");
                for (method, paper_k) in METHODS.iter().zip(paper) {
                    let ours = max_context_k(size, &pool, method);
                    out.push(Row {
                        keys: vec![
                            ("hardware", pool.name.to_string()),
                            ("model", model.to_string()),
                            ("method", method.to_string()),
                        ],
                        values: vec![
                            ("devices", pool.devices.to_string()),
                            ("memory_gb_per_device", format!("{}", pool.memory_gb)),
                            (
                                "model_max_context_k",
                                ours.map_or("<1".into(), |k| format!("{k}")),
                            ),
                            ("paper_max_context_k", format!("{paper_k}")),
                            (
                                "model_over_paper",
                                ours.map_or("-".into(), |k| format!("{:.2}", k / paper_k)),
                            ),
                        ],
                    });
                }
            }
        }
        Kind::Mfu => {
            reject_unused(path, text, s, &["ranks", "block_sizes"])?;
            let ranks = rank_list(path, text, &s.ranks, spec.kind)?;
            let blocks = list(path, text, "block_sizes", &s.block_sizes, spec.kind)?;
            let small = m.small_model();
            let bar = ProgressBar::new((ranks.len() * blocks.len()) as u64)
                .with_style(ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}")?);
            for &c in blocks {
                for &n in ranks {
                    bar.set_message(format!("mfu N={n} S={}", n * c));
                    out.push(mfu_row(&small, n, n * c, m.steps.unwrap_or(2))?);
                    bar.inc(1);
                }
            }
            bar.finish_and_clear();
        }
        Kind::Balance => {
            reject_unused(
                path,
                text,
                s,
                &["strategies", "ranks", "block_sizes", "profiles"],
            )?;
            let strategies = partitions(
                path,
                text,
                list(path, text, "strategies", &s.strategies, spec.kind)?,
            )?;
            let ranks = rank_list(path, text, &s.ranks, spec.kind)?;
            let blocks = list(path, text, "block_sizes", &s.block_sizes, spec.kind)?;
            let profiles = profiles(
                path,
                text,
                list(path, text, "profiles", &s.profiles, spec.kind)?,
            )?;
            let total = (profiles.len() * blocks.len() * ranks.len() * strategies.len()) as u64;
            let bar = ProgressBar::new(total)
                .with_style(ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}")?);
            for p in &profiles {
                for &block in blocks {
                    for &n in ranks {
                        let (contiguous_row, contiguous) =
                            balance_row(&strategies::Contiguous, n, block, p, &spec.model, None)?;
                        for strategy in &strategies {
                            bar.set_message(format!(
                                "{} N={n} c={block} {}",
                                strategy.name(),
                                p.name
                            ));
                            // Contiguous is its own baseline: reuse it (measured tiles are noisy).
                            let row = if strategy.name() == strategies::Contiguous.name() {
                                contiguous_row.clone()
                            } else {
                                balance_row(*strategy, n, block, p, &spec.model, Some(contiguous))?
                                    .0
                            };
                            if !done.contains(&row.id()) {
                                out.push(row);
                            }
                            bar.inc(1);
                        }
                    }
                }
            }
            bar.finish_and_clear();
        }
        Kind::Overlap => {
            reject_unused(path, text, s, &["block_sizes", "profiles"])?;
            let blocks = list(path, text, "block_sizes", &s.block_sizes, spec.kind)?;
            let profiles = profiles(
                path,
                text,
                list(path, text, "profiles", &s.profiles, spec.kind)?,
            )?;
            for p in &profiles {
                for &block in blocks {
                    let row = overlap_row(p, block, &spec.model);
                    if !done.contains(&row.id()) {
                        out.push(row);
                    }
                }
            }
        }
    }
    Ok(out)
}

/// An earlier results.csv as rows of (column, value) in file order (none if there is no file).
fn read_existing(csv_path: &Path) -> Result<Vec<Vec<(String, String)>>> {
    if !csv_path.exists() {
        return Ok(Vec::new());
    }
    let mut reader = csv::Reader::from_path(csv_path)?;
    let headers = reader.headers()?.clone();
    reader
        .records()
        .map(|r| {
            Ok(headers
                .iter()
                .map(String::from)
                .zip(r?.iter().map(String::from))
                .collect())
        })
        .collect()
}

pub fn run(args: &RunArgs) -> Result<PathBuf> {
    let (spec, text) = load(&args.spec)?;
    let name = args
        .spec
        .file_stem()
        .and_then(|s| s.to_str())
        .ok_or_else(|| anyhow!("{}: no file name", args.spec.display()))?;
    let dir = args.results.join(name);
    std::fs::create_dir_all(&dir)?;
    let csv_path = dir.join("results.csv");
    let mut table = if args.force {
        Vec::new()
    } else {
        read_existing(&csv_path)?
    };
    // Rows are identified by their key columns; which columns those are is fixed per kind.
    let key_names: &[&str] = match spec.kind {
        Kind::Balance => &["strategy", "ranks", "block_size", "profile"],
        Kind::Overlap => &["profile", "block_size"],
        Kind::Knee => &["ranks", "block_size"],
        Kind::Memory => &["row_type", "method", "ranks", "seq_len"],
        Kind::Mfu => &["ranks", "seq_len"],
        Kind::MemoryModel => &["hardware", "model", "method"],
    };
    let done: HashSet<String> = table
        .iter()
        .map(|row| {
            key_names
                .iter()
                .map(|k| {
                    let v = row
                        .iter()
                        .find(|(c, _)| c == k)
                        .map_or("", |(_, v)| v.as_str());
                    format!("{k}={v}")
                })
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect();
    let new_rows = rows(&args.spec, &text, &spec, &done)?;
    let skipped = table.len();
    table.extend(new_rows.iter().map(|r| {
        r.keys
            .iter()
            .chain(&r.values)
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }));
    let header: Vec<String> = match new_rows.first() {
        Some(r) => r
            .keys
            .iter()
            .chain(&r.values)
            .map(|(k, _)| k.to_string())
            .collect(),
        None => table
            .first()
            .map(|r| r.iter().map(|(k, _)| k.clone()).collect())
            .unwrap_or_default(),
    };
    // Each row's cells in header order (a kept row lacks the columns added since it was computed).
    let cells = |row: &Vec<(String, String)>| {
        let lookup: BTreeMap<&str, &str> =
            row.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        header
            .iter()
            .map(|h| lookup.get(h.as_str()).copied().unwrap_or("").to_string())
            .collect::<Vec<_>>()
    };
    let mut w = csv::Writer::from_path(&csv_path)?;
    w.write_record(&header)?;
    for row in &table {
        w.write_record(cells(row))?;
    }
    w.flush()?;
    let md = format!(
        "# {name}\n\n{}\n\nRegenerate: `ringbench run {}`\n\n{}",
        spec.description.trim(),
        args.spec.display(),
        crate::markdown::table(&header, table.iter().map(cells))
    );
    std::fs::write(dir.join("results.md"), &md)?;
    std::fs::write(dir.join("spec.toml"), &text)?;
    figure(&spec, &dir, &table)?;
    println!("{md}");
    println!(
        "{}: {} rows computed, {} kept from an earlier run",
        dir.display(),
        new_rows.len(),
        skipped
    );
    Ok(dir)
}

fn model_index(name: &str) -> f64 {
    ["3B", "7B", "13B", "30B"]
        .iter()
        .position(|m| *m == name)
        .map_or(f64::NAN, |i| i as f64)
}

fn figure(spec: &Spec, dir: &Path, table: &[Vec<(String, String)>]) -> Result<()> {
    let get = |row: &Vec<(String, String)>, k: &str| {
        row.iter()
            .find(|(c, _)| c == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let num = |row: &Vec<(String, String)>, k: &str| get(row, k).parse::<f64>().unwrap_or(f64::NAN);
    let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let (file, title, x, y) = match spec.kind {
        Kind::Balance => {
            for row in table {
                series
                    .entry(format!(
                        "{} c={} {}",
                        get(row, "strategy"),
                        get(row, "block_size"),
                        get(row, "profile")
                    ))
                    .or_default()
                    .push((num(row, "ranks"), num(row, "speedup_over_contiguous")));
            }
            (
                "speedup.svg",
                "Causal ring pass: simulated speedup over contiguous",
                "ranks N",
                "speedup",
            )
        }
        Kind::Knee => {
            for row in table {
                for (name, column) in [
                    ("measured", "exposed_comm_fraction"),
                    ("theory", "theory_exposed_fraction"),
                ] {
                    series
                        .entry(format!("{name} N={}", get(row, "ranks")))
                        .or_default()
                        .push((num(row, "block_size"), num(row, column)));
                }
            }
            (
                "knee.svg",
                "Rate-limited thread ring: exposed communication vs block size",
                "block size c (tokens per rank)",
                "exposed / ring time",
            )
        }
        Kind::Memory => {
            for row in table.iter().filter(|r| get(r, "row_type") == "peak") {
                series
                    .entry(format!(
                        "{} (N = {})",
                        get(row, "method"),
                        if get(row, "method") == "ring" {
                            "S/c"
                        } else {
                            "1"
                        }
                    ))
                    .or_default()
                    .push((num(row, "seq_len"), num(row, "peak_mib_per_rank")));
            }
            (
                "memory.svg",
                "Per-rank peak memory of a training step",
                "sequence length S",
                "MiB per rank",
            )
        }
        Kind::MemoryModel => {
            for row in table
                .iter()
                .filter(|r| get(r, "hardware") == "8x A100 NVLink")
            {
                for (who, column) in [
                    ("model", "model_max_context_k"),
                    ("paper", "paper_max_context_k"),
                ] {
                    series
                        .entry(format!("{} {who}", get(row, "method")))
                        .or_default()
                        .push((model_index(&get(row, "model")), num(row, column).log2()));
                }
            }
            (
                "memory_model.svg",
                "8x A100: maximum context, analytic model vs paper (log2 K tokens)",
                "model (0 = 3B, 1 = 7B, 2 = 13B)",
                "log2(max context / 1K tokens)",
            )
        }
        Kind::Mfu => {
            for row in table {
                series
                    .entry(format!("N = {}", get(row, "ranks")))
                    .or_default()
                    .push((num(row, "seq_len"), num(row, "mfu")));
            }
            (
                "mfu.svg",
                "Model FLOPs utilization of training steps",
                "sequence length S",
                "MFU (vs measured matmul rate)",
            )
        }
        Kind::Overlap => {
            for row in table {
                series.entry(get(row, "profile")).or_default().push((
                    num(row, "block_size").log2(),
                    num(row, "exposed_comm_fraction"),
                ));
            }
            (
                "exposed_comm.svg",
                "Exposed communication vs block size (simulated)",
                "log2(block size c, tokens)",
                "exposed / makespan",
            )
        }
    };
    let series: Vec<Series> = series
        .into_iter()
        .map(|(name, mut points)| {
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            Series { name, points }
        })
        .collect();
    line_chart(&dir.join(file), title, x, y, &series)
}
