//! `ringbench bench model`: the whole model's throughput on this machine: a prefill's tokens/s, a
//! decoding's tokens/s over the sharded KV cache, and a training step's tokens/s (forward, backward
//! and AdamW), for a Hugging Face model directory or the project's own model, on N ranks. Every row
//! names the CPU, its SIMD features, the threads a rank's kernels may use and the cores the work kept
//! busy; `scripts/model_speed.py` times the same shapes in PyTorch in the same run and writes the
//! ratios.

use super::at_least_one;
use crate::measure::machine::{
    BANDWIDTH_BUFFER_BYTES, Busy, BusyReading, cpu_features, cpu_model, read_bandwidth, threads,
};
use crate::results::{Record, Table};
use anyhow::{Context, Result, bail};
use burn::backend::{Autodiff, Flex};
use datasets::SplitMix64;
use indicatif::{ProgressBar, ProgressStyle};
use reference::compare::{Deviation, deviation};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::time::Duration;
use workbench::model::lazy::seeded;
use workbench::model::{Llama, LlamaConfig, LoraConfig, LoraTarget};
use workbench::ring::decode::DecodeMerge;
use workbench::train::{Decoding, Example, Prompt, TrainOptions, decode, train};
use workbench::{LayerBackend, RingConfig};

/// `ringbench bench model`'s arguments.
#[derive(Debug, clap::Args)]
pub struct BenchModelArgs {
    /// A Hugging Face model directory (LLaMA, Mistral, Qwen2) or a LLaMA-family GGUF file; without
    /// it, the project's own model of the sizes below, with random weights.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The own model's width.
    #[arg(long, default_value_t = 128, value_parser = at_least_one)]
    pub d_model: usize,
    /// The own model's layers.
    #[arg(long, default_value_t = 4, value_parser = at_least_one)]
    pub layers: usize,
    /// The own model's attention heads.
    #[arg(long, default_value_t = 4, value_parser = at_least_one)]
    pub heads: usize,
    /// The own model's key/value heads.
    #[arg(long, default_value_t = 2, value_parser = at_least_one)]
    pub kv_heads: usize,
    /// The own model's feed-forward width is rounded up to a multiple of this.
    #[arg(long, default_value_t = 32, value_parser = at_least_one)]
    pub ffn_multiple_of: usize,
    /// The own model's vocabulary (default: the line-retrieval tokenizer's).
    #[arg(long, value_parser = at_least_one)]
    pub vocab: Option<usize>,
    /// Prefill lengths: tokens of one prompt, its logits after the last.
    #[arg(long, value_delimiter = ',', default_value = "1024", value_parser = at_least_one)]
    pub prefill: Vec<usize>,
    /// Tokens decoded after a prompt of `--decode-prompt` tokens (0: no decoding row).
    #[arg(long, default_value_t = 64)]
    pub decode: usize,
    /// The decoded prompt's length.
    #[arg(long, default_value_t = 1024, value_parser = at_least_one)]
    pub decode_prompt: usize,
    /// Tokens of each training sequence (0: no training row).
    #[arg(long, default_value_t = 0)]
    pub train_seq: usize,
    /// Sequences a training step.
    #[arg(long, default_value_t = 1, value_parser = at_least_one)]
    pub train_batch: usize,
    /// Also a LoRA fine-tuning row (`train-lora`, with `--train-seq`): adapters of this rank on
    /// every linear map (alpha 2·r, PEFT's init), the base frozen (0: none).
    #[arg(long, default_value_t = 0)]
    pub train_lora: usize,
    /// Rank counts.
    #[arg(long, value_delimiter = ',', default_value = "1", value_parser = at_least_one)]
    pub ranks: Vec<usize>,
    /// The partition of the sequence over the ranks.
    #[arg(long, default_value = "zigzag")]
    pub strategy: String,
    /// Timed repetitions per row after one untimed warm-up; the fastest is reported.
    #[arg(long, default_value_t = 2, value_parser = at_least_one)]
    pub repeats: usize,
    /// What prefill and decoding multiply by: the f32 weights, or bf16 copies of every projection
    /// and the head (AVX512-BF16 where the CPU has it; training always runs in f32).
    #[arg(long, value_enum, default_value_t = WeightType::F32)]
    pub weights: WeightType,
    /// Also write bench_model.csv and bench_model.md here.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// The weights' type a prefill and a decode multiply by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WeightType {
    /// The model's own f32 weights.
    F32,
    /// bf16 copies, packed once at load (`workbench::model::bf16`).
    Bf16,
}

/// One row of `bench_model.csv`.
#[derive(Debug, Clone, Serialize)]
pub struct ModelBenchRow {
    /// `prefill`, `decode`, `train` (every weight) or `train-lora` (LoRA adapters on a frozen
    /// base).
    pub work: &'static str,
    /// The model directory's name, or `own`.
    pub model: String,
    /// Width.
    pub d_model: usize,
    /// Decoder layers.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Feed-forward width.
    pub ffn_hidden: usize,
    /// Vocabulary.
    pub vocab: usize,
    /// Parameters.
    pub params: usize,
    /// Tokens of the prompt (prefill, decode) or of each sequence (train).
    pub seq: usize,
    /// Sequences a step (train; 1 otherwise).
    pub batch: usize,
    /// Tokens the row's work processes: the prompt (prefill), the new tokens (decode), the step's
    /// tokens (train).
    pub tokens: usize,
    /// Ranks.
    pub ranks: usize,
    /// Partition.
    pub strategy: String,
    /// The weights multiplied by: `f32`, or `bf16` (prefill and decode rows of `--weights bf16`).
    pub weights: WeightType,
    /// The fastest repetition's seconds.
    pub seconds: f64,
    /// `tokens / seconds`.
    pub tokens_per_s: f64,
    /// (user + system) CPU seconds over wall seconds of that repetition: the cores kept busy
    /// (decode: of the whole call, its prefill included).
    pub cores_busy: f64,
    /// Threads of the pool a rank's kernels run on.
    pub threads: usize,
    /// The CPU's model name.
    pub cpu: String,
    /// Its vector and matrix features, detected at run time.
    pub cpu_features: String,
    /// The SIMD path that ran: ours (`RINGBENCH_SIMD` or the best detected) and the `gemm`
    /// crate's microkernels (`workbench::simd::describe`).
    pub simd: String,
    /// Seconds to load the model once before the rows (read its files or draw its weights, and
    /// build it): not part of any row's `seconds`.
    pub load_seconds: f64,
    /// Decode: the bytes of f32 weights one batch-1 step reads (every layer's, the final norm's and
    /// the output head's; one embedding row, not counted).
    pub weight_bytes_per_token: Option<usize>,
    /// Decode: the machine's memory read bandwidth, GB/s, measured in this run.
    pub read_gb_per_s: Option<f64>,
    /// Decode: bandwidth ÷ weight bytes, the tokens/s of a step that only read its weights.
    pub bandwidth_bound_tokens_per_s: Option<f64>,
    /// Decode: `tokens_per_s` over that bound.
    pub of_bandwidth_bound: Option<f64>,
}

/// The model under test: its config and where its weights come from.
struct Subject {
    name: String,
    config: LlamaConfig,
    dir: Option<PathBuf>,
}

impl Subject {
    fn of(args: &BenchModelArgs) -> Result<Subject> {
        if let Some(dir) = &args.model {
            let config = crate::pretrained::pretrained_config(dir)?;
            let name = dir
                .file_name()
                .map_or("model".into(), |n| n.to_string_lossy().into_owned());
            return Ok(Subject {
                name,
                config: config.model,
                dir: Some(dir.clone()),
            });
        }
        let vocab = args
            .vocab
            .unwrap_or_else(|| datasets::Tokenizer::line_retrieval().vocab_size());
        let config = LlamaConfig::new(vocab)
            .with_d_model(args.d_model)
            .with_layers(args.layers)
            .with_heads(args.heads)
            .with_kv_heads(args.kv_heads)
            .with_ffn_multiple_of(args.ffn_multiple_of);
        config.validate()?;
        Ok(Subject {
            name: "own".into(),
            config,
            dir: None,
        })
    }

    /// The model on backend `B`: the directory's weights, or drawn from seed 0.
    fn load<B: LayerBackend>(&self) -> Result<Llama<B>> {
        let device = Default::default();
        Ok(match &self.dir {
            Some(dir) => crate::pretrained::load_pretrained::<B>(dir, None, &device)?.0,
            None => seeded::<B, _>(0, &device, || self.config.init::<B>(&device)),
        })
    }
}

/// `ringbench bench model`.
pub fn run(args: &BenchModelArgs) -> Result<()> {
    let (rows, about) = measure(args)?;
    let table = Table::of(rows.iter().map(Record::of).collect::<Result<_>>()?);
    match &args.out {
        Some(dir) => {
            let md = table.write(dir, "bench_model", "bench model", &about)?;
            println!("\n{md}");
        }
        None => println!("\n{about}\n\n{}", table.markdown()),
    }
    Ok(())
}

/// The rows `args` asks for, measured, and a paragraph saying what they are (the bench's command
/// and the `model` kind's points).
pub fn measure(args: &BenchModelArgs) -> Result<(Vec<ModelBenchRow>, String)> {
    let partition = strategies::by_name(&args.strategy)?;
    let subject = Subject::of(args)?;
    let config = &subject.config;
    let (cpu, features, threads) = (cpu_model(), cpu_features(), threads());
    println!(
        "{}: {} parameters; {cpu} ({features}), {threads} threads",
        subject.name,
        config.num_params()
    );
    let mut works: Vec<(&'static str, usize, usize)> =
        args.prefill.iter().map(|&n| ("prefill", n, 1)).collect();
    if args.decode > 0 {
        works.push(("decode", args.decode_prompt, 1));
    }
    if args.train_seq > 0 {
        works.push(("train", args.train_seq, args.train_batch));
        if args.train_lora > 0 {
            works.push(("train-lora", args.train_seq, args.train_batch));
        }
    }
    let bar = ProgressBar::new((works.len() * args.ranks.len()) as u64).with_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} {elapsed_precise} {msg}")
            .context("progress template")?,
    );
    let loading = std::time::Instant::now();
    let inference = subject.load::<Flex>()?;
    let load_seconds = loading.elapsed().as_secs_f64();
    let simd = workbench::simd::describe();
    println!("loaded in {load_seconds:.3} s; SIMD {simd}");
    // With bf16 weights: how far the first prefill's last-token logits move from the f32 model's.
    let (inference, bf16_moved) = match args.weights {
        WeightType::F32 => (inference, None),
        WeightType::Bf16 => {
            let bf16 = inference.clone().with_bf16_weights();
            let seq = args.prefill.first().copied().unwrap_or(args.decode_prompt);
            let moved = logits_moved(&inference, &bf16, partition, seq)?;
            println!(
                "bf16 weights against f32, logits after a {seq}-token prompt: max |Δ| / max |logit| = \
                 {:.3e}",
                moved.rel
            );
            (bf16, Some((seq, moved)))
        }
    };
    // A decode step reads each weight once: the memory's read rate bounds its tokens/s.
    let untied_embedding = if config.tie_embeddings {
        0
    } else {
        config.vocab * config.d_model
    };
    // bf16: the projections and head at 2 bytes (the norms' few f32 values are counted at 2 too).
    let bytes_per_weight = match args.weights {
        WeightType::F32 => std::mem::size_of::<f32>(),
        WeightType::Bf16 => std::mem::size_of::<u16>(),
    };
    let weight_bytes = (config.num_params() - untied_embedding) * bytes_per_weight;
    let bandwidth = (args.decode > 0).then(read_bandwidth);
    let mut rows = Vec::new();
    for &(work, seq, batch) in &works {
        for &ranks in &args.ranks {
            bar.set_message(format!("{work} {seq} tokens × {batch} on {ranks} ranks"));
            let (tokens, reading) = match work {
                "prefill" => prefill(&inference, partition, seq, ranks, args.repeats)?,
                "decode" => decoding(&inference, partition, seq, args.decode, ranks, args.repeats)?,
                "train" => training(&subject, None, partition, (seq, batch, ranks), args.repeats)?,
                _ => {
                    let lora = Some(args.train_lora);
                    training(&subject, lora, partition, (seq, batch, ranks), args.repeats)?
                }
            };
            let row = ModelBenchRow {
                work,
                model: subject.name.clone(),
                d_model: config.d_model,
                layers: config.layers,
                heads: config.heads,
                kv_heads: config.kv_heads,
                ffn_hidden: config.ffn_hidden(),
                vocab: config.vocab,
                params: config.num_params(),
                seq,
                batch,
                tokens,
                ranks,
                strategy: args.strategy.clone(),
                weights: if work.starts_with("train") {
                    WeightType::F32
                } else {
                    args.weights
                },
                seconds: reading.seconds,
                tokens_per_s: tokens as f64 / reading.seconds,
                cores_busy: reading.cores,
                threads,
                cpu: cpu.clone(),
                cpu_features: features.clone(),
                simd: simd.clone(),
                load_seconds,
                weight_bytes_per_token: None,
                read_gb_per_s: None,
                bandwidth_bound_tokens_per_s: None,
                of_bandwidth_bound: None,
            };
            let row = match (work, bandwidth) {
                ("decode", Some(bandwidth)) => {
                    let bound = bandwidth / weight_bytes as f64;
                    ModelBenchRow {
                        weight_bytes_per_token: Some(weight_bytes),
                        read_gb_per_s: Some(bandwidth / 1e9),
                        bandwidth_bound_tokens_per_s: Some(bound),
                        of_bandwidth_bound: Some(row.tokens_per_s / bound),
                        ..row
                    }
                }
                _ => row,
            };
            let line = format!(
                "{work:7} {seq:6} tokens × {batch} on {ranks} ranks: {:8.3} s, {:9.1} tokens/s, {:.2} cores busy",
                row.seconds, row.tokens_per_s, row.cores_busy
            );
            if bar.is_hidden() {
                println!("{line}");
            } else {
                bar.println(line);
            }
            rows.push(row);
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    let about = format!(
        "{} ({} parameters: d_model {}, {} layers, {} heads / {} KV heads, feed-forward {}, vocabulary \
         {}), {} weights (prefill, decode; training f32), strategy {}; {cpu} ({features}), {threads} threads a rank's kernels may use. Each row \
         is the fastest of {} repetitions after one warm-up. prefill: one prompt, its logits after the \
         last token; decode: tokens generated over the KV cache after a prompt of `seq` tokens (the \
         steps after the prefill); train: one step of `batch` sequences of `seq` tokens (forward, \
         backward, all-reduce, AdamW; `train-lora`: LoRA adapters on every linear map, the base frozen). `cores_busy`: (user + system) CPU time over wall time; `load_seconds`: loading the model once before the rows (not in any row's seconds); `simd`: the kernels' SIMD path. Decode \
         rows also say how close they come to the memory's read rate: `read_gb_per_s` is measured \
         here (the best of three parallel sums over {} MiB), `bandwidth_bound_tokens_per_s` is that \
         rate over `weight_bytes_per_token`.{}",
        subject.name,
        config.num_params(),
        config.d_model,
        config.layers,
        config.heads,
        config.kv_heads,
        config.ffn_hidden(),
        config.vocab,
        match args.weights {
            WeightType::F32 => "f32",
            WeightType::Bf16 => "bf16",
        },
        args.strategy,
        args.repeats,
        BANDWIDTH_BUFFER_BYTES >> 20,
        match bf16_moved {
            Some((seq, moved)) => format!(
                " bf16 weights moved the last-token logits of a {seq}-token prompt from the f32 \
                 model's by {moved} (relative to the largest logit; each product's bound is \
                 (2⁻⁸ + k·2⁻²⁴)·|A|·|B|)."
            ),
            None => String::new(),
        },
    );
    Ok((rows, about))
}

/// The last-token logits of a random `seq`-token prompt on `other` against `model`'s, on 1 rank.
fn logits_moved(
    model: &Llama<Flex>,
    other: &Llama<Flex>,
    partition: &'static dyn strategies::Partition,
    seq: usize,
) -> Result<Deviation> {
    let prompt = Prompt::from(random_tokens(seq, model.vocab(), 1));
    let decoding = Decoding {
        keep_logits: true,
        sampling: Default::default(),
        stop_reply: None,
        ..decoding_of(partition, 1, 1)
    };
    let logits = |m: &Llama<Flex>| -> Result<Vec<f32>> {
        let decoded = decode(m, std::slice::from_ref(&prompt), &decoding)?;
        decoded
            .logits
            .into_iter()
            .next()
            .context("a prefill's logits")
    };
    Ok(deviation(&logits(other)?, &logits(model)?))
}

/// Random token ids below `vocab`, from `seed`.
fn random_tokens(len: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = SplitMix64::new(seed);
    (0..len).map(|_| rng.below(vocab as u64) as u32).collect()
}

/// How a bench decodes: greedy over the sharded cache, no stop token, one prompt.
fn decoding_of(
    partition: &'static dyn strategies::Partition,
    ranks: usize,
    max_new: usize,
) -> Decoding<'static> {
    Decoding {
        max_new,
        stop: &[],
        pad: 0,
        partition,
        ranks,
        timeout: Duration::from_secs(3600),
        cache: Some(DecodeMerge::AllGather),
        batch: 1,
        on_batch: None,
        keep_logits: false,
        sampling: Default::default(),
        stop_reply: None,
    }
}

/// The fastest of `repeats` runs of `work` after a warm-up, timed with the cores it kept busy.
fn fastest(repeats: usize, mut work: impl FnMut() -> Result<BusyReading>) -> Result<BusyReading> {
    crate::measure::timing::fastest_after_warm_up(repeats, &mut work, |r| r.seconds)
}

/// A prefill of `seq` tokens on `ranks` ranks and the first token picked from its logits.
fn prefill(
    model: &Llama<Flex>,
    partition: &'static dyn strategies::Partition,
    seq: usize,
    ranks: usize,
    repeats: usize,
) -> Result<(usize, BusyReading)> {
    let prompt = Prompt::from(random_tokens(seq, model.vocab(), 1));
    let decoding = decoding_of(partition, ranks, 1);
    let reading = fastest(repeats, || {
        let busy = Busy::start();
        let decoded = decode(model, std::slice::from_ref(&prompt), &decoding)?;
        if decoded.replies[0].len() != 1 {
            bail!(
                "a prefill picked {} tokens, not 1",
                decoded.replies[0].len()
            );
        }
        Ok(busy.stop())
    })?;
    Ok((seq, reading))
}

/// `new` tokens decoded over the cache after a prompt of `seq` tokens: the steps after the
/// prefill, timed by the decoding itself.
fn decoding(
    model: &Llama<Flex>,
    partition: &'static dyn strategies::Partition,
    seq: usize,
    new: usize,
    ranks: usize,
    repeats: usize,
) -> Result<(usize, BusyReading)> {
    let prompt = Prompt::from(random_tokens(seq, model.vocab(), 2));
    // The first new token comes from the prefill; `new` more are decoding steps.
    let decoding = decoding_of(partition, ranks, new + 1);
    let reading = fastest(repeats, || {
        let busy = Busy::start();
        let decoded = decode(model, std::slice::from_ref(&prompt), &decoding)?;
        let whole = busy.stop();
        if decoded.decoded_tokens[0] != new {
            bail!(
                "decoding ran {} steps, not {new}",
                decoded.decoded_tokens[0]
            );
        }
        Ok(BusyReading {
            seconds: decoded.decode_seconds[0],
            cores: whole.cores,
        })
    })?;
    Ok((new, reading))
}

/// Training steps of `batch` random sequences of `seq` tokens on `ranks` ranks, of every weight or
/// (`lora`: its rank) of LoRA adapters on every linear map: one warm-up step, then `repeats` timed
/// ones.
fn training(
    subject: &Subject,
    lora: Option<usize>,
    partition: &'static dyn strategies::Partition,
    (seq, batch, ranks): (usize, usize, usize),
    repeats: usize,
) -> Result<(usize, BusyReading)> {
    let model = subject.load::<Autodiff<Flex>>()?;
    let model = match lora {
        Some(rank) => model.with_lora(
            &LoraConfig {
                rank,
                alpha: 2.0 * rank as f64,
                dropout: 0.0,
                targets: LoraTarget::ALL.to_vec(),
                rslora: false,
                train_embeddings: false,
                train_norms: false,
                init: Default::default(),
            },
            0,
        )?,
        None => model,
    };
    let vocab = model.vocab();
    let options = TrainOptions {
        ranks,
        ring: RingConfig {
            causal: true,
            ..Default::default()
        },
        steps: 1 + repeats,
        lr: 1e-4,
        weight_decay: 0.1,
        timeout: Duration::from_secs(3600),
        ..Default::default()
    };
    // Each step's start, from the step log's seconds: the busy reading spans one step, taken
    // between two logs.
    let readings = Mutex::new(Vec::new());
    let since = Mutex::new(Busy::start());
    train(
        model,
        partition,
        &options,
        |step| {
            (0..batch)
                .map(|i| Example {
                    tokens: random_tokens(seq + 1, vocab, 1000 + (step * batch + i) as u64),
                    weights: vec![1.0; seq],
                })
                .collect()
        },
        |log| {
            let mut since = since.lock().expect("busy");
            let reading = std::mem::replace(&mut *since, Busy::start()).stop();
            if log.step > 0 {
                readings.lock().expect("readings").push(BusyReading {
                    seconds: log.seconds,
                    cores: reading.cores,
                });
            }
        },
        &AtomicBool::new(false),
    )?;
    let best = readings
        .into_inner()
        .expect("readings")
        .into_iter()
        .min_by(|a, b| a.seconds.total_cmp(&b.seconds))
        .context("no timed training step")?;
    Ok((seq * batch, best))
}
