//! Training steps of a small LLaMA on random tokens: per-rank peak memory, the longest context under a
//! budget, step times and the model's FLOPs (the memory and MFU kinds).

use anyhow::Result;
use burn::backend::{Autodiff, Flex};
use datasets::SplitMix64;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use workbench::kernels::flops::{DENSE_PER_PARAM_TOKEN, MODEL_PER_PAIR_DIM, sequence_pairs};
use workbench::model::lazy::seeded;
use workbench::model::{Checkpoint, LlamaConfig};
use workbench::train::{Example, TrainOptions, train};
use workbench::{Kernel, RingConfig};

type Train = Autodiff<Flex>;
const TIMEOUT: Duration = Duration::from_secs(3600);

/// How a memory row runs one training step of the small model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// One rank, the generic kernel: the full `S × S` score matrix is materialized.
    Vanilla,
    /// One rank, the fused blockwise kernel, the feed-forward on the whole sequence at once.
    MemoryEfficient,
    /// One rank, blockwise attention and blockwise feed-forward (chunks of the block size),
    /// rematerialized as [`Variant::remat`] says: the Blockwise Parallel Transformer.
    Blockwise,
    /// N ranks, ring attention, the blockwise feed-forward rematerialized as for `Blockwise`.
    Ring,
}

impl Method {
    /// Every method, in the paper's order (most memory first).
    pub const ALL: [Method; 4] = [
        Method::Vanilla,
        Method::MemoryEfficient,
        Method::Blockwise,
        Method::Ring,
    ];

    /// Its name in specs and tables.
    pub fn name(self) -> &'static str {
        match self {
            Method::Vanilla => "vanilla",
            Method::MemoryEfficient => "memory-efficient",
            Method::Blockwise => "blockwise-attn+ffn",
            Method::Ring => "ring",
        }
    }
}

impl std::str::FromStr for Method {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        Method::ALL
            .into_iter()
            .find(|m| m.name() == name)
            .ok_or_else(|| {
                let known: Vec<&str> = Method::ALL.iter().map(|m| m.name()).collect();
                format!("unknown method '{name}'; known: {}", known.join(", "))
            })
    }
}

/// The small model of the memory and MFU tables.
#[derive(Debug, Clone, Copy, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SmallModel {
    /// Model width.
    pub d_model: usize,
    /// Decoder layers.
    pub layers: usize,
    /// Attention heads (as many key/value heads).
    pub heads: usize,
    /// Vocabulary size.
    pub vocab: usize,
}

impl Default for SmallModel {
    /// 2 layers of width 128, 4 heads, a vocabulary of 256.
    fn default() -> Self {
        SmallModel {
            d_model: 128,
            layers: 2,
            heads: 4,
            vocab: 256,
        }
    }
}

impl SmallModel {
    /// The SwiGLU feed-forward's hidden width.
    pub fn ffn_hidden(&self) -> usize {
        LlamaConfig::new(self.vocab)
            .with_d_model(self.d_model)
            .ffn_hidden()
    }
}

/// The model config of `m` with the feed-forward run as `ffn` says.
pub(super) fn llama(m: &SmallModel, ffn: Ffn) -> LlamaConfig {
    LlamaConfig::new(m.vocab)
        .with_d_model(m.d_model)
        .with_layers(m.layers)
        .with_heads(m.heads)
        .with_kv_heads(m.heads)
        .with_ffn_chunk(ffn.chunk)
        .with_checkpoint(ffn.checkpoint)
}

/// Zig-zag where it splits `seq` over `ranks`, else contiguous.
pub(super) fn partition_for(seq: usize, ranks: usize) -> &'static dyn strategies::Partition {
    let zigzag = strategies::by_name("zigzag").expect("zigzag is built in");
    if zigzag.validate(seq, ranks).is_ok() {
        zigzag
    } else {
        &strategies::Contiguous
    }
}

/// How the layers run: feed-forward tokens per chunk, and what each layer keeps for its backward
/// ([`workbench::model::Checkpoint`]).
#[derive(Debug, Clone, Copy)]
pub struct Ffn {
    /// Tokens per chunk.
    pub chunk: usize,
    /// What a layer keeps for its backward.
    pub checkpoint: Checkpoint,
}

impl Ffn {
    /// Chunks of `chunk` tokens, every activation kept for the backward.
    pub fn kept(chunk: usize) -> Self {
        Ffn {
            chunk,
            checkpoint: Checkpoint::None,
        }
    }
}

/// What [`train_steps`] measured.
pub struct Measured {
    /// Process peak bytes above the start, in the first step (the counting allocator's).
    pub allocator_peak: usize,
    /// Rank 0's engine ledger peak in the first step (deterministic: shapes only).
    pub engine_peak: u64,
    /// Seconds of each step after the first.
    pub times: Vec<f64>,
}

/// Trains `steps` steps on random tokens.
pub fn train_steps(
    m: &SmallModel,
    ranks: usize,
    seq: usize,
    ffn: Ffn,
    kernel: Kernel,
    steps: usize,
) -> Result<Measured> {
    let config = llama(m, ffn);
    let device = Default::default();
    let model = seeded::<Train, _>(0, &device, || config.init::<Train>(&device));
    let options = TrainOptions {
        ranks,
        ulysses: 1,
        ring: RingConfig {
            kernel,
            ..Default::default()
        },
        steps,
        lr: 1e-4,
        warmup_steps: 1,
        min_lr_ratio: 1.0,
        weight_decay: 0.0,
        grad_clip: None,
        checksum_every: 0,
        pad_token: 0,
        timeout: TIMEOUT,
        pack: false,
    };
    let partition = partition_for(seq, ranks);
    let peak = AtomicUsize::new(0);
    let engine_peak = AtomicU64::new(0);
    let times = std::sync::Mutex::new(Vec::new());
    crate::alloc::reset();
    train(
        model,
        partition,
        &options,
        |step| {
            let mut rng = SplitMix64::new(step as u64);
            vec![Example {
                tokens: (0..=seq)
                    .map(|_| rng.below(m.vocab as u64) as u32)
                    .collect(),
                weights: vec![1.0; seq],
            }]
        },
        |log| {
            if log.step == 0 {
                peak.store(crate::alloc::stats().peak_above_start, Ordering::Relaxed);
                engine_peak.store(log.engine_peak_bytes, Ordering::Relaxed);
            } else {
                times.lock().expect("times").push(log.seconds);
            }
        },
        &AtomicBool::new(false),
    )?;
    Ok(Measured {
        allocator_peak: peak.into_inner(),
        engine_peak: engine_peak.into_inner(),
        times: times.into_inner().expect("times"),
    })
}

/// Per-rank peak bytes of one training step, two ways.
#[derive(Debug, Clone, Copy)]
pub struct PeakPerRank {
    /// The process peak over the rank count (rank threads share the process; ranks are symmetric):
    /// what the machine allocated, which depends on its CPU's kernels and on scheduling.
    pub allocator: f64,
    /// What rank 0's attention engine held at once ([`workbench::ring::ledger`]): shapes only, the same on
    /// every machine; the model's other activations are not in it.
    pub engine: u64,
}

/// A method and what its layers keep for the backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variant {
    /// The method.
    pub method: Method,
    /// What the blockwise methods' layers keep (`ffn`: the rematerialized feed-forward, `block`:
    /// only each layer's input); vanilla and memory-efficient keep every activation whatever it says.
    pub remat: Checkpoint,
}

impl Variant {
    /// What the layers of this variant keep: `none` for vanilla and memory-efficient.
    pub fn checkpoint(self) -> Checkpoint {
        match self.method {
            Method::Vanilla | Method::MemoryEfficient => Checkpoint::None,
            Method::Blockwise | Method::Ring => self.remat,
        }
    }

    /// How this variant runs `seq` tokens given `ranks` (used by ring only) and `block` (the
    /// blockwise methods' feed-forward chunk).
    pub fn run(self, ranks: usize, seq: usize, block: usize) -> Run {
        let whole = Ffn::kept(seq);
        let blockwise = Ffn {
            chunk: block,
            checkpoint: self.checkpoint(),
        };
        let (ranks, ffn, kernel) = match self.method {
            Method::Vanilla => (1, whole, Kernel::Generic),
            Method::MemoryEfficient => (1, whole, Kernel::Fused),
            Method::Blockwise => (1, blockwise, Kernel::Fused),
            Method::Ring => (ranks, blockwise, Kernel::Fused),
        };
        Run { ranks, ffn, kernel }
    }
}

/// How a variant runs a sequence: on how many ranks, its feed-forward, its attention kernel.
#[derive(Debug, Clone, Copy)]
pub struct Run {
    /// Ranks (1 for the single-device methods).
    pub ranks: usize,
    /// Feed-forward chunks and what a layer keeps.
    pub ffn: Ffn,
    /// The attention kernel.
    pub kernel: Kernel,
}

impl Run {
    /// The ring configuration of this run (causal).
    pub fn ring(&self) -> RingConfig {
        RingConfig {
            kernel: self.kernel,
            causal: true,
            ..Default::default()
        }
    }
}

/// Per-rank peak bytes of one training step of `variant`.
pub fn peak_per_rank(
    m: &SmallModel,
    variant: Variant,
    ranks: usize,
    seq: usize,
    block: usize,
) -> Result<PeakPerRank> {
    let Run { ranks, ffn, kernel } = variant.run(ranks, seq, block);
    // The smaller of two runs: a fresh rank thread sometimes allocates once-only buffers (e.g. a
    // matmul packing workspace) inside the measured step.
    let first = train_steps(m, ranks, seq, ffn, kernel, 1)?;
    let second = train_steps(m, ranks, seq, ffn, kernel, 1)?;
    Ok(PeakPerRank {
        allocator: first.allocator_peak.min(second.allocator_peak) as f64 / ranks as f64,
        engine: first.engine_peak,
    })
}

/// The longest power-of-two sequence (from `start`) whose per-rank peak fits `budget` bytes;
/// stops at `cap`.
pub fn max_context(
    m: &SmallModel,
    variant: Variant,
    ranks: usize,
    block_cap: usize,
    budget: f64,
    start: usize,
    cap: usize,
) -> Result<Option<usize>> {
    let mut best = None;
    let mut seq = start;
    while seq <= cap {
        let block = (seq / ranks).min(block_cap);
        if peak_per_rank(m, variant, ranks, seq, block)?.allocator > budget {
            break;
        }
        best = Some(seq);
        seq *= 2;
    }
    Ok(best)
}

/// Float parameters of one decoder layer of `m`.
pub fn layer_params(m: &SmallModel) -> usize {
    let with = |layers| llama(&SmallModel { layers, ..*m }, Ffn::kept(1)).num_params();
    with(1) - with(0)
}

/// Training FLOPs of one step ([`workbench::kernels::flops`]): 6 · (non-embedding + head
/// parameters) · tokens for the matmuls, and 12 · d_model · (causal pairs) per layer for attention.
pub fn model_flops(m: &SmallModel, seq: usize) -> f64 {
    let config = llama(m, Ffn::kept(seq));
    let matmul_params = (config.num_params() - m.vocab * m.d_model) as f64;
    let dense = DENSE_PER_PARAM_TOKEN as f64 * matmul_params * seq as f64;
    let attention = (MODEL_PER_PAIR_DIM * sequence_pairs(seq, true)) as f64
        * m.d_model as f64
        * m.layers as f64;
    dense + attention
}
