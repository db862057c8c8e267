//! One point of the `memory` kind: a method's per-rank peak of a training step (its ledger, its
//! allocator peak, one layer beside Table 1) or its longest context under the budget.

use super::*;

#[derive(Debug, Serialize)]
struct Row {
    row_type: &'static str,
    method: &'static str,
    /// What each layer keeps for its backward (`none` for vanilla and memory-efficient).
    checkpoint: &'static str,
    ranks: usize,
    /// Empty on max_context rows.
    seq_len: Option<usize>,
    peak_mib_per_rank: Option<f64>,
    engine_peak_bytes_per_rank: Option<u64>,
    /// What one more layer keeps until the backward: the per-rank peak with the model's layers
    /// minus the peak with one layer fewer.
    layer_kept_mib: Option<f64>,
    /// One layer's forward alone, without autodiff (nothing kept for a backward), after a first
    /// call on the same threads: peak live bytes above its start, its output included.
    layer_forward_mib: Option<f64>,
    /// The largest single allocation of that forward: the layer's largest activation.
    layer_largest_mib: Option<f64>,
    /// The paper's Table 1 (largest activation of one layer) for this method and shape (this
    /// model's feed-forward width), doubled for f32.
    table1_mib: Option<f64>,
    layer_largest_over_table1: Option<f64>,
    layer_kept_over_table1: Option<f64>,
    /// One f32 copy of a layer's parameters. Its gradient, the gradient's flat copy for the
    /// all-reduce and AdamW's two moments are each this size, and a peak difference includes those
    /// the peak holds.
    layer_params_mib: Option<f64>,
    budget_mib: f64,
    /// Empty: not even the shortest length searched (256) fits.
    max_context_tokens: Option<usize>,
    max_context_over_one_rank_blockwise: Option<f64>,
}

/// The method's name in the paper's Table 1 ([`table1_layer_bytes`]).
fn table1_method(method: Method) -> &'static str {
    match method {
        Method::Vanilla => "vanilla",
        Method::MemoryEfficient => "memory-efficient",
        Method::Blockwise => "memory-efficient+ffn",
        Method::Ring => "ring",
    }
}

fn max_context_key(variant: Variant, ranks: usize) -> Record {
    Record::new([
        ("row_type", "max_context".to_string()),
        ("method", variant.method.name().to_string()),
        ("checkpoint", variant.checkpoint().to_string()),
        ("ranks", ranks.to_string()),
    ])
}

impl Plan for MemoryPlan {
    fn points(&self) -> Vec<Point> {
        self.tasks
            .iter()
            .map(|t| match *t {
                Task::Peak {
                    variant,
                    ranks,
                    seq,
                    ..
                } => Point::single(Record::new([
                    ("row_type", "peak".to_string()),
                    ("method", variant.method.name().to_string()),
                    ("checkpoint", variant.checkpoint().to_string()),
                    ("ranks", ranks.to_string()),
                    ("seq_len", seq.to_string()),
                ])),
                Task::MaxContext { variant, ranks } => {
                    Point::single(max_context_key(variant, ranks))
                }
            })
            .collect()
    }

    fn compute(&mut self, index: usize, context: &PointContext) -> Result<Vec<Record>> {
        let blockwise = |remat| Variant {
            method: Method::Blockwise,
            remat,
        };
        if !self.warmed_up {
            // The first step of a process allocates once-only state (thread pools, caches).
            peak_per_rank(
                &self.small,
                blockwise(self.baseline_remat),
                1,
                self.block_cap,
                self.block_cap,
            )?;
            self.warmed_up = true;
        }
        let budget_mib = self.budget / MIB;
        let row = match self.tasks[index] {
            Task::Peak {
                variant,
                ranks,
                seq,
                block,
            } => {
                let m = &self.small;
                // What one more layer keeps: the peak of the model minus that with a layer fewer.
                let peak_with = |layers: usize| {
                    peak_per_rank(&SmallModel { layers, ..*m }, variant, ranks, seq, block)
                };
                let peak = peak_with(m.layers)?;
                let kept = peak.allocator - peak_with(m.layers - 1)?.allocator;
                let forward = layer_forward(m, variant, ranks, seq, block)?;
                // Table 1's block is a ring rank's share, or a single rank's attention block.
                let table1 = 2.0
                    * table1_layer_bytes(
                        table1_method(variant.method),
                        seq as f64,
                        (seq / ranks).min(block) as f64,
                        m.d_model as f64,
                        m.heads as f64,
                        m.ffn_hidden() as f64,
                    );
                Row {
                    row_type: "peak",
                    method: variant.method.name(),
                    checkpoint: variant.checkpoint().name(),
                    ranks,
                    seq_len: Some(seq),
                    peak_mib_per_rank: Some(peak.allocator / MIB),
                    engine_peak_bytes_per_rank: Some(peak.engine),
                    layer_kept_mib: Some(kept / MIB),
                    layer_forward_mib: Some(forward.peak / MIB),
                    layer_largest_mib: Some(forward.largest as f64 / MIB),
                    table1_mib: Some(table1 / MIB),
                    layer_largest_over_table1: Some(forward.largest as f64 / table1),
                    layer_kept_over_table1: Some(kept / table1),
                    layer_params_mib: Some((4 * layer_params(m)) as f64 / MIB),
                    budget_mib,
                    max_context_tokens: None,
                    max_context_over_one_rank_blockwise: None,
                }
            }
            Task::MaxContext { variant, ranks } => {
                // Every method's feed-forward chunks are at most the first block size (a ring
                // rank's attention block is its S / N tokens whatever the cap).
                let search = |variant: Variant, ranks: usize| {
                    max_context(
                        &self.small,
                        variant,
                        ranks,
                        self.block_cap,
                        self.budget,
                        SEARCH_START,
                        self.max_seq,
                    )
                };
                context.bar.set_message(format!(
                    "max context {} ({}) N={ranks}",
                    variant.method.name(),
                    variant.checkpoint()
                ));
                let best = search(variant, ranks)?;
                // Blockwise variants compare with one rank of the same checkpoint; vanilla and
                // memory-efficient with the sweep's first.
                let base = blockwise(match variant.method {
                    Method::Blockwise | Method::Ring => variant.remat,
                    Method::Vanilla | Method::MemoryEfficient => self.baseline_remat,
                });
                let baseline = if variant == base {
                    best
                } else {
                    match context.table.find(&max_context_key(base, 1)) {
                        Some(row) => row.get("max_context_tokens").and_then(|v| v.parse().ok()),
                        None => search(base, 1)?,
                    }
                };
                Row {
                    row_type: "max_context",
                    method: variant.method.name(),
                    checkpoint: variant.checkpoint().name(),
                    ranks,
                    seq_len: None,
                    peak_mib_per_rank: None,
                    engine_peak_bytes_per_rank: None,
                    layer_kept_mib: None,
                    layer_forward_mib: None,
                    layer_largest_mib: None,
                    table1_mib: None,
                    layer_largest_over_table1: None,
                    layer_kept_over_table1: None,
                    layer_params_mib: None,
                    budget_mib,
                    max_context_tokens: best,
                    max_context_over_one_rank_blockwise: best
                        .zip(baseline)
                        .map(|(b, base)| b as f64 / base as f64),
                }
            }
        };
        Ok(vec![Record::of(&row)?])
    }
}
