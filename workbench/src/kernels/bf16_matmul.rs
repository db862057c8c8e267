//! `C = A·B` in bf16 with f32 accumulation: A's f32 rows rounded to bf16 as they are read, B packed
//! once (a weight, at load) as pairs of bf16 along the inner dimension. AVX512-BF16's `vdpbf16ps`
//! where the CPU has it (detected at run time); elsewhere a portable loop with the same roundings.
//!
//! `vdpbf16ps` adds, per f32 lane, the products of two bf16 pairs: `acc + a₁·b₁ + a₀·b₀`, each
//! product exact in f32 (8-bit significands), each addition rounded. Pairs run along k, so B is
//! stored as `[⌈k/2⌉][n]` 32-bit words, word `(p, j)` holding `B[2p][j]` (low half) and
//! `B[2p + 1][j]` (high half); an odd k's last pair holds a zero.

use crate::dtype::Dtype;
use rayon::prelude::*;

/// The largest error of a product of inner dimension `k` computed here, as a fraction of
/// `|A|·|B|` (elementwise): each operand rounded to bf16 moves by at most u = 2⁻⁸ of itself, so
/// each term `a·b` by at most `2u + u²` of itself (then exact in f32); the k f32 additions, each
/// rounded, in any order, add at most `γ_k = k·ε / (1 − k·ε)` (ε = 2⁻²⁴) of the rounded terms'
/// absolute sum, which is at most `(1 + u)²·|A|·|B|`.
pub fn product_bound(k: usize) -> f64 {
    let (u, eps) = (Dtype::Bf16.unit_roundoff(), Dtype::F32.unit_roundoff());
    let gamma = k as f64 * eps / (1.0 - k as f64 * eps);
    2.0 * u + u * u + gamma * (1.0 + u).powi(2)
}

/// A `[k, n]` matrix rounded to bf16 (nearest, ties to even) and packed in pairs along k.
#[derive(Debug, Clone)]
pub struct PackedBf16 {
    k: usize,
    n: usize,
    /// `[⌈k/2⌉][n]` words.
    pairs: Vec<u32>,
}

/// bf16 bits → f32 (exact).
#[inline(always)]
fn from_bf16(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

impl PackedBf16 {
    /// Packs row-major `b: [k, n]`.
    pub fn pack(b: &[f32], k: usize, n: usize) -> Self {
        assert_eq!(b.len(), k * n, "a [{k}, {n}] matrix");
        let mut pairs = vec![0u32; k.div_ceil(2) * n];
        for (p, words) in pairs.chunks_mut(n).enumerate() {
            let row = |i: usize| &b[i * n..(i + 1) * n];
            pack_interleaved(row(2 * p), (2 * p + 1 < k).then(|| row(2 * p + 1)), words);
        }
        PackedBf16 { k, n, pairs }
    }

    /// `[k, n]`.
    pub fn dims(&self) -> [usize; 2] {
        [self.k, self.n]
    }

    /// The matrix as f32 (each value the bf16 it was rounded to), row-major `[k, n]`.
    pub fn unpack(&self) -> Vec<f32> {
        let mut out = vec![0.0f32; self.k * self.n];
        for (p, row) in self.pairs.chunks(self.n).enumerate() {
            for (j, &word) in row.iter().enumerate() {
                out[2 * p * self.n + j] = from_bf16(word as u16);
                if 2 * p + 1 < self.k {
                    out[(2 * p + 1) * self.n + j] = from_bf16((word >> 16) as u16);
                }
            }
        }
        out
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.pairs.len() * 4
    }
}

/// Rows of C a microkernel step computes.
const ROWS: usize = 4;
/// Columns of C a microkernel step keeps in registers (4 vectors of 16).
const COLS: usize = 64;
/// Rows of C a task computes, in tiles of [`ROWS`].
const TASK_ROWS: usize = 32;
/// Columns of C a task computes, in tiles of [`COLS`].
const TASK_COLS: usize = 256;

/// `a: [m, k]` (f32, row-major) times `b`, as `[m, n]` f32.
pub fn matmul(a: &[f32], m: usize, b: &PackedBf16) -> Vec<f32> {
    matmul_with(a, m, b, has_bf16_dot())
}

/// [`matmul`] on the AVX512-BF16 kernel (`fast`, where the CPU has it) or the portable one.
fn matmul_with(a: &[f32], m: usize, b: &PackedBf16, fast: bool) -> Vec<f32> {
    let (k, n) = (b.k, b.n);
    assert_eq!(a.len(), m * k, "a [{m}, {k}] left operand");
    let kp = k.div_ceil(2);
    // A's rows as bf16 pairs, the same layout along k as B's.
    let mut a_pairs = vec![0u32; m * kp];
    a_pairs
        .par_chunks_mut(kp)
        .zip(a.par_chunks(k))
        .for_each(|(pairs, row)| pack_adjacent(row, pairs));
    let mut c = crate::host::zeros_in_parallel(m * n);
    // Tasks: blocks of TASK_ROWS rows × TASK_COLS columns, so that a task's slice of B (⌈k/2⌉ × 64
    // words a column tile) stays in cache while its rows pass over it; a decode step's one row is
    // one block of rows.
    let blocks: Vec<(usize, usize)> = (0..m)
        .step_by(TASK_ROWS)
        .flat_map(|r| (0..n).step_by(TASK_COLS).map(move |c| (r, c)))
        .collect();
    let c_ptr = SendPtr(c.as_mut_ptr());
    blocks.into_par_iter().for_each(|(r_first, c0)| {
        let cols = TASK_COLS.min(n - c0);
        for j0 in (c0..c0 + cols).step_by(COLS) {
            let nc = COLS.min(c0 + cols - j0);
            for r0 in (r_first..(r_first + TASK_ROWS).min(m)).step_by(ROWS) {
                let rows = ROWS.min(m - r0);
                let a_block = &a_pairs[r0 * kp..(r0 + rows) * kp];
                // SAFETY: blocks are disjoint (rows r_first.. × columns c0..c0 + cols of C), and
                // each tile writes rows × nc values of its block, ldc = n apart.
                unsafe {
                    let at = c_ptr.at(r0 * n + j0);
                    if fast && nc == COLS {
                        #[cfg(target_arch = "x86_64")]
                        match rows {
                            4 => tile_avx512::<4>((a_block, kp, 1), kp, &b.pairs, n, j0, (at, n)),
                            3 => tile_avx512::<3>((a_block, kp, 1), kp, &b.pairs, n, j0, (at, n)),
                            2 => tile_avx512::<2>((a_block, kp, 1), kp, &b.pairs, n, j0, (at, n)),
                            _ => tile_avx512::<1>((a_block, kp, 1), kp, &b.pairs, n, j0, (at, n)),
                        }
                    } else {
                        tile_portable((a_block, kp, 1), rows, kp, &b.pairs, n, j0, nc, (at, n));
                    }
                }
            }
        }
    });
    c
}

/// Rows and columns of a matrix operand in memory: element (i, j) at `i · rows + j · cols`.
pub type Strides = (usize, usize);

/// f32 → bf16 bits (nearest, ties to even; a NaN stays a quiet NaN), in integer arithmetic that
/// vectorizes: the same bits as the `half` crate's `bf16::from_f32`.
#[inline(always)]
fn bf16_bits(x: f32) -> u32 {
    let b = x.to_bits();
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16;
    if x.is_nan() {
        (b >> 16) | 0x40
    } else {
        rounded
    }
}

crate::simd_fn! {
    /// `words[p] = (row[2p], row[2p + 1])` as bf16 (an odd length's last pair holds a zero).
    fn pack_adjacent(row: &[f32], words: &mut [u32]) {
        let mut pairs = row.chunks_exact(2);
        for (w, pair) in words.iter_mut().zip(&mut pairs) {
            *w = bf16_bits(pair[0]) | (bf16_bits(pair[1]) << 16);
        }
        if let [last] = pairs.remainder() {
            words[row.len() / 2] = bf16_bits(*last);
        }
    }
}

crate::simd_fn! {
    /// `words[j] = (even[j], odd[j])` as bf16; without `odd`, its halves hold zeros.
    fn pack_interleaved(even: &[f32], odd: Option<&[f32]>, words: &mut [u32]) {
        match odd {
            Some(odd) => {
                for ((w, &lo), &hi) in words.iter_mut().zip(even).zip(odd) {
                    *w = bf16_bits(lo) | (bf16_bits(hi) << 16);
                }
            }
            None => {
                for (w, &lo) in words.iter_mut().zip(even) {
                    *w = bf16_bits(lo);
                }
            }
        }
    }
}

/// `c[m×n] (+)= alpha · a[m×k] · b[k×n]` on the calling thread by AVX512-BF16 tiles, each operand
/// rounded to bf16 (nearest, ties to even) as it is packed and given by its strides (one of each
/// operand's strides must be 1), C row-major with rows `ldc` apart; `accumulate` adds to C, else
/// overwrites it. The fused attention kernel's products in bf16 (their operands are bf16 values
/// already, so packing only drops zero bits). On a CPU without AVX512-BF16 the portable tile
/// computes the same sums in the same order.
#[allow(clippy::too_many_arguments)]
pub fn product_strided(
    c: &mut [f32],
    ldc: usize,
    a: &[f32],
    a_strides: Strides,
    b: &[f32],
    b_strides: Strides,
    shape: (usize, usize, usize),
    alpha: f32,
    accumulate: bool,
) {
    let fast = has_bf16_dot();
    product_strided_with(
        c, ldc, a, a_strides, b, b_strides, shape, alpha, accumulate, fast,
    );
}

/// [`product_strided`] on the AVX512-BF16 tile (`fast`: the caller checked [`has_bf16_dot`]) or
/// the portable one.
#[allow(clippy::too_many_arguments)]
fn product_strided_with(
    c: &mut [f32],
    ldc: usize,
    a: &[f32],
    (a_rs, a_cs): Strides,
    b: &[f32],
    (b_rs, b_cs): Strides,
    (m, n, k): (usize, usize, usize),
    alpha: f32,
    accumulate: bool,
    fast: bool,
) {
    assert!(
        !fast || has_bf16_dot(),
        "the AVX512-BF16 tile on a CPU without it"
    );
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        c.len() > (m - 1) * ldc + n - 1,
        "product_strided: C too small"
    );
    if k == 0 {
        if !accumulate {
            c.chunks_mut(ldc).take(m).for_each(|row| row[..n].fill(0.0));
        }
        return;
    }
    assert!(
        a.len() > (m - 1) * a_rs + (k - 1) * a_cs,
        "product_strided: A too small"
    );
    assert!(
        b.len() > (k - 1) * b_rs + (n - 1) * b_cs,
        "product_strided: B too small"
    );
    assert!(
        (a_cs == 1 || a_rs == 1) && (b_cs == 1 || b_rs == 1),
        "product_strided: an operand with no unit stride"
    );
    let kp = k.div_ceil(2);
    // A's pairs along k, word (i, p) at i · a_row + p · a_pair: rows of A packed where A's rows
    // are contiguous, else pairs of A's columns (rows of the stored transpose) interleaved.
    let mut a_pairs = vec![0u32; m * kp];
    let (a_row, a_pair) = if a_cs == 1 {
        for (i, words) in a_pairs.chunks_mut(kp).enumerate() {
            pack_adjacent(&a[i * a_rs..i * a_rs + k], words);
        }
        (kp, 1)
    } else {
        for (p, words) in a_pairs.chunks_mut(m).enumerate() {
            let column = |j: usize| &a[j * a_cs..j * a_cs + m];
            pack_interleaved(
                column(2 * p),
                (2 * p + 1 < k).then(|| column(2 * p + 1)),
                words,
            );
        }
        (1, m)
    };
    // B as [kp][np] pairs along k, its columns padded with zeros to whole tiles: B's rows
    // interleaved in pairs where they are contiguous, else each column's pairs (a row of the stored
    // transpose) scattered down its column.
    let np = n.div_ceil(COLS) * COLS;
    let mut b_pairs = vec![0u32; kp * np];
    if b_cs == 1 {
        for (p, words) in b_pairs.chunks_mut(np).enumerate() {
            let row = |i: usize| &b[i * b_rs..i * b_rs + n];
            pack_interleaved(
                row(2 * p),
                (2 * p + 1 < k).then(|| row(2 * p + 1)),
                &mut words[..n],
            );
        }
    } else {
        let mut column = vec![0u32; kp];
        for j in 0..n {
            pack_adjacent(&b[j * b_cs..j * b_cs + k], &mut column);
            for (p, &w) in column.iter().enumerate() {
                b_pairs[p * np + j] = w;
            }
        }
    }
    let mut tile = [0.0f32; ROWS * COLS];
    for j0 in (0..np).step_by(COLS) {
        let nc = COLS.min(n - j0);
        for r0 in (0..m).step_by(ROWS) {
            let rows = ROWS.min(m - r0);
            let a_block = (&a_pairs[r0 * a_row..], a_row, a_pair);
            let at = tile.as_mut_ptr();
            // SAFETY: the tile holds ROWS × COLS values, COLS apart; columns j0..j0 + 64 lie inside
            // B's padded np; A's words (i, p) for i < rows, p < kp lie inside a_block; the fast
            // tile runs only where the CPU has AVX512-BF16 (asserted above).
            unsafe {
                if fast {
                    #[cfg(target_arch = "x86_64")]
                    match rows {
                        4 => tile_avx512::<4>(a_block, kp, &b_pairs, np, j0, (at, COLS)),
                        3 => tile_avx512::<3>(a_block, kp, &b_pairs, np, j0, (at, COLS)),
                        2 => tile_avx512::<2>(a_block, kp, &b_pairs, np, j0, (at, COLS)),
                        _ => tile_avx512::<1>(a_block, kp, &b_pairs, np, j0, (at, COLS)),
                    }
                } else {
                    tile_portable(a_block, rows, kp, &b_pairs, np, j0, COLS, (at, COLS));
                }
            }
            for (i, t) in tile.chunks(COLS).take(rows).enumerate() {
                let out = &mut c[(r0 + i) * ldc + j0..][..nc];
                if accumulate {
                    out.iter_mut().zip(t).for_each(|(c, t)| *c += alpha * t);
                } else {
                    out.iter_mut().zip(t).for_each(|(c, t)| *c = alpha * t);
                }
            }
        }
    }
}

/// The AVX512-BF16 tile: R × COLS of C in 4R registers, one `vdpbf16ps` per (row, vector) and
/// pair; A's word (i, p) at `a[i · a_row + p · a_pair]`, C's rows `ldc` apart.
///
/// # Safety
/// The CPU has AVX512-BF16; A's words (i, p) for i < R, p < kp lie inside `a`; columns
/// j0..j0 + 64 lie inside B's `n`; C's rows i < R hold 64 values from `c + i · ldc`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn tile_avx512<const R: usize>(
    (a, a_row, a_pair): (&[u32], usize, usize),
    kp: usize,
    b: &[u32],
    n: usize,
    j0: usize,
    (c, ldc): (*mut f32, usize),
) {
    use std::arch::x86_64::*;
    debug_assert!(a.len() > (R - 1) * a_row + (kp - 1) * a_pair);
    let mut acc = [[_mm512_setzero_ps(); 4]; R];
    let (a, b) = (a.as_ptr(), b.as_ptr());
    for p in 0..kp {
        // SAFETY: as the caller promises.
        unsafe {
            let row = b.add(p * n + j0);
            let bv: [__m512bh; 4] = [0, 1, 2, 3].map(|v| {
                std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(row.add(16 * v).cast()))
            });
            for (i, acc) in acc.iter_mut().enumerate() {
                let word = *a.add(i * a_row + p * a_pair);
                let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(word as i32));
                for (acc, &bv) in acc.iter_mut().zip(&bv) {
                    *acc = _mm512_dpbf16_ps(*acc, av, bv);
                }
            }
        }
    }
    for (i, acc) in acc.iter().enumerate() {
        for (v, &acc) in acc.iter().enumerate() {
            // SAFETY: as the caller promises.
            unsafe { _mm512_storeu_ps(c.add(i * ldc + 16 * v), acc) };
        }
    }
}

/// C's buffer, shared by tasks that write disjoint blocks of it.
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);

impl SendPtr {
    /// The element `offset` past the start (a method, so that a closure captures the whole wrapper,
    /// which is Send, not its raw pointer field).
    ///
    /// # Safety
    /// `offset` must lie inside C.
    unsafe fn at(self, offset: usize) -> *mut f32 {
        // SAFETY: the caller keeps `offset` inside C.
        unsafe { self.0.add(offset) }
    }
}
// SAFETY: every task writes only its own block of C (see `matmul`), and C outlives the tasks.
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}

/// Whether the kernels use `vdpbf16ps` (AVX512-BF16): the CPU has it and the SIMD level is
/// AVX-512 (`RINGBENCH_SIMD=avx2` or `portable` takes the portable tile, with the same bits).
pub fn has_bf16_dot() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::simd::level() == crate::simd::Level::Avx512
            && std::is_x86_feature_detected!("avx512bf16")
            && std::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The portable tile: `rows × nc` of C from the pairs, in `vdpbf16ps`'s order (the high product
/// first, then the low, each addition rounded to f32); A's word (i, p) at `a[i · a_row + p ·
/// a_pair]`, C's rows `ldc` apart.
///
/// # Safety
/// C's rows i < rows hold nc values from `c + i · ldc`.
#[allow(clippy::too_many_arguments)]
unsafe fn tile_portable(
    (a, a_row, a_pair): (&[u32], usize, usize),
    rows: usize,
    kp: usize,
    b: &[u32],
    n: usize,
    j0: usize,
    nc: usize,
    (c, ldc): (*mut f32, usize),
) {
    for i in 0..rows {
        for j in 0..nc {
            let mut acc = 0.0f32;
            for p in 0..kp {
                let (wa, wb) = (a[i * a_row + p * a_pair], b[p * n + j0 + j]);
                acc += from_bf16((wa >> 16) as u16) * from_bf16((wb >> 16) as u16);
                acc += from_bf16(wa as u16) * from_bf16(wb as u16);
            }
            // SAFETY: as the caller promises.
            unsafe { *c.add(i * ldc + j) = acc };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values in [−2, 2) from a small linear congruential generator (no dependency on a test crate's
    /// inputs: this module's arithmetic is all it checks).
    fn values(len: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..len)
            .map(|_| {
                s = s
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
            })
            .collect()
    }

    /// Every element within [`product_bound`]`(k)·(|A|·|B|)` of the float64 product of the unrounded
    /// operands, on the CPU's kernel and on the portable one, for shapes with odd k, a column count
    /// that is not a multiple of the tile, one row (a decode step), a partial row block, and more
    /// rows and columns than a task holds.
    #[test]
    fn products_stay_within_the_bf16_bound_of_float64() {
        for (m, k, n) in [(1, 96, 200), (5, 33, 64), (9, 128, 130), (37, 40, 320)] {
            let (a, b) = (values(m * k, 1 + m as u64), values(k * n, 7 + n as u64));
            let packed = PackedBf16::pack(&b, k, n);
            let bound = product_bound(k);
            for fast in [true, false] {
                let c = matmul_with(&a, m, &packed, fast && has_bf16_dot());
                assert_eq!(c.len(), m * n);
                for i in 0..m {
                    for j in 0..n {
                        let (mut exact, mut size) = (0.0f64, 0.0f64);
                        for p in 0..k {
                            let t = f64::from(a[i * k + p]) * f64::from(b[p * n + j]);
                            exact += t;
                            size += t.abs();
                        }
                        let err = (f64::from(c[i * n + j]) - exact).abs();
                        assert!(
                            err <= bound * size,
                            "[{m}, {k}] · [{k}, {n}] at ({i}, {j}), fast {fast}: {err:e} > {:e}",
                            bound * size
                        );
                    }
                }
            }
        }
    }

    /// The strided product: each element within [`product_bound`]`(k)·(|A|·|B|)` of float64 plus
    /// what C held (and the f32 rounding of that last addition), for transposed operands, C rows
    /// wider than n, tails of rows and columns, odd k, and both overwriting and accumulating; on
    /// the portable tile on every CPU, and on the AVX512-BF16 one where the CPU has it.
    #[test]
    fn strided_products_stay_within_the_bf16_bound_of_float64() {
        let tiles: &[bool] = if has_bf16_dot() {
            &[false, true]
        } else {
            ringbench_tests::skips::record(
                "bf16_matmul: the AVX512-BF16 tile of product_strided",
                "this CPU has no AVX512-BF16 (its portable twin was tested)",
            );
            &[false]
        };
        for (m, n, k, transposed) in [(7, 70, 33, false), (9, 64, 64, true), (1, 3, 1, true)] {
            let (a, b) = (values(m * k, 11 + k as u64), values(k * n, 5 + m as u64));
            // Transposed: A stored [k, m] and B stored [n, k].
            let (a_strides, b_strides) = if transposed {
                ((1, m), (1, k))
            } else {
                ((k, 1), (n, 1))
            };
            let (ldc, alpha) = (n + 5, 0.5f32);
            for (&fast, accumulate) in tiles.iter().flat_map(|f| [(f, false), (f, true)]) {
                let start = values(m * ldc, 2);
                let mut c = start.clone();
                let shape = (m, n, k);
                product_strided_with(
                    &mut c, ldc, &a, a_strides, &b, b_strides, shape, alpha, accumulate, fast,
                );

                for i in 0..m {
                    for j in 0..n {
                        let (mut exact, mut size) = (0.0f64, 0.0f64);
                        for p in 0..k {
                            let x = f64::from(a[i * a_strides.0 + p * a_strides.1]);
                            let t = x * f64::from(b[p * b_strides.0 + j * b_strides.1]);
                            exact += t;
                            size += t.abs();
                        }
                        let before = if accumulate {
                            f64::from(start[i * ldc + j])
                        } else {
                            0.0
                        };
                        let want = before + f64::from(alpha) * exact;
                        // The bf16 products' bound, plus the last multiply and add in f32.
                        let bound = f64::from(alpha) * size * product_bound(k)
                            + 2.0 * 2f64.powi(-24) * (before.abs() + f64::from(alpha) * size);
                        let err = (f64::from(c[i * ldc + j]) - want).abs();
                        assert!(
                            err <= bound,
                            "[{m}, {k}] · [{k}, {n}] at ({i}, {j}), fast {fast}, accumulate {accumulate}: {err:e} > {bound:e}"
                        );
                    }
                    // Past n, C's row is untouched.
                    assert_eq!(
                        &c[i * ldc + n..(i + 1) * ldc],
                        &start[i * ldc + n..(i + 1) * ldc]
                    );
                }
            }
        }
    }

    /// The packers' rounding is `half`'s, bit for bit: ties both ways, carries into the exponent,
    /// overflow to infinity, infinities, NaNs of either sign and payload, subnormals, and 100,000
    /// bit patterns from the generator.
    #[test]
    fn packing_rounds_as_half_does() {
        let mut bits = vec![
            0x3f80_8000,
            0x3f81_8000,
            0x3f80_7fff,
            0x3f80_8001,
            0x3fff_ffff,
            0x7f7f_ffff,
            0xff7f_ffff,
            0x7f80_0000,
            0xff80_0000,
            0x7f80_0001,
            0xffc0_0000,
            0x7fff_ffff,
            0x0000_8000,
            0x0001_8000,
            0x8000_0000,
            0,
        ];
        let mut s = 12345u64;
        bits.extend((0..100_000).map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (s >> 32) as u32
        }));
        for b in bits {
            let x = f32::from_bits(b);
            assert_eq!(
                bf16_bits(x),
                u32::from(half::bf16::from_f32(x).to_bits()),
                "{b:#010x}"
            );
        }
    }

    /// Packing keeps each value's bf16 rounding: unpacked, every value is its nearest bf16.
    #[test]
    fn unpacking_gives_each_value_rounded_to_bf16() {
        let b = values(7 * 5, 3);
        let unpacked = PackedBf16::pack(&b, 7, 5).unpack();
        for (u, v) in unpacked.iter().zip(&b) {
            assert_eq!(*u, half::bf16::from_f32(*v).to_f32());
        }
    }
}
