//! Ring attention inside your own Burn model: a one-layer attention regressor trained on 4
//! in-process ranks (a strategy chosen by name) gives the losses it gives on 1 rank.
//!
//! `cargo run -p workbench --example own_model -- [strategy]` (default `zigzag`).

use burn::backend::{Autodiff, Flex};
use burn::tensor::{Int, Tensor, TensorData};
use std::sync::Arc;
use workbench::prelude::*;

type B = Autodiff<Flex>;
const SEQ: usize = 32;
const DIM: usize = 16;

/// Mean squared error against a running mean of the inputs (a causal task). A batch is the whole
/// sequence `(inputs, targets)`, `[1, SEQ, DIM]` each; each rank's share of the loss is its rows'.
struct RunningMean;

impl Objective<B> for RunningMean {
    type Model = RingAttention<B>;
    type Batch = (Tensor<B, 3>, Tensor<B, 3>);

    fn seq_len(&self, _: &Self::Batch) -> usize {
        SEQ
    }

    fn local_loss(
        &self,
        model: &RingAttention<B>,
        (x, y): &Self::Batch,
        ctx: &Arc<RingContext>,
    ) -> Result<Tensor<B, 1>, RingError> {
        let error = model.forward(ctx.shard(x.clone()), ctx)? - ctx.shard(y.clone());
        Ok(error.powf_scalar(2.0).sum() / (SEQ * DIM) as f32)
    }
}

/// Inputs in [−1, 1) and, at each position, the mean of the inputs so far.
fn batch(step: usize) -> (Tensor<B, 3>, Tensor<B, 3>) {
    let x = (0..SEQ * DIM).map(|i| ((i * 37 + step * 101) % 97) as f32 / 48.5 - 1.0);
    let device = Default::default();
    let x = Tensor::<B, 3>::from_data(TensorData::new(x.collect(), [1, SEQ, DIM]), &device);
    let seen = Tensor::<B, 1, Int>::arange(1..SEQ as i64 + 1, &device).float();
    (x.clone(), x.cumsum(1) / seen.reshape([1, SEQ, 1]))
}

/// Trains 8 steps on 1 rank and on 4 ranks of `strategy`; an error if the losses differ.
fn train_on_one_and_four_ranks(strategy: &str) -> Result<(), Box<dyn std::error::Error>> {
    let partition = strategies::by_name(strategy)?;
    // Seeded: every run draws the same weights, so its losses are the same from run to run.
    let device = Default::default();
    let model = workbench::model::lazy::seeded::<B, _>(7, &device, || {
        RingAttentionConfig::new(DIM, 2).init::<B>(&device)
    })?;
    let losses = |ranks| {
        let options = TrainOptions {
            ranks,
            steps: 8,
            lr: 1e-2,
            ..Default::default()
        };
        let run = Training::new(model.clone(), partition, batch).with_options(options);
        train_objective(&RunningMean, run).map(|trained| trained.losses)
    };
    let (one, four) = (losses(1)?, losses(4)?);
    for (step, (a, b)) in one.iter().zip(&four).enumerate() {
        println!("step {step}: 1 rank {a:.6}   4 ranks ({strategy}) {b:.6}");
        if (a - b).abs() > 1e-4 * a.abs() || one[7] >= one[0] {
            return Err(format!("step {step}: 1 rank {a} vs 4 ranks {b}; losses {one:?}").into());
        }
    }
    println!("4-rank losses equal the 1-rank losses within 1e-4 relative");
    Ok(())
}

#[cfg_attr(test, allow(dead_code))] // under `cargo test` the harness is the entry point
fn main() -> std::process::ExitCode {
    let strategy = std::env::args().nth(1).unwrap_or_else(|| "zigzag".into());
    match train_on_one_and_four_ranks(&strategy) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // One line, as the errors read (`unknown strategy 'zigzagg'; known strategies: …`).
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[test] // `test = true` in workbench/Cargo.toml: `cargo test` runs it
fn four_zigzag_ranks_give_the_one_rank_losses() {
    train_on_one_and_four_ranks("zigzag").unwrap();
}
