//! One step's gradient, as every rank sees it: local loss, backward, the ranks' health, all-reduce.

use super::error::TrainError;
use super::objective::{Example, NextToken, Objective, assemble, layout_for_layers};
use super::replicas::{all_finite, flat_gradient};
use crate::block::{Block, BlockKind};
use crate::error::all_or_root_cause;
use crate::host::HostRead;
use crate::model::Llama;
use crate::model::layer::LayerBackend;
use crate::model::lazy::materialize;
use crate::ring::context::{RingConfig, RingContext};
use crate::ring::op::RingBackend;
use crate::transport::run_ranks;
use burn::module::Module;
use burn::optim::GradientsParams;
use burn::tensor::ElementConversion;
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};
use std::sync::Arc;
use std::time::Duration;
use strategies::Partition;

/// One step's global loss and all-reduced gradient, as every rank sees them.
pub(crate) struct StepGradient<B: Backend> {
    /// The batch's loss: the sum over ranks of their local losses.
    pub(crate) loss: f64,
    /// Whether rank 0 asked every rank to stop after this step.
    pub(crate) stop: bool,
    /// Every parameter's gradient summed over ranks, in module order, before any clipping: one 1-d
    /// tensor on the rank's device.
    pub(crate) flat: Tensor<B, 1>,
}

/// This rank's loss and gradient for `batch`, all-reduced over the ranks of `ctx`.
///
/// A non-finite loss or gradient on any rank is an error on every rank, naming the first such rank,
/// before any gradient is exchanged (nothing non-finite reaches the parameters).
///
/// The gradient stays on the device: it is joined there into one tensor, checked there (one value
/// read back), and handed to the transport as a device block, which reduces it in place where it
/// can (NCCL on CUDA) and stages it through the host where it cannot (threads, MPI).
pub(crate) fn step_gradient<B, O>(
    objective: &O,
    model: &O::Model,
    batch: &O::Batch,
    ctx: &Arc<RingContext>,
    step: usize,
    stop_requested: bool,
) -> Result<StepGradient<B::InnerBackend>, TrainError>
where
    B: AutodiffBackend<InnerBackend: HostRead> + RingBackend,
    O: Objective<B>,
{
    let rank = ctx.rank();
    let forward = crate::trace::span(|| "forward".into());
    let loss = objective.local_loss(model, batch, ctx)?;
    drop(forward);
    let local_loss = loss.clone().into_scalar().elem::<f32>();
    let backward = crate::trace::span(|| "backward".into());
    let grads = loss.backward();
    drop(backward);
    if let Some(error) = ctx.take_backward_error() {
        return Err(error.into());
    }
    let mut params = GradientsParams::from_grads(grads, model);
    let flat = flat_gradient::<B, _>(model, &mut params);
    let gradient_finite = all_finite(&flat);
    // One all-reduce carries the loss, rank 0's stop request and every rank's health (0: finite,
    // 1: its loss is not, 2: its gradient is not), so all ranks stop at the same step together.
    let mut reduced = vec![0.0f32; 2 + ctx.world()];
    reduced[0] = local_loss;
    reduced[1] = f32::from(u8::from(stop_requested));
    reduced[2 + rank] = if !local_loss.is_finite() {
        1.0
    } else if !gradient_finite {
        2.0
    } else {
        0.0
    };
    ctx.with_comm(|c| c.all_reduce_sum(&mut reduced))?;
    // A non-finite loss is reported before the gradients it poisoned on the other ranks.
    for (code, what) in [(1.0, "loss"), (2.0, "gradient")] {
        if let Some(bad) = reduced[2..].iter().position(|&h| h == code) {
            return Err(TrainError::NonFinite {
                step,
                rank: bad,
                what,
            });
        }
    }
    let device = flat.device();
    let len = flat.dims()[0];
    let block = Block::from_flat_on_device(BlockKind::Reduce, vec![len], flat);
    let reduced_gradient = ctx.with_comm(|c| c.all_reduce_block(block))?;
    Ok(StepGradient {
        loss: f64::from(reduced[0]),
        stop: reduced[1] > 0.0,
        flat: reduced_gradient.into_tensor(&device),
    })
}

/// The global loss and the all-reduced gradient (module order, unclipped) of `model` on
/// `examples`, computed on `ranks` in-process ranks: what one training step applies, for checking
/// gradients (finite differences, agreement across rank counts).
pub fn global_gradient<B>(
    model: &Llama<B>,
    partition: &dyn Partition,
    ranks: usize,
    ring: RingConfig,
    examples: &[Example],
    timeout: Duration,
) -> Result<(f64, Vec<f32>), TrainError>
where
    B: AutodiffBackend<InnerBackend: HostRead> + LayerBackend,
{
    strategies::check_ranks(ranks)?;
    materialize(model);
    let batch = assemble(examples, partition, (ranks, 1), 0, false)?;
    // Balanced for the model's every layer, as a training step lays it out.
    let masks = model.layer_masks(&RingConfig {
        causal: true,
        ..ring
    });
    let layout = Arc::new(layout_for_layers(
        partition,
        batch.len,
        &[],
        ranks,
        &masks,
        true,
    )?);
    let results = run_ranks(ranks, timeout, |comm| -> Result<_, TrainError> {
        let ctx = Arc::new(RingContext::new(
            comm,
            layout.clone(),
            RingConfig {
                causal: true,
                ..ring
            },
        )?);
        // Each rank's own parameters, as in training: shared autodiff tensors would tie the ranks'
        // graphs together.
        let model = model.clone().fork(&Default::default());
        let g = step_gradient(&NextToken, &model, &batch, &ctx, 0, false)?;
        Ok((g.loss, crate::host::read(g.flat)))
    });
    all_or_root_cause(results, TrainError::echo_level)?
        .into_iter()
        .next()
        .ok_or(TrainError::NoModel)
}
