//! Kind `decode`: greedy decoding of a seeded LLaMA-style model over a KV cache sharded on N ranks
//! (prefill through the ring, then a token a step merged by `allgather` or `ring`) against the whole
//! sequence recomputed per token: its rate, the merge's bytes per token per rank, the cache's memory
//! and balance per rank, and every decoded position's logits against the recompute.

use super::experiment::{Card, Check, Column, Experiment, Plan, Point, PointContext};
use crate::line_retrieval::ModelSpec;
use crate::mpi_rank::{decode_here, launched_rank};
use crate::plot::{Axis, Chart, Panel, Scale, panels};
use crate::results::{Record, Table};
use crate::spec::SpecText;
use anyhow::{Result, bail};
use burn::backend::Flex;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;
use strategies::Partition;
use workbench::model::Llama;
use workbench::model::lazy::seeded;
use workbench::ring::decode::DecodeMerge;
use workbench::train::{Decoded, Decoding, Prompt, decode, full_logits};

/// The kind.
pub struct DecodeKind;

/// How far a decoded position's logits may lie from the recompute's, relative to their scale (the
/// exactness suite's bound, `tests/tests/decode.rs`).
const MAX_REL_ERROR: f64 = reference::bounds::F32_ATTENTION;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Spec {
    sweep: Sweep,
    /// The model, as the training specs write it; absent: [`small_model`].
    model: Option<ModelSpec>,
    #[serde(default)]
    measure: Measure,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Sweep {
    prompt_lens: Option<Vec<usize>>,
    ranks: Option<Vec<usize>>,
    strategies: Option<Vec<String>>,
    merges: Option<Vec<String>>,
    new_tokens: Option<Vec<usize>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Measure {
    /// The model's vocabulary.
    vocab: usize,
    /// Seeds the weights.
    seed: u64,
    /// Tokens decoded by the full recompute for its rate (each a forward of the whole sequence).
    recompute_tokens: usize,
}

impl Default for Measure {
    fn default() -> Self {
        Measure {
            vocab: 256,
            seed: 0,
            recompute_tokens: 2,
        }
    }
}

/// The model when a spec has no `[model]`: 2 layers of width 64, 4 heads sharing 2 key/value heads.
fn small_model() -> ModelSpec {
    ModelSpec::own([64, 2, 4, 2, 32], 10000.0, 256)
}

#[derive(Debug, Serialize)]
struct Row {
    prompt_len: usize,
    ranks: usize,
    strategy: String,
    merge: String,
    new_tokens: usize,
    prefill_seconds: f64,
    decode_tokens_per_second: f64,
    recompute_tokens_per_second: f64,
    decode_speedup: f64,
    bytes_per_token_per_rank: f64,
    cache_bytes_per_rank: u64,
    cache_keys_max_over_mean: f64,
    max_rel_error: f64,
}

#[derive(Debug, Clone, Copy)]
struct DecodePoint {
    prompt_len: usize,
    ranks: usize,
    strategy: &'static dyn Partition,
    merge: DecodeMerge,
    new_tokens: usize,
}

struct DecodePlan {
    points: Vec<DecodePoint>,
    model: Llama<Flex>,
    measure: Measure,
    /// The recompute's tokens per second per (prompt length, ranks, strategy): the merges share it.
    recompute: BTreeMap<(usize, usize, &'static str), f64>,
    /// Whether an untimed decoding has run (the first one pays for first-touch allocations).
    warmed: bool,
}

const CARD: Card = Card {
    name: "decode",
    about: "measured: decoding over a KV cache sharded on N ranks (two merges) against the full \
            recompute per token; bytes per token per rank, cache memory and balance, logits' error",
    sweep_keys: &["prompt_lens", "ranks", "strategies", "merges", "new_tokens"],
    key_columns: &["prompt_len", "ranks", "strategy", "merge", "new_tokens"],
    columns: &[
        Column::measured("prefill_seconds"),
        Column::measured("decode_tokens_per_second"),
        Column::measured("recompute_tokens_per_second"),
        Column::measured("decode_speedup"),
        Column::exact("bytes_per_token_per_rank"),
        Column::exact("cache_bytes_per_rank"),
        Column::exact("cache_keys_max_over_mean"),
        Column {
            name: "max_rel_error",
            check: Check::AtMost(MAX_REL_ERROR),
        },
    ],
};

impl Experiment for DecodeKind {
    fn card(&self) -> &'static Card {
        &CARD
    }

    fn plan(&self, spec: &SpecText) -> Result<Box<dyn Plan>> {
        let parsed: Spec = spec.parse()?;
        let sweep = &parsed.sweep;
        let lens = spec.list("sweep", "prompt_lens", &sweep.prompt_lens)?;
        if lens.contains(&0) {
            return Err(spec.error("sweep", "prompt_lens", "a prompt needs at least 1 token"));
        }
        let ranks = spec.ranks("sweep", &sweep.ranks)?;
        let strategies = spec.strategies(
            "sweep",
            "strategies",
            spec.list("sweep", "strategies", &sweep.strategies)?,
        )?;
        let merges: Vec<DecodeMerge> = spec.parsed(
            "sweep",
            "merges",
            spec.list("sweep", "merges", &sweep.merges)?,
        )?;
        let new_tokens = spec.list("sweep", "new_tokens", &sweep.new_tokens)?;
        if new_tokens.contains(&0) {
            return Err(spec.error("sweep", "new_tokens", "decode at least 1 token"));
        }
        let measure = parsed.measure;
        if measure.vocab < 2 {
            return Err(spec.error("measure", "vocab", "at least 2 tokens"));
        }
        if measure.recompute_tokens == 0 {
            return Err(spec.error("measure", "recompute_tokens", "time at least 1 token"));
        }
        let model_spec = parsed.model.unwrap_or_else(small_model);
        let config = model_spec
            .config(measure.vocab)
            .and_then(|c| c.validate().map(|()| c).map_err(Into::into))
            .map_err(|e| anyhow::anyhow!("{}: [model]: {e}", spec.path.display()))?;
        let device = Default::default();
        let model = seeded::<Flex, _>(measure.seed, &device, || config.init::<Flex>(&device));
        let mut points = Vec::new();
        for &prompt_len in lens {
            for &ranks in ranks {
                for &strategy in &strategies {
                    for &merge in &merges {
                        for &new_tokens in new_tokens {
                            points.push(DecodePoint {
                                prompt_len,
                                ranks,
                                strategy,
                                merge,
                                new_tokens,
                            });
                        }
                    }
                }
            }
        }
        Ok(Box::new(DecodePlan {
            points,
            model,
            measure,
            recompute: BTreeMap::new(),
            warmed: false,
        }))
    }

    fn figure(&self, table: &Table, dir: &Path) -> Result<()> {
        // Per merge: decoding's speedup over the recompute against the prompt's length, a line per
        // rank count (the strategies' mean: the cache's rate hardly depends on the prefill's split).
        let mut sums: BTreeMap<(String, String, u64), (f64, usize)> = BTreeMap::new();
        let mut bytes: BTreeMap<(String, String), Vec<(f64, f64)>> = BTreeMap::new();
        for row in &table.rows {
            let merge = row.get("merge").unwrap_or("").to_owned();
            let ranks = row.num("ranks");
            let series = format!("N = {ranks}");
            let entry = sums
                .entry((merge.clone(), series, row.num("prompt_len") as u64))
                .or_default();
            entry.0 += row.num("decode_speedup");
            entry.1 += 1;
            bytes
                .entry(("bytes a rank sends per decoded token".into(), merge))
                .or_default()
                .push((ranks, row.num("bytes_per_token_per_rank")));
        }
        let mut speedups: BTreeMap<(String, String), Vec<(f64, f64)>> = BTreeMap::new();
        for ((merge, series, len), (sum, n)) in sums {
            speedups
                .entry((format!("merge = {merge}"), series))
                .or_default()
                .push((len as f64, sum / n as f64));
        }
        panels(
            &dir.join("decode.svg"),
            &Chart {
                title: "Decoding over a sharded KV cache: tokens/s over the full recompute's",
                x: Axis::new("prompt length (tokens)", Scale::Discrete),
                y: Axis::new("decode speedup (×)", Scale::Auto),
            },
            &Panel::grouped(speedups),
        )?;
        for points in bytes.values_mut() {
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            points.dedup_by(|a, b| a.0 == b.0);
        }
        panels(
            &dir.join("decode_bytes.svg"),
            &Chart {
                title: "Merge traffic per decoded token (any prompt length)",
                x: Axis::new("ranks N", Scale::Discrete),
                y: Axis::new("bytes per token per rank", Scale::Linear),
            },
            &Panel::grouped(bytes),
        )
    }
}

/// A deterministic prompt of `len` tokens in a vocabulary of `vocab`.
fn prompt(len: usize, vocab: usize) -> Prompt {
    Prompt::from(
        (0..len)
            .map(|t| ((t * 7919 + 13) % vocab) as u32)
            .collect::<Vec<_>>(),
    )
}

impl DecodePlan {
    /// How `point` decodes: greedy, never stopping early (the stop token lies outside the vocabulary).
    fn decoding(&self, point: &DecodePoint) -> Decoding<'static> {
        Decoding {
            max_new: point.new_tokens,
            stop: &[],
            pad: 0,
            partition: point.strategy,
            ranks: point.ranks,
            timeout: Duration::from_secs(600),
            cache: Some(point.merge),
            batch: 0,
            on_batch: None,
            keep_logits: true,
            sampling: Default::default(),
            stop_reply: None,
        }
    }

    /// Tokens per second of the full recompute of `point`'s prompt: `recompute_tokens` greedy
    /// tokens, each the whole sequence run through the ring (shorter than the cached decoding's
    /// mean length, so the recompute is timed at its cheapest).
    fn recompute_rate(&mut self, point: &DecodePoint) -> Result<f64> {
        let key = (point.prompt_len, point.ranks, point.strategy.name());
        if let Some(&rate) = self.recompute.get(&key) {
            return Ok(rate);
        }
        let decoding = Decoding {
            max_new: self.measure.recompute_tokens,
            cache: None,
            keep_logits: false,
            sampling: Default::default(),
            stop_reply: None,
            ..self.decoding(point)
        };
        let prompt = prompt(point.prompt_len, self.measure.vocab);
        let recomputed = decode(&self.model, &[prompt], &decoding)?;
        let seconds: f64 = recomputed.decode_seconds.iter().sum();
        let rate = recomputed.replies[0].len() as f64 / seconds;
        self.recompute.insert(key, rate);
        Ok(rate)
    }
}

/// Every decoded position's logits of `cached` against the whole sequence (prompt and reply)
/// recomputed on the same ranks.
fn logits_error(
    model: &Llama<Flex>,
    prompt: &Prompt,
    cached: &Decoded,
    decoding: &Decoding,
) -> Result<f64> {
    let reply = &cached.replies[0];
    let mut whole = prompt.clone();
    whole.tokens.extend(reply);
    let all = full_logits(
        model,
        &whole,
        &Decoding {
            cache: None,
            ..*decoding
        },
    )?;
    let vocab = all.len() / whole.tokens.len();
    let from = (prompt.tokens.len() - 1) * vocab;
    let got = &cached.logits[0];
    let deviation = reference::compare::deviation(got, &all[from..from + got.len()]);
    if let Some(wrong) = deviation.wrong {
        bail!("decoded logits: {wrong:?} at {}", deviation.at);
    }
    Ok(deviation.rel)
}

impl Plan for DecodePlan {
    fn points(&self) -> Vec<Point> {
        self.points
            .iter()
            .map(|p| {
                Point::single(Record::new([
                    ("prompt_len", p.prompt_len.to_string()),
                    ("ranks", p.ranks.to_string()),
                    ("strategy", p.strategy.name().to_owned()),
                    ("merge", p.merge.name().to_owned()),
                    ("new_tokens", p.new_tokens.to_string()),
                ]))
            })
            .collect()
    }

    fn processes(&self, index: usize) -> Option<usize> {
        Some(self.points[index].ranks)
    }

    fn compute(&mut self, index: usize, _: &PointContext) -> Result<Vec<Record>> {
        let point = self.points[index];
        let decoding = self.decoding(&point);
        // Launched as processes, the cached decodings run over MPI on every rank; the recompute
        // baseline and the float64 check run on rank 0's threads alone (its row is the one written).
        let rank0 = launched_rank().is_none_or(|r| r == 0);
        if !self.warmed {
            let short = prompt(point.prompt_len.min(256), self.measure.vocab);
            decode_here(&self.model, std::slice::from_ref(&short), &decoding)?;
            if rank0 {
                decode(
                    &self.model,
                    &[short],
                    &Decoding {
                        cache: None,
                        ..decoding
                    },
                )?;
            }
            self.warmed = true;
        }
        let prompt = prompt(point.prompt_len, self.measure.vocab);
        let cached = decode_here(&self.model, std::slice::from_ref(&prompt), &decoding)?;
        if !rank0 {
            return Ok(Vec::new());
        }
        let steps = cached.decoded_tokens[0];
        let decode_rate = if steps == 0 {
            0.0
        } else {
            steps as f64 / cached.decode_seconds[0]
        };
        let recompute_rate = self.recompute_rate(&point)?;
        let keys = &cached.cache_keys;
        let mean = keys.iter().sum::<usize>() as f64 / keys.len() as f64;
        let max_keys = keys.iter().copied().max().unwrap_or(0) as f64;
        Ok(vec![Record::of(&Row {
            prompt_len: point.prompt_len,
            ranks: point.ranks,
            strategy: point.strategy.name().to_owned(),
            merge: point.merge.name().to_owned(),
            new_tokens: point.new_tokens,
            prefill_seconds: cached.prefill_seconds[0],
            decode_tokens_per_second: decode_rate,
            recompute_tokens_per_second: recompute_rate,
            decode_speedup: decode_rate / recompute_rate,
            bytes_per_token_per_rank: cached.bytes_per_token_per_rank(),
            cache_bytes_per_rank: cached.cache_bytes.iter().copied().max().unwrap_or(0),
            cache_keys_max_over_mean: max_keys / mean,
            max_rel_error: logits_error(&self.model, &prompt, &cached, &decoding)?,
        })?])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(sweep: &str) -> Result<Box<dyn Plan>> {
        let text = format!("kind = \"decode\"\n[sweep]\n{sweep}\n");
        DecodeKind.plan(&SpecText::from_text(Path::new("d.toml"), text)?)
    }

    const GOOD: &str = "prompt_lens = [8]\nranks = [2]\nstrategies = [\"zigzag\"]\n\
                        merges = [\"ring\"]\nnew_tokens = [2]";

    #[test]
    fn a_spec_plans_its_product_and_bad_values_name_their_key_and_line() {
        assert_eq!(plan(GOOD).unwrap().points().len(), 1);
        for (from, to, message) in [
            (
                "prompt_lens = [8]",
                "prompt_lens = [8, 0]",
                "d.toml:3: sweep.prompt_lens",
            ),
            ("[\"ring\"]", "[\"tree\"]", "unknown decode merge 'tree'"),
            (
                "new_tokens = [2]",
                "new_tokens = [0]",
                "sweep.new_tokens: decode at least 1",
            ),
            (
                "ranks = [2]",
                "ranks = [0]",
                "ranks must be at least 1, got 0",
            ),
            ("[\"zigzag\"]", "[\"diagonal\"]", "diagonal"),
            ("new_tokens = [2]", "", "needs sweep.new_tokens"),
        ] {
            let err = plan(&GOOD.replace(from, to)).err().expect(to).to_string();
            assert!(err.contains(message), "{to}: {err}");
        }
    }

    #[test]
    fn a_point_decodes_exactly_and_counts_its_bytes() {
        let mut plan = plan(GOOD).unwrap();
        let table = Table::of(Vec::new());
        let bar = indicatif::ProgressBar::hidden();
        let context = PointContext {
            table: &table,
            dir: Path::new("."),
            bar: &bar,
        };
        let rows = plan.compute(0, &context).unwrap();
        let row = &rows[0];
        assert!(row.num("max_rel_error") <= MAX_REL_ERROR, "{row:?}");
        // One decoding step of 1 row × 4 heads × (16 + 1) f32 in each of 2 layers, merged round a
        // ring of 2: 2(N − 1)/N = 1 partial a rank.
        assert_eq!(row.num("bytes_per_token_per_rank"), (2 * 4 * 17 * 4) as f64);
        // 8 + 2 − 1 cached keys (the last token is not fed back), 2 layers × K and V × 2 kv heads ×
        // 16 × 4 bytes a key, on the rank holding 5 of them.
        assert_eq!(
            row.num("cache_bytes_per_rank"),
            (5 * 2 * 2 * 2 * 16 * 4) as f64
        );
    }
}
