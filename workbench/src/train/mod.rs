//! SPMD training on ring attention: every rank holds its shard of the tokens and a replica of the
//! parameters; gradients are all-reduced through the transport before each AdamW step, so replicas
//! stay identical (checked by a checksum every few steps).
//!
//! [`run`] is the loop, [`step`] one step's gradient, [`objective`] what it optimizes and how batches are laid out for a partition,
//! [`replicas`] how gradients and parameters travel as one flat vector, [`resume`] where a run starts
//! and what a resumable run saves, [`generation`] greedy decoding with a trained model, [`agentic`]
//! the Agentic Transformer's objective and actions.

pub mod agentic;
mod error;
pub mod generation;
pub mod objective;
pub mod perplexity;
pub mod replicas;
pub mod resume;
pub mod run;
pub mod sampling;
pub mod step;

pub use error::TrainError;
pub use generation::{Decoded, Decoding, Prompt, decode, decode_on, full_logits, greedy};
pub use objective::{Example, Objective};
pub use perplexity::{Scored, score, score_on};
pub use replicas::{flat_params, with_flat_params};
pub use resume::{AfterStep, OptimizerRecord, Progress, Snapshot, TrainOptimizer};
pub use run::{
    StepLog, TrainOptions, Trained, Training, Watched, train, train_from, train_objective, train_on,
};
pub use sampling::Sampling;
pub use step::global_gradient;
pub use strategies::padded_len;
