//! The fused CPU tile kernel ([`FusedCpu`]): Q·Kᵀ → online softmax → P·V in cache-sized sub-tiles,
//! and the matching FlashAttention-2 backward, on host f32 buffers with the `gemm` crate.
//!
//! The generic Burn-tensor kernel (`generic.rs`) is this module's reference twin; the exactness
//! table runs on both. The forward splits work over blocks of query rows of each (batch, kv head)
//! unit, the backward over units, with rayon; matmuls inside a task are
//! single-threaded so that N rank threads do not oversubscribe the cores.
//!
//! # Shapes
//! q, o, dO, dq: `[b, h, tq, d]`; k, v, dk, dv: `[b, hk, tk, d]`; m, l, lse, delta: `[b, h, tq]`.
//! Inside a unit (batch i, kv head j) the query rows of its `g = h / hk` heads are contiguous:
//! `g · tq` rows, row r is query `r % tq`.

use super::bf16_matmul;
use super::exp::fast_exp;
use super::mask::{Bounds, Cover, Window, span};
use super::tile::{BackwardTile as Tile, ForwardTile, Queries, Scores, TileKernel, Travelling};
use crate::block::{Block, BlockKind};
use crate::dtype::{Dtype, Precision};
use crate::error::RingError;
use crate::host::HostRead;
use burn::tensor::{Tensor, TensorData};
use rayon::prelude::*;
use std::sync::Arc;

pub use super::tile::TileDims;

/// Query rows per sub-tile. With [`COLS`], 256 × 256 sub-tiles (2 × 2 of the 128 × 128 ones before)
/// took `ringbench bench attn --seq 8192 --ranks 1 --kernels fused --heads 4` (head_dim 64) from
/// 168 to 188–190 GFLOP/s fwd+bwd non-causal and 175–177 to 180–181 causal on the 2-core EPYC: the
/// products' inner dimensions (keys for P·V and dQ, rows for dV and dK) are twice as long. 256 × 512
/// was faster non-causal (192–194) and slower causal (174–178): more of each diagonal tile wasted.
const ROWS: usize = 256;
/// Keys per sub-tile.
const COLS: usize = 256;

/// Bytes of scratch one tile needs: each (batch, kv head) unit's sub-tile buffers (scores in the
/// forward; probabilities and their gradient in the backward), counted as if every unit ran at once
/// so that the figure does not depend on the number of cores. Operand packing is not counted: the
/// panels `gemm` packs its operands into, and the backward's transposes of a chunk of K and of V
/// (`COLS · d` values each a running task), the size of a chunk whatever the shard.
pub fn scratch_bytes(dims: &TileDims, backward: bool) -> u64 {
    let per_unit = ROWS.min(dims.rows()) * COLS.min(dims.tk) * if backward { 2 } else { 1 };
    (dims.units() * per_unit * std::mem::size_of::<f32>()) as u64
}

/// How a product's terms are multiplied: f32 FMAs (`gemm`), or AVX512-BF16's `vdpbf16ps` when the
/// operands are bf16 values (precision bf16) and the CPU has it. Both take each product exactly
/// (a bf16 product fits an f32) and sum in f32; only the order of the sums differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dot {
    /// `gemm`'s f32 microkernels.
    F32,
    /// [`bf16_matmul::product_strided`].
    Bf16,
}

impl Dot {
    /// The products of a tile scored as `how` says.
    fn of(how: Scores) -> Dot {
        Dot::of_dtype(how.precision.dtype)
    }

    /// The products of operands of type `dtype`.
    fn of_dtype(dtype: Dtype) -> Dot {
        if dtype == Dtype::Bf16 && bf16_matmul::has_bf16_dot() {
            Dot::Bf16
        } else {
            Dot::F32
        }
    }
}

/// `c[m×n] (+)= alpha · a[m×k] · b[k×n]`, each operand given by its row and column strides.
#[allow(clippy::too_many_arguments)]
fn matmul(
    c: &mut [f32],
    a: &[f32],
    (a_rs, a_cs): (usize, usize),
    b: &[f32],
    (b_rs, b_cs): (usize, usize),
    (m, n, k): (usize, usize, usize),
    alpha: f32,
    accumulate: bool,
    dot: Dot,
) {
    if dot == Dot::Bf16 {
        let (a_strides, b_strides) = ((a_rs, a_cs), (b_rs, b_cs));
        let (c_row, shape) = (n, (m, n, k));
        return bf16_matmul::product_strided(
            c, c_row, a, a_strides, b, b_strides, shape, alpha, accumulate,
        );
    }
    if m == 0 || n == 0 {
        return;
    }
    let last = |rs: usize, cs: usize, rows: usize, cols: usize| (rows - 1) * rs + (cols - 1) * cs;
    assert!(c.len() > last(n, 1, m, n), "matmul: output too small");
    if k == 0 {
        if !accumulate {
            c[..m * n].fill(0.0);
        }
        return;
    }
    assert!(a.len() > last(a_rs, a_cs, m, k), "matmul: lhs too small");
    assert!(b.len() > last(b_rs, b_cs, k, n), "matmul: rhs too small");
    // SAFETY: the asserts above keep every index the strides reach inside the three slices, and `c`
    // is borrowed mutably, so it cannot alias `a` or `b`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            a.as_ptr(),
            a_cs as isize,
            a_rs as isize,
            b.as_ptr(),
            b_cs as isize,
            b_rs as isize,
            1.0,
            alpha,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// Independent accumulators per lane, so that reductions vectorize without reassociating a chain.
const LANES: usize = 16;

crate::simd_fn! {
    /// `row[j] = exp(row[j] − shift)`, returning the row's sum.
    fn exp_shift_sum(row: &mut [f32], shift: f32) -> f32 {
        for x in row.iter_mut() {
            *x = fast_exp(*x - shift);
        }
        let mut lanes = [0.0f32; LANES];
        let mut chunks = row.chunks_exact(LANES);
        for chunk in &mut chunks {
            for (acc, x) in lanes.iter_mut().zip(chunk) {
                *acc += x;
            }
        }
        lanes.iter().sum::<f32>() + chunks.remainder().iter().sum::<f32>()
    }
}

crate::simd_fn! {
    /// Largest element (−∞ for an empty or fully masked row).
    fn row_max(row: &[f32]) -> f32 {
        let mut lanes = [f32::NEG_INFINITY; LANES];
        let mut chunks = row.chunks_exact(LANES);
        for chunk in &mut chunks {
            for (acc, &x) in lanes.iter_mut().zip(chunk) {
                *acc = if x > *acc { x } else { *acc };
            }
        }
        chunks
            .remainder()
            .iter()
            .chain(&lanes)
            .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m })
    }
}

crate::simd_fn! {
    /// `row[j] = exp(row[j] − shift)`.
    fn exp_shift(row: &mut [f32], shift: f32) {
        for x in row.iter_mut() {
            *x = fast_exp(*x - shift);
        }
    }
}

crate::simd_fn! {
    /// `row[j] *= factor`.
    fn scale_row(row: &mut [f32], factor: f32) {
        for x in row.iter_mut() {
            *x *= factor;
        }
    }
}

crate::simd_fn! {
    /// `ds[j] = p[j] · (dp[j] − delta)`, in place in `dp`.
    fn softmax_grad(dp: &mut [f32], p: &[f32], delta: f32) {
        for (d, &p) in dp.iter_mut().zip(p) {
            *d = p * (*d - delta);
        }
    }
}

/// The bounds of a unit's rows `r0..r1` (row r is query r % tq).
fn row_bounds(win_q: &[Window], r0: usize, r1: usize) -> Bounds {
    let tq = win_q.len();
    if r1 - r0 >= tq || r0 / tq != (r1 - 1) / tq {
        // The rows wrap round to the next head: cover the wrapped ranges.
        return Bounds::of(win_q[r0 % tq..].iter().chain(&win_q[..=((r1 - 1) % tq)]));
    }
    Bounds::of(&win_q[r0 % tq..=(r1 - 1) % tq])
}

/// Rows per strip when the forward cuts a partly visible sub-tile along its diagonal.
const FORWARD_STRIP: usize = 32;
/// Rows per strip when the backward cuts one. Its dV and dK products sum over the strip's rows, so
/// short strips make short inner dimensions: `ringbench bench attn --seq 8192 --ranks 1 --kernels
/// fused --heads 4 --repeats 3` (2-core EPYC, causal) took the backward from 0.50 s with strips of
/// 32 rows to 0.45–0.47 s with 64, 0.45 s with 128 and 0.46 s uncut (256); the forward, whose
/// products sum over keys, was fastest at 32 (0.207 s against 0.218–0.225 s at 64).
const BACKWARD_STRIP: usize = 128;

/// The pieces of sub-tile rows `r0..r0 + nr` × keys `pos_kc` worth computing, as
/// `(first row, rows, keys, cover)` with the keys a prefix of `pos_kc`. A fully visible sub-tile is
/// one piece. A partly visible one whose keys ascend is cut into strips of `strip` rows
/// ([`FORWARD_STRIP`], [`BACKWARD_STRIP`]), each over the keys up to its last query: the keys it
/// leaves out are masked for every row of the strip, so the result is the same. A 256×256 diagonal
/// sub-tile in strips of 32 computes 9/16 of its pairs, in strips of 128 3/4.
fn pieces(
    strip: usize,
    cover_all: Cover,
    win_q: &[Window],
    (r0, nr): (usize, usize),
    pos_kc: &[usize],
) -> impl Iterator<Item = (usize, usize, usize, Cover)> {
    let cut = cover_all == Cover::Partial && pos_kc.is_sorted();
    let step = if cut { strip } else { nr.max(1) };
    (r0..r0 + nr).step_by(step).filter_map(move |s0| {
        let ns = step.min(r0 + nr - s0);
        if !cut {
            return (cover_all != Cover::Empty).then_some((s0, ns, pos_kc.len(), cover_all));
        }
        let bounds = row_bounds(win_q, s0, s0 + ns);
        let nc = pos_kc.partition_point(|&p| p <= bounds.hi.1);
        match bounds.cover(span(&pos_kc[..nc])) {
            _ if nc == 0 => None,
            Cover::Empty => None,
            cover => Some((s0, ns, nc, cover)),
        }
    })
}

/// Sets scores of invisible (q, k) pairs to −∞: `s` is rows `r0..` × keys `pos_k`. With ascending
/// keys (every partition here) a row's visible keys are one run, found by binary search.
fn mask(s: &mut [f32], win_q: &[Window], r0: usize, pos_k: &[usize]) {
    let tq = win_q.len();
    let sorted = pos_k.is_sorted();
    for (i, row) in s.chunks_mut(pos_k.len()).enumerate() {
        let w = win_q[(r0 + i) % tq];
        if sorted {
            let (first, end) = (
                pos_k.partition_point(|&pk| pk < w.lo),
                pos_k.partition_point(|&pk| pk <= w.hi),
            );
            row[end.max(first)..].fill(f32::NEG_INFINITY);
            row[..first].fill(f32::NEG_INFINITY);
            continue;
        }
        for (x, &pk) in row.iter_mut().zip(pos_k) {
            if !w.sees(pk) {
                *x = f32::NEG_INFINITY;
            }
        }
    }
}

/// `s = cap · tanh(s / cap)` in place; with `tanh`, each `tanh(s / cap)` is also kept there (what
/// the backward's `1 − (s / cap)²` needs).
fn soft_cap(s: &mut [f32], cap: f32, tanh: Option<&mut [f32]>) {
    match tanh {
        Some(t) => {
            for (x, t) in s.iter_mut().zip(t) {
                *t = (*x / cap).tanh();
                *x = cap * *t;
            }
        }
        None => {
            for x in s.iter_mut() {
                *x = cap * (*x / cap).tanh();
            }
        }
    }
}

/// Scores of one sub-tile, `scale · q[r0..r0 + nr] · kᵀ` over `nc` keys (`k_t`: `kᵀ`, `d × nc`, by
/// its row and column strides), soft-capped when `scores` says (keeping each `tanh` in `tanh` when
/// given), into `s` (`nr × nc`), with invisible pairs set to −∞ when the sub-tile is only partly
/// visible.
#[allow(clippy::too_many_arguments)]
fn scores(
    s: &mut [f32],
    q: &[f32],
    (k_t, k_t_strides): (&[f32], (usize, usize)),
    d: usize,
    (r0, nr): (usize, usize),
    nc: usize,
    how: Scores,
    tanh: Option<&mut [f32]>,
    cover: Cover,
    win_q: &[Window],
    pos_kc: &[usize],
) {
    let dot = Dot::of(how);
    matmul(
        s,
        &q[r0 * d..],
        (d, 1),
        k_t,
        k_t_strides,
        (nr, nc, d),
        how.scale,
        false,
        dot,
    );
    if let Some(cap) = how.softcap {
        soft_cap(s, cap, tanh);
    }
    if cover == Cover::Partial {
        mask(s, win_q, r0, pos_kc);
    }
}

/// Online-softmax accumulator of one rank's queries over the key/value blocks of a ring pass.
#[derive(Debug, Clone)]
pub struct OnlineSoftmax {
    dims: TileDims,
    win_q: Vec<Window>,
    how: Scores,
    /// Unnormalized output, `[b, h, tq, d]`.
    acc: Vec<f32>,
    /// Running row max and normalizer, `[b, h, tq]`.
    m: Vec<f32>,
    l: Vec<f32>,
    parallel: bool,
}

impl OnlineSoftmax {
    /// A fresh accumulator for queries seeing key windows `win_q`, before any key block, scoring as
    /// `how` says.
    pub fn new(dims: TileDims, win_q: &[Window], how: Scores) -> Self {
        let rows = dims.batch * dims.heads * dims.tq;
        Self {
            dims,
            acc: vec![0.0; rows * dims.head_dim],
            m: vec![f32::NEG_INFINITY; rows],
            l: vec![0.0; rows],
            win_q: win_q.to_vec(),
            how,
            parallel: true,
        }
    }

    /// Whether units run on rayon's pool (the default) or one after another on the calling thread:
    /// when there are at least as many rank threads as cores, the ranks are the parallelism.
    pub fn with_parallel(mut self, parallel: bool) -> Self {
        self.parallel = parallel;
        self
    }

    /// The tile dimensions it was made for.
    pub fn dims(&self) -> TileDims {
        self.dims
    }

    /// Folds one key/value block (`[b, hk, tk, d]`, positions `pos_k`) into the running state of the
    /// queries `q` (`[b, h, tq, d]`, the same at every call).
    pub fn attend(&mut self, q: &[f32], k: &[f32], v: &[f32], pos_k: &[usize]) {
        let dims = TileDims {
            tk: pos_k.len(),
            ..self.dims
        };
        let (d, rows, tk) = (dims.head_dim, dims.rows(), dims.tk);
        let (win_q, how) = (&self.win_q, self.how);
        let dot = Dot::of(how);
        // Tasks of ROWS query rows of one unit: rows are independent, so any split gives the same
        // bits, and causal blocks of unequal work balance over the pool.
        let blocks = self
            .acc
            .chunks_mut(rows * d)
            .zip(self.m.chunks_mut(rows))
            .zip(self.l.chunks_mut(rows))
            .zip(q.chunks(rows * d))
            .enumerate()
            .flat_map(|(unit, (((acc, m), l), q))| {
                acc.chunks_mut(ROWS * d)
                    .zip(m.chunks_mut(ROWS))
                    .zip(l.chunks_mut(ROWS))
                    .enumerate()
                    .map(move |(block, ((acc, m), l))| (unit, block * ROWS, acc, m, l, q))
            });
        for_each_unit(self.parallel, blocks, |(unit, first, acc, m, l, q)| {
            let k = &k[unit * tk * d..(unit + 1) * tk * d];
            let v = &v[unit * tk * d..(unit + 1) * tk * d];
            let nr = m.len();
            let mut s = vec![0.0f32; nr * COLS.min(tk)];
            let r0 = first;
            let bounds = row_bounds(win_q, r0, r0 + nr);
            for c0 in (0..tk).step_by(COLS) {
                let width = COLS.min(tk - c0);
                let pos_kc = &pos_k[c0..c0 + width];
                let cover_all = bounds.cover(span(pos_kc));
                for (r0, nr, nc, cover) in pieces(FORWARD_STRIP, cover_all, win_q, (r0, nr), pos_kc)
                {
                    let pos_kc = &pos_kc[..nc];
                    let s = &mut s[..nr * nc];
                    scores(
                        s,
                        q,
                        (&k[c0 * d..], (1, d)),
                        d,
                        (r0, nr),
                        nc,
                        how,
                        None,
                        cover,
                        win_q,
                        pos_kc,
                    );
                    for (i, row) in s.chunks_mut(nc).enumerate() {
                        // r indexes the unit's rows; the block's slices start at `first`.
                        let r = r0 + i - first;
                        let m_new = m[r].max(row_max(row));
                        if m_new == f32::NEG_INFINITY {
                            row.fill(0.0);
                            continue;
                        }
                        let correction = (m[r] - m_new).exp();
                        l[r] = l[r] * correction + exp_shift_sum(row, m_new);
                        m[r] = m_new;
                        if correction != 1.0 {
                            scale_row(&mut acc[r * d..(r + 1) * d], correction);
                        }
                    }
                    // P enters the product in the operands' type; its sum l stays f32.
                    how.precision.dtype.round(s);
                    matmul(
                        &mut acc[(r0 - first) * d..],
                        s,
                        (nc, 1),
                        &v[c0 * d..],
                        (d, 1),
                        (nr, d, nc),
                        1.0,
                        true,
                        dot,
                    );
                }
            }
            // Between ring steps the output is kept in the merge's type (the row max and sum, like
            // lse, stay f32).
            how.precision.merge.round(acc);
        });
    }

    /// Normalized output `[b, h, tq, d]` and log-sum-exp `[b, h, tq]` (−∞ for rows that saw no key).
    /// With `sinks` (`[h]`), each row's normalizer also holds `exp(sinks[h])`, once.
    pub fn finish(self, sinks: Option<&[f32]>) -> (Vec<f32>, Vec<f32>) {
        let (d, tq, heads) = (self.dims.head_dim, self.dims.tq, self.dims.heads);
        let (mut out, mut lse, l) = (self.acc, self.m, self.l);
        // Rows are independent: blocks of them on the pool (the same bits on any split).
        let per = ROWS;
        let blocks = out
            .chunks_mut(per * d)
            .zip(lse.chunks_mut(per))
            .zip(l.chunks(per))
            .enumerate();
        for_each_unit(self.parallel, blocks, |(block, ((out, lse), l))| {
            for (i, ((row, m), &l)) in out.chunks_mut(d).zip(lse.iter_mut()).zip(l).enumerate() {
                let mut l = l;
                if let Some(sinks) = sinks {
                    // The sink as one more key of value 0: the running max and normalizer take it
                    // in, and the output's scale follows the max.
                    let sink = sinks[((block * per + i) / tq) % heads];
                    let m_new = m.max(sink);
                    let correction = if *m == f32::NEG_INFINITY {
                        0.0
                    } else {
                        (*m - m_new).exp()
                    };
                    l = l * correction + (sink - m_new).exp();
                    if correction != 1.0 {
                        scale_row(row, correction);
                    }
                    *m = m_new;
                }
                scale_row(row, if l > 0.0 { 1.0 / l } else { 0.0 });
                *m = if l > 0.0 {
                    *m + l.ln()
                } else {
                    f32::NEG_INFINITY
                };
            }
        });
        (out, lse)
    }
}

/// The backward's per-row statistic `delta = rowsum(dO ∘ O)` (`[b, h, tq]` from `[b, h, tq, d]`).
pub fn softmax_delta(d_out: &[f32], out: &[f32], head_dim: usize) -> Vec<f32> {
    d_out
        .chunks(head_dim)
        .zip(out.chunks(head_dim))
        .map(|(g, o)| g.iter().zip(o).map(|(a, b)| a * b).sum())
        .collect()
}

/// Inputs of one backward tile; `lse` and `delta` are the final per-row statistics.
#[derive(Debug, Clone, Copy)]
pub struct BackwardTile<'a> {
    /// The tile's dimensions.
    pub dims: TileDims,
    /// Queries `[b, h, tq, d]`.
    pub q: &'a [f32],
    /// Keys `[b, hk, tk, d]`.
    pub k: &'a [f32],
    /// Values `[b, hk, tk, d]`.
    pub v: &'a [f32],
    /// The output's gradient `[b, h, tq, d]`.
    pub d_out: &'a [f32],
    /// The forward's log-sum-exp `[b, h, tq]`.
    pub lse: &'a [f32],
    /// δ = rowsum(dO ∘ O) `[b, h, tq]`.
    pub delta: &'a [f32],
    /// The key windows of the queries.
    pub win_q: &'a [Window],
    /// Global positions of the keys.
    pub pos_k: &'a [usize],
    /// How scores are made.
    pub how: Scores,
    /// Units on rayon's pool, or one after another on the calling thread.
    pub parallel: bool,
}

/// Adds one tile's gradient contributions to `dq [b, h, tq, d]`, `dk` and `dv [b, hk, tk, d]`.
pub fn backward<'a>(t: &BackwardTile<'a>, dq: &mut [f32], dk: &mut [f32], dv: &mut [f32]) {
    let dims = t.dims;
    let (d, rows, tk) = (dims.head_dim, dims.rows(), dims.tk);
    debug_assert_eq!(dq.len(), dims.units() * rows * d);
    let dot = Dot::of(t.how);
    let units = dq
        .chunks_mut(rows * d)
        .zip(dk.chunks_mut(tk * d))
        .zip(dv.chunks_mut(tk * d))
        .enumerate();
    for_each_unit(t.parallel, units, |(unit, ((dq, dk), dv))| {
        let rows_of = |x: &'a [f32], width: usize| -> &'a [f32] {
            &x[unit * rows * width..(unit + 1) * rows * width]
        };
        let (q, d_out) = (rows_of(t.q, d), rows_of(t.d_out, d));
        let (lse, delta) = (rows_of(t.lse, 1), rows_of(t.delta, 1));
        let k = &t.k[unit * tk * d..(unit + 1) * tk * d];
        let v = &t.v[unit * tk * d..(unit + 1) * tk * d];
        let scratch = ROWS.min(rows) * COLS.min(tk);
        let (mut p, mut ds) = (vec![0.0f32; scratch], vec![0.0f32; scratch]);
        // Kᵀ and Vᵀ of the chunk, for Q·Kᵀ and dO·Vᵀ, laid out once it has a visible piece.
        let (mut k_t, mut v_t) = (
            vec![0.0f32; COLS.min(tk) * d],
            vec![0.0f32; COLS.min(tk) * d],
        );
        // With a cap, each score's tanh, for the cap's derivative 1 − tanh².
        let mut tanh = vec![0.0f32; if t.how.softcap.is_some() { scratch } else { 0 }];
        for c0 in (0..tk).step_by(COLS) {
            let width = COLS.min(tk - c0);
            let pos_kc = &t.pos_k[c0..c0 + width];
            let k_span = span(pos_kc);
            let mut transposed = false;
            for r0 in (0..rows).step_by(ROWS) {
                let nr = ROWS.min(rows - r0);
                let cover_all = row_bounds(t.win_q, r0, r0 + nr).cover(k_span);
                for (r0, nr, nc, cover) in
                    pieces(BACKWARD_STRIP, cover_all, t.win_q, (r0, nr), pos_kc)
                {
                    let pos_kc = &pos_kc[..nc];
                    if !transposed {
                        transpose_chunk(&k[c0 * d..(c0 + width) * d], d, &mut k_t);
                        transpose_chunk(&v[c0 * d..(c0 + width) * d], d, &mut v_t);
                        transposed = true;
                    }
                    let (p, ds) = (&mut p[..nr * nc], &mut ds[..nr * nc]);
                    let mut tanh = (!tanh.is_empty()).then(|| &mut tanh[..nr * nc]);
                    scores(
                        p,
                        q,
                        (&k_t, (width, 1)),
                        d,
                        (r0, nr),
                        nc,
                        t.how,
                        tanh.as_deref_mut(),
                        cover,
                        t.win_q,
                        pos_kc,
                    );
                    for (i, row) in p.chunks_mut(nc).enumerate() {
                        exp_shift(row, lse[r0 + i]);
                    }
                    // dP = dO Vᵀ, then dS = P ∘ (dP − δ) from P as computed
                    matmul(
                        ds,
                        &d_out[r0 * d..],
                        (d, 1),
                        &v_t,
                        (width, 1),
                        (nr, nc, d),
                        1.0,
                        false,
                        dot,
                    );
                    for (i, (ds_row, p_row)) in ds.chunks_mut(nc).zip(p.chunks(nc)).enumerate() {
                        softmax_grad(ds_row, p_row, delta[r0 + i]);
                    }
                    // Through the cap: d(raw score) = dS · (1 − tanh²).
                    if let Some(tanh) = tanh {
                        for (g, t) in ds.iter_mut().zip(tanh.iter()) {
                            *g *= 1.0 - t * t;
                        }
                    }
                    // P and dS enter their products in the operands' type.
                    let dtype = t.how.precision.dtype;
                    dtype.round(p);
                    dtype.round(ds);
                    // dV += Pᵀ dO
                    matmul(
                        &mut dv[c0 * d..],
                        p,
                        (1, nc),
                        &d_out[r0 * d..],
                        (d, 1),
                        (nc, d, nr),
                        1.0,
                        true,
                        dot,
                    );
                    // dQ += scale · dS K;  dK += scale · dSᵀ Q
                    matmul(
                        &mut dq[r0 * d..],
                        ds,
                        (nc, 1),
                        &k[c0 * d..],
                        (d, 1),
                        (nr, d, nc),
                        t.how.scale,
                        true,
                        dot,
                    );
                    matmul(
                        &mut dk[c0 * d..],
                        ds,
                        (1, nc),
                        &q[r0 * d..],
                        (d, 1),
                        (nc, d, nr),
                        t.how.scale,
                        true,
                        dot,
                    );
                }
            }
        }
    });
}

/// The fused CPU kernel as a [`TileKernel`]: every operand a host block (on the CPU backend the copy
/// from a tensor is the only one), masks read from the host slices of windows and positions.
#[derive(Debug, Clone, Copy, Default)]
pub struct FusedCpu;

impl<B: HostRead> TileKernel<B> for FusedCpu {
    type Shard = ();
    type Forward = (Arc<Block>, OnlineSoftmax);

    /// On the CPU backend; on a device backend it would copy every block to the host and compute
    /// there, so it says so instead (`--kernel fused` runs the CubeCL kernel there).
    fn implementation(
        &self,
        device: &B::Device,
        precision: Precision,
    ) -> Result<&'static str, RingError> {
        if B::HOST_MEMORY {
            Ok(match Dot::of_dtype(precision.dtype) {
                Dot::F32 => "cpu-fused",
                Dot::Bf16 => "cpu-fused-avx512bf16",
            })
        } else {
            Err(RingError::KernelUnavailable {
                kernel: "fused",
                backend: B::name(device),
                why: "it is the CPU kernel (on a device, --kernel fused is the CubeCL kernel)",
            })
        }
    }

    fn shard(&self, _: &[Window], _: &[usize], _: &B::Device) -> Result<(), RingError> {
        Ok(())
    }

    fn operand<const D: usize>(&self, kind: BlockKind, tensor: Tensor<B, D>) -> Block {
        Block::from_tensor(kind, tensor)
    }

    fn zeros(&self, kind: BlockKind, shape: Vec<usize>, _: &B::Device) -> Block {
        Block::zeros(kind, shape)
    }

    fn workspace_bytes(&self, dims: &TileDims, backward: bool) -> u64 {
        scratch_bytes(dims, backward)
    }

    fn forward_start(
        &self,
        q: &Arc<Block>,
        kv_heads: usize,
        queries: Queries<'_, ()>,
        scores: Scores,
        parallel: bool,
    ) -> Self::Forward {
        let [batch, heads, tq, head_dim] = q.shape[..] else {
            unreachable!("q blocks are 4-d")
        };
        let dims = TileDims {
            batch,
            heads,
            kv_heads,
            tq,
            tk: 0,
            head_dim,
        };
        let state = OnlineSoftmax::new(dims, queries.windows, scores).with_parallel(parallel);
        (q.clone(), state)
    }

    fn forward_tile(&self, (q, state): &mut Self::Forward, tile: ForwardTile<'_, ()>) {
        state.attend(
            &q.host_values(),
            &tile.k.host_values(),
            &tile.v.host_values(),
            tile.keys.positions,
        );
    }

    fn forward_finish(
        &self,
        (_, state): Self::Forward,
        sinks: Option<&Block>,
        device: &B::Device,
    ) -> (Tensor<B, 4>, Tensor<B, 3>) {
        let dims = state.dims();
        let sinks = sinks.map(Block::host_values);
        let (out, lse) = state.finish(sinks.as_deref());
        let rows = [dims.batch, dims.heads, dims.tq];
        let q = [dims.batch, dims.heads, dims.tq, dims.head_dim];
        (
            Tensor::from_data(TensorData::new(out, q), device),
            Tensor::from_data(TensorData::new(lse, rows), device),
        )
    }

    fn sink_gradient(&self, sinks: &Block, lse: &Block, delta: &Block, _: &B::Device) -> Block {
        let [_, heads, tq] = lse.shape[..] else {
            unreachable!("lse blocks are 3-d")
        };
        let (sinks, lse, delta) = (sinks.host_values(), lse.host_values(), delta.host_values());
        let mut dsinks = vec![0.0f32; heads];
        for (r, (&lse, &delta)) in lse.iter().zip(delta.iter()).enumerate() {
            let h = (r / tq) % heads;
            dsinks[h] -= (sinks[h] - lse).exp() * delta;
        }
        Block::host(BlockKind::DSinks, vec![heads], dsinks)
    }

    fn delta(&self, d_out: &Block, out: Tensor<B, 4>) -> Block {
        let [b, h, t, d] = out.dims();
        let delta = softmax_delta(&d_out.host_values(), &crate::host::read(out), d);
        Block::host(BlockKind::Delta, vec![b, h, t], delta)
    }

    fn backward_tile(
        &self,
        t: &Tile<'_, ()>,
        stay: &mut [Block],
        travelling: Travelling,
    ) -> Vec<Block> {
        let (q, k, v) = (t.q.host_values(), t.k.host_values(), t.v.host_values());
        let (d_out, lse, delta) = (
            t.d_out.host_values(),
            t.lse.host_values(),
            t.delta.host_values(),
        );
        let tile = BackwardTile {
            dims: t.dims,
            q: &q,
            k: &k,
            v: &v,
            d_out: &d_out,
            lse: &lse,
            delta: &delta,
            win_q: t.queries.windows,
            pos_k: t.keys.positions,
            how: t.scores,
            parallel: t.parallel,
        };
        // Host buffers: those that stay are added into in place.
        match travelling {
            Travelling::Queries => {
                let mut dq = Block::zeros(BlockKind::DQ, t.q.shape.clone());
                let [dk, dv] = stay else {
                    unreachable!("two stay-at-home blocks: dK, dV")
                };
                backward(
                    &tile,
                    dq.host_values_mut(),
                    dk.host_values_mut(),
                    dv.host_values_mut(),
                );
                vec![dq]
            }
            Travelling::Keys => {
                let mut dk = Block::zeros(BlockKind::DK, t.k.shape.clone());
                let mut dv = Block::zeros(BlockKind::DV, t.v.shape.clone());
                backward(
                    &tile,
                    stay[0].host_values_mut(),
                    dk.host_values_mut(),
                    dv.host_values_mut(),
                );
                vec![dk, dv]
            }
        }
    }
}

/// `chunk` (`w` rows of `d`) transposed into the first `d · w` values of `out`: `d` rows of `w`,
/// row `i` holding component `i` of every key. `gemm` takes a product with a chunk's transpose
/// (Q·Kᵀ, dO·Vᵀ) from this layout as it is; from the chunk's own it gathers the chunk into its panels
/// again on every call, and the backward makes two such calls per strip of rows of every block of
/// rows. (The forward reads K as it is: transposing a chunk for every block of rows cost it more
/// than `gemm`'s gathering, 0.41 against 0.39 s at 8K.)
fn transpose_chunk(chunk: &[f32], d: usize, out: &mut [f32]) {
    let width = chunk.len() / d.max(1);
    for (j, key) in chunk.chunks_exact(d.max(1)).enumerate() {
        for (i, &value) in key.iter().enumerate() {
            out[i * width + j] = value;
        }
    }
}

/// Runs `f` on every unit: on rayon's pool when `parallel`, else in order on this thread (a rayon
/// call from outside the pool would park this thread while the pool works).
fn for_each_unit<T: Send>(
    parallel: bool,
    units: impl Iterator<Item = T>,
    f: impl Fn(T) + Sync + Send,
) {
    if parallel {
        units.collect::<Vec<T>>().into_par_iter().for_each(f);
    } else {
        units.for_each(f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_hides_exactly_the_keys_outside_each_window_in_either_key_order() {
        // Causal queries 3, 0, 7; the last one in a document starting at 4.
        let win_q = [
            Window { lo: 0, hi: 3 },
            Window { lo: 0, hi: 0 },
            Window { lo: 4, hi: 7 },
        ];
        for pos_k in [vec![0, 2, 4, 6, 8], vec![8, 0, 6, 2, 4]] {
            // Rows start at r0 = 2, so they wrap round the queries as GQA rows do.
            let mut s = vec![1.0f32; 3 * pos_k.len()];
            mask(&mut s, &win_q, 2, &pos_k);
            for (i, row) in s.chunks(pos_k.len()).enumerate() {
                let w = win_q[(2 + i) % 3];
                for (&x, &pk) in row.iter().zip(&pos_k) {
                    assert_eq!(
                        x == f32::NEG_INFINITY,
                        !w.sees(pk),
                        "window {w:?}, key {pk}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_transposed_chunk_holds_each_component_of_its_keys_as_a_row() {
        let (width, d) = (5, 3);
        let chunk: Vec<f32> = (0..width * d).map(|i| i as f32).collect();
        // Longer than the chunk's transpose, as the kernels' buffers are for a last, short chunk.
        let mut out = vec![f32::NAN; 2 * width * d];
        transpose_chunk(&chunk, d, &mut out);
        for (i, j) in (0..d).flat_map(|i| (0..width).map(move |j| (i, j))) {
            assert_eq!(
                out[i * width + j],
                chunk[j * d + i],
                "component {i} of key {j}"
            );
        }
        assert!(
            out[width * d..].iter().all(|x| x.is_nan()),
            "wrote past the transpose"
        );
    }

    #[test]
    fn row_bounds_cover_wrapped_rows() {
        let win = [10, 11, 2, 3].map(|p| Window { lo: 0, hi: p });
        assert_eq!(row_bounds(&win, 0, 2).hi, (10, 11));
        assert_eq!(row_bounds(&win, 2, 6).hi, (2, 11));
        assert_eq!(row_bounds(&win, 3, 5).hi, (3, 10));
    }
}
