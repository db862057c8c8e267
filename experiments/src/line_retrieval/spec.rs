//! The line-retrieval training spec (`experiments/line_retrieval.toml`), how its prompts are drawn,
//! and how a case becomes a weighted training example.

use anyhow::{Context, Result, bail};
use datasets::tokenizer::EOS;
use datasets::{
    Quiz, SplitMix64, TextTokenizer, TokenizerError, WordSplit, generate_quiz, name_pool,
};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Duration;
use workbench::hf::HfConfig;
use workbench::model::{Checkpoint, LlamaConfig, LoraConfig, RopeScaling};
use workbench::train::{Example, TrainOptions};
use workbench::{BackwardScheme, Direction, Kernel, RingConfig};

/// `experiments/line_retrieval.toml`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainSpec {
    /// `[model]`.
    pub model: ModelSpec,
    /// `[ring]`.
    pub ring: RingSpec,
    /// `[train]`.
    pub train: LineTrainSection,
    /// `[lora]`: fine-tune LoRA adapters (and, if it says, the norms or the embedding) on the
    /// frozen model instead of every weight; the run's `out` then holds a PEFT adapter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<LoraConfig>,
    /// `[[stages]]`: a curriculum (LWM's: longer sequences, a raised RoPE base), each stage a run
    /// of its own in `train.out/NAME` starting from the one before (its checkpoint, Hugging Face
    /// directory or adapter), with the stage's values in place of the spec's. A stage that
    /// finished is kept; rerunning the command resumes where the stages stopped.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<StageSpec>,
}

/// One stage of a curriculum: its name (its run's directory under `train.out`) and what it changes.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageSpec {
    /// The stage's directory under `train.out`.
    pub name: String,
    /// Its steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<usize>,
    /// Its peak learning rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr: Option<f64>,
    /// Its warmup steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup_steps: Option<usize>,
    /// Its prompts' fewest lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_lines: Option<usize>,
    /// Its prompts' most lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_lines: Option<usize>,
    /// Its prompts per step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<usize>,
    /// Its data seed (a stage that continues at the same lengths draws records the last one did
    /// not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Its RoPE base.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    /// Its RoPE scaling (`[stages.rope_scaling]`, as `[model.rope_scaling]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<serde_json::Map<String, serde_json::Value>>,
}

impl TrainSpec {
    /// The runs of the spec: itself, or each stage's (its values in place, `train.out/NAME` its
    /// out, the stage before it as its start: its adapter with `[lora]`, else its checkpoint, or
    /// its Hugging Face directory as `model.hf` when the spec starts from one).
    pub fn runs(&self) -> Result<Vec<TrainSpec>> {
        if self.stages.is_empty() {
            return Ok(vec![self.clone()]);
        }
        if self.train.init.is_some() && self.lora.is_none() && self.model.hf.is_some() {
            bail!("stages of a Hugging Face model start from model.hf: give no train.init");
        }
        let mut names = std::collections::BTreeSet::new();
        let mut runs: Vec<TrainSpec> = Vec::with_capacity(self.stages.len());
        for stage in &self.stages {
            let bad_name = stage.name.is_empty()
                || stage.name.contains(['/', '\\'])
                || stage.name.starts_with('.');
            if bad_name || !names.insert(stage.name.clone()) {
                bail!(
                    "stages.name = {:?}: each stage needs its own plain directory name",
                    stage.name
                );
            }
            let mut run = self.clone();
            run.stages.clear();
            let t = &mut run.train;
            t.steps = stage.steps.unwrap_or(t.steps);
            t.lr = stage.lr.unwrap_or(t.lr);
            t.warmup_steps = stage.warmup_steps.unwrap_or(t.warmup_steps);
            t.min_lines = stage.min_lines.unwrap_or(t.min_lines);
            t.num_lines = stage.num_lines.unwrap_or(t.num_lines);
            t.batch = stage.batch.unwrap_or(t.batch);
            t.seed = stage.seed.unwrap_or(t.seed);
            t.out = self.train.out.join(&stage.name);
            if stage.rope_theta.is_some() {
                run.model.rope_theta = stage.rope_theta;
            }
            if stage.rope_scaling.is_some() {
                run.model.rope_scaling = stage.rope_scaling.clone();
            }
            if let Some(before) = runs.last() {
                let previous = before.train.out.clone();
                match (&self.lora, &self.model.hf) {
                    (None, Some(_)) => run.model.hf = Some(previous),
                    _ => run.train.init = Some(previous),
                }
            }
            runs.push(run);
        }
        Ok(runs)
    }
}

/// The LLaMA-style model's shape: the project's own (every size given), or a Hugging Face model
/// directory's (`hf`; a size given beside it must agree with its config.json).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// A Hugging Face model directory to start from: its architecture, weights and tokenizer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hf: Option<PathBuf>,
    /// Model width.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub d_model: Option<usize>,
    /// Decoder layers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers: Option<usize>,
    /// Attention heads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heads: Option<usize>,
    /// Key/value heads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_heads: Option<usize>,
    /// The feed-forward width is rounded up to a multiple of this (the project's own model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ffn_multiple_of: Option<usize>,
    /// RoPE base.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    /// RoPE's context-extension scaling, `[model.rope_scaling]` with `rope_type` = `linear`,
    /// `dynamic`, `llama3` or `yarn` and its parameters, read as config.json's `rope_scaling` is
    /// (the keys it omits get transformers' defaults; [`ModelSpec::scaling`]). A model trained
    /// without it (`train.init`, or `hf`) continues with it: a context extension changes the
    /// rotation, not the weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<serde_json::Map<String, serde_json::Value>>,
    /// Tokens per feed-forward chunk.
    #[serde(default = "default_ffn_chunk")]
    pub ffn_chunk: usize,
    /// Recompute activations in the backward instead of storing them (Burn's balanced checkpointing).
    #[serde(default)]
    pub checkpointing: bool,
    /// What each layer keeps for its backward: `none`, `ffn` (the feed-forward's hidden activations
    /// are recomputed: the Blockwise Parallel Transformer) or `block` (only the layer's input).
    #[serde(default)]
    pub checkpoint: Checkpoint,
    /// A sliding window of this many tokens on the windowed layers (none: every layer attends its
    /// whole document).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<usize>,
    /// Which layers are windowed: layer i when `i % window_every == 0` (1, the default: all; 2:
    /// every other one, as Gemma 2 and gpt-oss alternate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_every: Option<usize>,
}

/// `questions`' default, for every spec that draws [`Prompts`]: one question a record.
pub(crate) fn one_question() -> usize {
    1
}

fn default_ffn_chunk() -> usize {
    256
}

/// How the ring runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RingSpec {
    /// Ranks (threads), or the world size under MPI.
    pub ranks: usize,
    /// Partition strategy by name.
    pub strategy: String,
    /// Forward direction: cw or ccw.
    pub forward: String,
    /// Backward scheme: kv, kv-reverse or q.
    pub backward: String,
    /// Kernel: fused or generic.
    pub kernel: String,
}

/// `[train]`: optimizer, schedule, data and stopping.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LineTrainSection {
    /// Optimizer steps.
    pub steps: usize,
    /// Prompts per step.
    pub batch: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Linear warmup steps.
    pub warmup_steps: usize,
    /// The cosine schedule's floor over the peak.
    pub min_lr_ratio: f64,
    /// AdamW's decoupled weight decay.
    pub weight_decay: f32,
    /// Global gradient-norm clip.
    pub grad_clip: Option<f32>,
    /// Seeds the model and the batches.
    pub seed: u64,
    /// Loss weight of the prompt's own next-token predictions (the answer and EOS weigh 1). A small
    /// language-modelling weight teaches copying (the asked name repeats an earlier one) early.
    #[serde(default)]
    pub lm_weight: f32,
    /// Each training prompt has between `min_lines` and `num_lines` lines (line-retrieval data).
    #[serde(default)]
    pub min_lines: usize,
    /// Most lines in a prompt (line-retrieval data).
    #[serde(default)]
    pub num_lines: usize,
    /// Prompt through the model's chat template: a record and its first question as the user's
    /// turn, each answer as the assistant's reply, each later question a user turn of its own; the
    /// loss is on the replies and their end-of-turn tokens (every other token weighs `lm_weight`).
    #[serde(default)]
    pub chat: bool,
    /// Train on these conversations instead of line retrieval: a JSONL file, one
    /// `{"messages": [{"role": "system"|"user"|"assistant", "content": ...}, ...]}` a line, through
    /// the model's chat template, the loss on the assistant's turns; `batch` a step, in a seeded
    /// order drawn anew each pass over the file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversations: Option<PathBuf>,
    /// Lines asked about in each training prompt, one question after another (distinct lines; at
    /// most the prompt's lines). More answers per prompt give more retrieval gradient per token.
    #[serde(default = "one_question")]
    pub questions: usize,
    /// Compare parameter checksums across ranks every this many steps (0: never).
    pub checksum_every: usize,
    /// Where the checkpoint, metrics and the copy of this spec go.
    pub out: PathBuf,
    /// Pack each step's prompts end to end into one sequence of documents (attention stays
    /// inside each prompt) instead of one padded row each.
    #[serde(default)]
    pub pack: bool,
    /// Start from this checkpoint's weights instead of a seeded init (a curriculum stage: e.g. short
    /// prompts first, then long); its architecture must be `[model]`'s.
    #[serde(default)]
    pub init: Option<PathBuf>,
    /// Stop early once the loss averaged over the last 50 steps is below this (0: never).
    pub stop_loss: f64,
    /// Wall-clock limit of one sitting, in minutes (0: none): the run saves a resumable checkpoint
    /// and stops; the same command resumes it.
    pub max_minutes: f64,
    /// Save a resumable checkpoint every this many steps (at least 1). Absent: once a minute has
    /// passed since the last save, or 50 times the last save's own duration if longer (a save then
    /// costs at most 2% of the run's time). A run also saves at its last step and when it stops.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_every: Option<usize>,
}

/// The optimizer and schedule of a line-retrieval training run, whichever spec section set them.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    /// Optimizer steps.
    pub steps: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Linear warmup steps.
    pub warmup_steps: usize,
    /// The cosine schedule's floor over the peak.
    pub min_lr_ratio: f64,
    /// AdamW's decoupled weight decay.
    pub weight_decay: f32,
    /// Global gradient-norm clip.
    pub grad_clip: Option<f32>,
    /// Pack each step's prompts into one sequence of documents.
    pub pack: bool,
    /// Compare parameter checksums across ranks every this many steps (0: never).
    pub checksum_every: usize,
}

impl Schedule {
    /// The training options of this schedule on `ranks` ranks with `ring`: the one place a
    /// line-retrieval spec becomes [`TrainOptions`] (padding with EOS, a 10-minute peer timeout).
    pub fn options(&self, ranks: usize, ring: RingConfig) -> TrainOptions {
        TrainOptions {
            ranks,
            ulysses: 1,
            ring,
            steps: self.steps,
            lr: self.lr,
            warmup_steps: self.warmup_steps,
            min_lr_ratio: self.min_lr_ratio,
            weight_decay: self.weight_decay,
            grad_clip: self.grad_clip,
            checksum_every: self.checksum_every,
            pad_token: EOS,
            timeout: Duration::from_secs(600),
            pack: self.pack,
        }
    }
}

impl LineTrainSection {
    /// `checkpoint_every`, refused when 0.
    pub fn checkpoint_every(&self) -> Result<Option<usize>> {
        if self.checkpoint_every == Some(0) {
            bail!(
                "train.checkpoint_every = 0: save every K >= 1 steps, or leave it out to save about \
                 once a minute"
            );
        }
        Ok(self.checkpoint_every)
    }

    /// Its optimizer and schedule.
    pub fn schedule(&self) -> Schedule {
        Schedule {
            steps: self.steps,
            lr: self.lr,
            warmup_steps: self.warmup_steps,
            min_lr_ratio: self.min_lr_ratio,
            weight_decay: self.weight_decay,
            grad_clip: self.grad_clip,
            pack: self.pack,
            checksum_every: self.checksum_every,
        }
    }
}

impl RingSpec {
    /// The ring's options (always causal).
    pub fn config(&self) -> Result<RingConfig> {
        Ok(RingConfig {
            causal: true,
            forward: self.forward.parse::<Direction>()?,
            backward: self.backward.parse::<BackwardScheme>()?,
            kernel: self.kernel.parse::<Kernel>()?,
            scale: None,
            window: None,
            softcap: None,
            lockstep: false,
            precision: Default::default(),
        })
    }
}

impl ModelSpec {
    /// The project's own model of these sizes.
    pub fn own(
        [d_model, layers, heads, kv_heads, ffn_multiple_of]: [usize; 5],
        rope_theta: f64,
        ffn_chunk: usize,
    ) -> Self {
        ModelSpec {
            hf: None,
            d_model: Some(d_model),
            layers: Some(layers),
            heads: Some(heads),
            kv_heads: Some(kv_heads),
            ffn_multiple_of: Some(ffn_multiple_of),
            rope_theta: Some(rope_theta),
            rope_scaling: None,
            ffn_chunk,
            checkpointing: false,
            checkpoint: Checkpoint::None,
            window: None,
            window_every: None,
        }
    }

    /// The project's own model's config for a vocabulary of `vocab`: every size must be given, and
    /// no `hf`.
    pub fn config(&self, vocab: usize) -> Result<LlamaConfig> {
        if let Some(dir) = &self.hf {
            bail!(
                "model.hf = {}: this trains the project's own model; give its sizes instead",
                dir.display()
            );
        }
        let need = |key: &str, v: Option<usize>| {
            v.ok_or_else(|| anyhow::anyhow!("model.{key} is required (or model.hf)"))
        };
        Ok(LlamaConfig::new(vocab)
            .with_d_model(need("d_model", self.d_model)?)
            .with_layers(need("layers", self.layers)?)
            .with_heads(need("heads", self.heads)?)
            .with_kv_heads(need("kv_heads", self.kv_heads)?)
            .with_ffn_multiple_of(need("ffn_multiple_of", self.ffn_multiple_of)?)
            .with_rope_theta(
                self.rope_theta
                    .ok_or_else(|| anyhow::anyhow!("model.rope_theta is required (or model.hf)"))?,
            )
            .with_rope_scaling(self.scaling(None)?.unwrap_or_default())
            .with_ffn_chunk(self.ffn_chunk)
            .with_checkpoint(self.checkpoint)
            .with_window(self.window)
            .with_window_every(self.window_every.unwrap_or(1)))
    }

    /// The scaling `[model.rope_scaling]` gives, if any, read as config.json's `rope_scaling` with
    /// the same defaults; `max_positions` is the model's `max_position_embeddings` where it has one
    /// (dynamic scaling's trained length, YaRN's original length), which a `max_position_embeddings`
    /// in the table overrides.
    pub fn scaling(&self, max_positions: Option<usize>) -> Result<Option<RopeScaling>> {
        let Some(table) = &self.rope_scaling else {
            return Ok(None);
        };
        Ok(Some(workbench::hf::rope_scaling_of(
            Path::new("[model.rope_scaling]"),
            table,
            max_positions,
        )?))
    }

    /// With `hf`: its directory's (or GGUF file's) config, with this spec's chunking,
    /// checkpointing and RoPE (a fine-tuning may raise the base or extend the context: the run
    /// trains with them and writes them into what it saves); a size given here that contradicts
    /// the model's is refused naming both.
    pub fn hf_config(&self, dir: &Path) -> Result<HfConfig> {
        let mut hf = crate::pretrained::pretrained_config(dir)?;
        let m = &hf.model;
        let given = [
            ("d_model", self.d_model, m.d_model),
            ("layers", self.layers, m.layers),
            ("heads", self.heads, m.heads),
            ("kv_heads", self.kv_heads, m.kv_heads),
        ];
        for (key, mine, theirs) in given {
            if let Some(mine) = mine
                && mine != theirs
            {
                bail!(
                    "model.{key} = {mine} contradicts {}'s config ({theirs})",
                    dir.display()
                );
            }
        }

        if let Some(k) = self.ffn_multiple_of {
            bail!(
                "model.ffn_multiple_of = {k}: with model.hf the feed-forward width is config.json's \
                 intermediate_size ({})",
                m.ffn_hidden()
            );
        }
        let scaling = self.scaling(hf.max_positions)?.unwrap_or(m.rope_scaling);
        let theta = self.rope_theta.unwrap_or(m.rope_theta);
        hf.model = hf
            .model
            .clone()
            .with_rope_theta(theta)
            .with_rope_scaling(scaling)
            .with_ffn_chunk(self.ffn_chunk)
            .with_checkpoint(self.checkpoint);
        Ok(hf)
    }
}

/// Reads a training spec; a TOML error names the file.
pub fn load_spec(path: &Path) -> Result<TrainSpec> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    toml::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{}: {}", path.display(), e.to_string().replace('\n', " ")))
}

/// The most lines of the training prompts of the checkpoint in `dir`, read from its `train.toml`
/// alone (a spec an older ringbench wrote, with keys this one no longer takes, still says it);
/// `None` without one (a Hugging Face directory).
pub fn trained_lines(dir: &Path) -> Option<usize> {
    let text = std::fs::read_to_string(dir.join("train.toml")).ok()?;
    let spec: toml::Table = toml::from_str(&text).ok()?;
    let lines = spec.get("train")?.get("num_lines")?.as_integer()?;
    usize::try_from(lines).ok()
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
    /// Lines asked about in each prompt (at least 1; a prompt of fewer lines asks each once).
    pub questions: usize,
    /// Loss weight of the prompt's own tokens ([`example`]).
    pub lm_weight: f32,
}

impl Prompts {
    /// An error naming the line counts unless `1 <= min_lines <= num_lines <=` the training words'
    /// pool of distinct line names, or unless `questions >= 1`.
    pub fn check(&self) -> Result<()> {
        if self.questions == 0 {
            bail!("questions = 0: ask at least 1 question a prompt");
        }
        let pool = name_pool(WordSplit::Train);
        if self.num_lines > pool {
            bail!(
                "num_lines = {} is more than the {pool} distinct line names the training words give \
                 (a record's lines have distinct names)",
                self.num_lines
            );
        }
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
    pub fn batch(
        &self,
        tokenizer: &dyn TextTokenizer,
        step: usize,
    ) -> Result<Vec<Example>, TokenizerError> {
        let mut rng = self.step_rng(step);
        (0..self.batch)
            .map(|_| example(tokenizer, &self.draw(&mut rng), self.lm_weight))
            .collect()
    }

    /// The generator of step `step`'s records.
    pub(crate) fn step_rng(&self, step: usize) -> SplitMix64 {
        SplitMix64::new(self.seed ^ (step as u64).wrapping_mul(0x2545_F491_4F6C_DD1D))
    }

    /// One record from `rng`: `min_lines..=num_lines` lines of training words, `questions` asked.
    pub(crate) fn draw(&self, rng: &mut SplitMix64) -> Quiz {
        let lines = rng.range_inclusive(self.min_lines as u64, self.num_lines as u64) as usize;
        generate_quiz(rng, lines, self.questions, WordSplit::Train)
            .expect("line counts checked by Prompts::check")
    }
}

/// `[BOS] prompt answer [EOS] (question answer [EOS])*` (BOS when the tokenizer has one): each
/// answer and its EOS weigh 1, every other token `lm_weight`. With one question this is the
/// evaluation's prompt and its expected reply.
pub fn example(
    tokenizer: &dyn TextTokenizer,
    quiz: &Quiz,
    lm_weight: f32,
) -> Result<Example, TokenizerError> {
    let mut tokens: Vec<u32> = tokenizer.bos().into_iter().collect();
    // weights[i] weighs predicting tokens[i + 1]: the answers' and EOSes' predictions weigh 1.
    let mut weights = Vec::new();
    let first = (quiz.first.prompt.as_str(), quiz.first.expected_number);
    let follow_ups = quiz.follow_ups.iter().map(|(q, v)| (q.as_str(), *v));
    for (question, value) in std::iter::once(first).chain(follow_ups) {
        tokens.extend(tokenizer.text_ids(question)?);
        weights.resize(tokens.len() - 1, lm_weight);
        tokens.extend(tokenizer.text_ids(&value.to_string())?);
        tokens.push(tokenizer.eos());
        weights.resize(tokens.len() - 1, 1.0);
    }
    Ok(Example { tokens, weights })
}

#[cfg(test)]
mod tests {
    use super::*;
    use datasets::Tokenizer;

    /// `[model.rope_scaling]` gets config.json's defaults for the keys it omits (YaRN's betas,
    /// attention factor and truncation), and its errors name the key.
    #[test]
    fn a_rope_scaling_table_gets_config_jsons_defaults() {
        let spec = |scaling: &str| -> ModelSpec {
            toml::from_str(&format!(
                "d_model = 16\nlayers = 1\nheads = 2\nkv_heads = 1\nffn_multiple_of = 8\n\
                 rope_theta = 10000.0\n[rope_scaling]\n{scaling}"
            ))
            .unwrap()
        };
        let yarn =
            spec("rope_type = \"yarn\"\nfactor = 4.0\noriginal_max_position_embeddings = 64\n");
        assert_eq!(
            yarn.scaling(None).unwrap(),
            Some(RopeScaling::Yarn {
                factor: 4.0,
                original_max_position_embeddings: 64,
                beta_fast: 32.0,
                beta_slow: 1.0,
                attention_factor: RopeScaling::yarn_mscale(4.0, 1.0),
                truncate: true,
            })
        );
        assert_eq!(
            yarn.config(40).unwrap().rope_scaling,
            yarn.scaling(None).unwrap().unwrap()
        );
        // YaRN's original length defaults to the model's.
        let short = spec("rope_type = \"yarn\"\nfactor = 2.0\n");
        assert!(matches!(
            short.scaling(Some(128)).unwrap(),
            Some(RopeScaling::Yarn {
                original_max_position_embeddings: 128,
                ..
            })
        ));
        // Dynamic scaling's trained length, given in the table for the project's own model.
        let dynamic =
            spec("rope_type = \"dynamic\"\nfactor = 2.0\nmax_position_embeddings = 512\n");
        assert_eq!(
            dynamic.scaling(None).unwrap(),
            Some(RopeScaling::Dynamic {
                factor: 2.0,
                max_position_embeddings: 512
            })
        );
        let err = format!(
            "{:#}",
            spec("rope_type = \"linear\"\n").scaling(None).unwrap_err()
        );
        assert!(err.contains("factor") && err.contains("required"), "{err}");
    }

    /// A record of more lines than the training words have distinct names is refused by the spec
    /// check, naming the limit (drawing it would fail inside the rank threads).
    #[test]
    fn more_lines_than_the_name_pool_is_refused_naming_the_limit() {
        let pool = name_pool(WordSplit::Train);
        let prompts = |num_lines| Prompts {
            seed: 0,
            batch: 1,
            min_lines: 1,
            num_lines,
            questions: 1,
            lm_weight: 1.0,
        };
        assert!(prompts(pool).check().is_ok());
        let err = prompts(pool + 1).check().unwrap_err().to_string();
        assert!(
            err.contains(&format!("num_lines = {}", pool + 1)) && err.contains(&pool.to_string()),
            "{err}"
        );
    }

    /// The predictions weighing 1 are exactly each asked value's digits and its EOS, in order; every
    /// other prediction weighs `lm_weight`; one question is the evaluation's prompt and reply.
    #[test]
    fn only_the_answers_and_their_eos_weigh_one() {
        let tokenizer = Tokenizer::line_retrieval();
        let quiz = generate_quiz(&mut SplitMix64::new(7), 6, 3, WordSplit::Train).unwrap();
        let ex = example(&tokenizer, &quiz, 0.25).unwrap();
        assert_eq!(ex.weights.len(), ex.tokens.len() - 1);
        let mut answers = Vec::new();
        let mut answer = Vec::new();
        for (w, &next) in ex.weights.iter().zip(&ex.tokens[1..]) {
            match *w {
                1.0 if next == tokenizer.eos() => {
                    answers.push(tokenizer.ids_text(&answer).unwrap());
                    answer.clear();
                }
                1.0 => answer.push(next),
                0.25 => assert!(answer.is_empty(), "a prompt token inside an answer"),
                other => panic!("weight {other}"),
            }
        }
        let want: Vec<String> = std::iter::once(quiz.first.expected_number)
            .chain(quiz.follow_ups.iter().map(|(_, v)| *v))
            .map(|v| v.to_string())
            .collect();
        assert_eq!(answers, want);
        assert_eq!(ex.tokens.last(), Some(&tokenizer.eos()));

        let one = generate_quiz(&mut SplitMix64::new(7), 6, 1, WordSplit::Train).unwrap();
        let ex = example(&tokenizer, &one, 0.25).unwrap();
        let mut want: Vec<u32> = tokenizer.bos().into_iter().collect();
        want.extend(tokenizer.text_ids(&one.first.prompt).unwrap());
        want.extend(
            tokenizer
                .text_ids(&one.first.expected_number.to_string())
                .unwrap(),
        );
        want.push(tokenizer.eos());
        assert_eq!(ex.tokens, want);
    }
}
