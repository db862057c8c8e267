//! Ring attention inside your own Burn model: a tiny attention regressor, trained on 4 in-process
//! ranks with a partition strategy chosen by name, gives the same losses as on 1 rank.
//!
//! `cargo run -p workbench --example own_model -- [strategy]` (default `zigzag`).

use burn::backend::{Autodiff, Flex};
use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::{Tensor, TensorData, backend::Backend};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use workbench::train::{Objective, TrainOptions, train_objective};
use workbench::{RingBackend, RingContext, RingError, ring_attention};

type B = Autodiff<Flex>;
const SEQ: usize = 32;
const DIM: usize = 16;
const HEADS: usize = 2;

/// The user's model: one attention layer whose attention is ring attention.
#[derive(Module, Debug)]
struct TinyAttention<B: Backend> {
    q: Linear<B>,
    k: Linear<B>,
    v: Linear<B>,
    out: Linear<B>,
}

impl<B: RingBackend> TinyAttention<B> {
    /// `x`: this rank's tokens `[batch, local_len, DIM]`, in the order the partition gave them.
    fn forward(&self, x: Tensor<B, 3>, ctx: &Arc<RingContext>) -> Result<Tensor<B, 3>, RingError> {
        let [b, t, d] = x.dims();
        // [b, t, d] → [b, heads, t, head_dim], the layout ring_attention takes.
        let heads = |y: Tensor<B, 3>| y.reshape([b, t, HEADS, d / HEADS]).swap_dims(1, 2);
        let q = heads(self.q.forward(x.clone()));
        let (k, v) = (heads(self.k.forward(x.clone())), heads(self.v.forward(x)));
        let attended = ring_attention(q, k, v, ctx)?.0.swap_dims(1, 2);
        Ok(self.out.forward(attended.reshape([b, t, d])))
    }
}

/// Mean squared error against a running mean of the inputs (a causal task). A batch is the whole
/// sequence, `(inputs, targets)`, `SEQ × DIM` each, the same on every rank; each rank computes its
/// shard's share of the loss, and the shares sum to the global mean.
struct Regression;

impl Objective<B> for Regression {
    type Model = TinyAttention<B>;
    type Batch = (Vec<f32>, Vec<f32>);

    fn seq_len(&self, _: &Self::Batch) -> usize {
        SEQ
    }

    fn tokens(&self, _: &Self::Batch) -> usize {
        SEQ
    }

    fn local_loss(
        &self,
        model: &TinyAttention<B>,
        (x, y): &Self::Batch,
        ctx: &Arc<RingContext>,
    ) -> Result<Tensor<B, 1>, RingError> {
        let positions = ctx.positions(ctx.rank());
        let rows = |all: &[f32]| -> Tensor<B, 3> {
            let mine = positions
                .iter()
                .flat_map(|&p| all[p * DIM..(p + 1) * DIM].to_vec());
            let data = TensorData::new(mine.collect::<Vec<_>>(), [1, positions.len(), DIM]);
            Tensor::from_data(data, &Default::default())
        };
        let error = model.forward(rows(x), ctx)? - rows(y);
        Ok(error.powf_scalar(2.0).sum() / (SEQ * DIM) as f32)
    }
}

fn batch_for(step: usize) -> (Vec<f32>, Vec<f32>) {
    let x: Vec<f32> = (0..SEQ * DIM)
        .map(|i| ((i * 37 + step * 101) % 97) as f32 / 48.5 - 1.0)
        .collect();
    let mean =
        |i: usize| (0..=i / DIM).map(|s| x[s * DIM + i % DIM]).sum::<f32>() / (i / DIM + 1) as f32;
    let y = (0..SEQ * DIM).map(mean).collect();
    (x, y)
}

fn losses(model: &TinyAttention<B>, strategy: &str, ranks: usize) -> Result<Vec<f64>, String> {
    let options = TrainOptions {
        ranks,
        steps: 8,
        lr: 1e-2,
        checksum_every: 4,
        ..Default::default()
    };
    let partition = strategies::by_name(strategy).map_err(|e| e.to_string())?;
    let (model, stop) = (model.clone(), AtomicBool::new(false));
    let trained = train_objective(
        &Regression,
        model,
        partition,
        &options,
        batch_for,
        |_| {},
        &stop,
    );
    Ok(trained.map_err(|e| e.to_string())?.losses)
}

// Under `cargo test` the harness is the entry point.
#[cfg_attr(test, allow(dead_code))]
fn main() -> Result<(), String> {
    let strategy = std::env::args().nth(1).unwrap_or_else(|| "zigzag".into());
    train_on_one_and_four_ranks(&strategy)
}

/// Trains 8 steps on 1 rank and on 4 ranks of `strategy`; an error if the losses differ.
fn train_on_one_and_four_ranks(strategy: &str) -> Result<(), String> {
    let device = Default::default();
    // Burn's generator is shared by every thread: seed and draw under one lock. Burn draws weights on
    // first use: draw them now, so that both runs start from the same ones.
    let model = workbench::model::lazy::seeded::<B, _>(7, &device, || {
        let linear = || LinearConfig::new(DIM, DIM).init(&device);
        let (q, k, v, out) = (linear(), linear(), linear(), linear());
        let model = TinyAttention { q, k, v, out };
        workbench::model::lazy::materialize(&model);
        model
    });
    let (one, four) = (losses(&model, strategy, 1)?, losses(&model, strategy, 4)?);
    for (step, (a, b)) in one.iter().zip(&four).enumerate() {
        println!("step {step}: 1 rank {a:.6}   4 ranks ({strategy}) {b:.6}");
        if (a - b).abs() > 1e-4 * a.abs() {
            return Err(format!("step {step}: 1 rank {a} vs 4 ranks {b}"));
        }
    }
    if one[7] >= one[0] {
        return Err(format!("the model does not learn: {one:?}"));
    }
    println!("4-rank losses equal the 1-rank losses within 1e-4 relative");
    Ok(())
}

/// `cargo test` runs this example (`test = true` in workbench/Cargo.toml), with the features the
/// tests are built with.
#[test]
fn four_zigzag_ranks_give_the_one_rank_losses() {
    train_on_one_and_four_ranks("zigzag").unwrap();
}
