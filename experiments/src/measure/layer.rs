//! One decoder layer's forward alone, without autodiff: what a layer needs at once and its largest
//! single activation, per rank (the quantity of the paper's Table 1, "maximum activation size per
//! layer", measured with the counting allocator).

use super::training::{SmallModel, Variant, llama, partition_for};
use anyhow::Result;
use burn::backend::Flex;
use burn::tensor::{Distribution, Tensor};
use std::sync::Arc;
use std::time::Duration;
use workbench::RingContext;
use workbench::error::{RingError, all_or_root_cause};
use workbench::model::lazy::{materialize, seeded};
use workbench::transport::run_ranks;

const TIMEOUT: Duration = Duration::from_secs(3600);

/// What one layer's forward allocated on top of what was live when it began (its input, the
/// weights, the ranks' contexts), per rank.
#[derive(Debug, Clone, Copy)]
pub struct LayerForward {
    /// Peak live bytes during the forward over the rank count (its output included): the layer's
    /// working set.
    pub peak: f64,
    /// The largest single allocation any rank made: the layer's largest activation.
    pub largest: usize,
}

/// One forward of a single decoder layer of `m` run as `variant` runs it, on `ranks` ranks of
/// `seq / ranks` tokens (one rank for the single-device methods), feed-forward chunks of `block`.
/// The smaller of two measurements, as for the training-step peaks (a fresh thread may allocate
/// once-only buffers).
pub fn layer_forward(
    m: &SmallModel,
    variant: Variant,
    ranks: usize,
    seq: usize,
    block: usize,
) -> Result<LayerForward> {
    let run = variant.run(ranks, seq, block);
    let config = llama(&SmallModel { layers: 1, ..*m }, run.ffn);
    let device = Default::default();
    let layer = seeded::<Flex, _>(0, &device, || {
        let blocks = config.init_blocks::<Flex>(&device);
        materialize(&blocks);
        blocks
    })
    .pop()
    .expect("one layer");
    let trunk = config.trunk();
    let layout = Arc::new(partition_for(seq, run.ranks).layout(seq, run.ranks)?);
    let ring = run.ring();
    let measure = || -> Result<LayerForward> {
        let results = run_ranks(run.ranks, TIMEOUT, |comm| -> Result<_, RingError> {
            let ctx = Arc::new(RingContext::new(comm, layout.clone(), ring)?);
            let positions = ctx.positions(ctx.rank()).to_vec();
            // Seeded, like every draw from Burn's process-wide generator: an unseeded draw here would
            // move a concurrent seeded initialization's weights.
            let x = seeded::<Flex, _>(ctx.rank() as u64, &device, || {
                Tensor::<Flex, 3>::random(
                    [1, positions.len(), m.d_model],
                    Distribution::Normal(0.0, 1.0),
                    &device,
                )
            });
            // A first forward on the same threads leaves behind what persists between calls (the
            // matmul library's thread-local packing buffers), which is not the layer's.
            drop(layer.forward(x.clone(), &positions, trunk, &ctx)?);
            // Every rank's input exists before the window opens, and every output before it closes.
            ctx.with_comm(|c| c.barrier())?;
            if ctx.rank() == 0 {
                crate::alloc::reset();
            }
            ctx.with_comm(|c| c.barrier())?;
            let y = layer.forward(x, &positions, trunk, &ctx)?;
            ctx.with_comm(|c| c.barrier())?;
            let stats = crate::alloc::stats();
            drop(y);
            Ok(stats)
        });
        let stats = all_or_root_cause(results, RingError::echo_level)?;
        Ok(LayerForward {
            peak: stats[0].peak_above_start as f64 / run.ranks as f64,
            largest: stats[0].largest,
        })
    };
    let (first, second) = (measure()?, measure()?);
    Ok(LayerForward {
        peak: first.peak.min(second.peak),
        largest: first.largest.min(second.largest),
    })
}
