//! `C = A·B` in bf16 with f32 accumulation: A's f32 rows rounded to bf16 as they are read, B packed
//! once (a weight, at load) as pairs of bf16 along the inner dimension. AVX512-BF16's `vdpbf16ps`
//! where the CPU has it (detected at run time); elsewhere a portable loop with the same roundings.
//!
//! `vdpbf16ps` adds, per f32 lane, the products of two bf16 pairs: `acc + a₁·b₁ + a₀·b₀`, each
//! product exact in f32 (8-bit significands), each addition rounded. Pairs run along k, so B is
//! stored as `[⌈k/2⌉][n]` 32-bit words, word `(p, j)` holding `B[2p][j]` (low half) and
//! `B[2p + 1][j]` (high half); an odd k's last pair holds a zero.

use rayon::prelude::*;

/// A `[k, n]` matrix rounded to bf16 (nearest, ties to even) and packed in pairs along k.
#[derive(Debug, Clone)]
pub struct PackedBf16 {
    k: usize,
    n: usize,
    /// `[⌈k/2⌉][n]` words.
    pairs: Vec<u32>,
}

/// f32 → bf16 bits, rounding to nearest, ties to even (the `half` crate's rounding).
#[inline(always)]
fn to_bf16(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
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
        for (p, row) in pairs.chunks_mut(n).enumerate() {
            for (j, word) in row.iter_mut().enumerate() {
                let lo = to_bf16(b[2 * p * n + j]);
                let hi = if 2 * p + 1 < k {
                    to_bf16(b[(2 * p + 1) * n + j])
                } else {
                    0
                };
                *word = u32::from(lo) | (u32::from(hi) << 16);
            }
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

/// Rows of C a task computes.
const ROWS: usize = 4;
/// Columns of C a microkernel step keeps in registers (4 vectors of 16).
const COLS: usize = 64;

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
        .for_each(|(pairs, row)| {
            for (p, word) in pairs.iter_mut().enumerate() {
                let lo = to_bf16(row[2 * p]);
                let hi = if 2 * p + 1 < k {
                    to_bf16(row[2 * p + 1])
                } else {
                    0
                };
                *word = u32::from(lo) | (u32::from(hi) << 16);
            }
        });
    let mut c = vec![0.0f32; m * n];
    // Tasks: blocks of ROWS rows × all columns (a decode step's one row: blocks of columns).
    let task_cols = if m < 4 * ROWS { COLS * 4 } else { n };
    let blocks: Vec<(usize, usize)> = (0..m)
        .step_by(ROWS)
        .flat_map(|r| (0..n).step_by(task_cols).map(move |c| (r, c)))
        .collect();
    let c_ptr = SendPtr(c.as_mut_ptr());
    blocks.into_par_iter().for_each(|(r0, c0)| {
        let rows = ROWS.min(m - r0);
        let cols = task_cols.min(n - c0);
        for j0 in (c0..c0 + cols).step_by(COLS) {
            let nc = COLS.min(c0 + cols - j0);
            let a_block = &a_pairs[r0 * kp..(r0 + rows) * kp];
            // SAFETY: blocks are disjoint (rows r0..r0 + rows × columns c0..c0 + cols of C), and
            // each tile writes rows × nc values of its block, ldc = n apart.
            unsafe {
                let at = c_ptr.at(r0 * n + j0);
                if fast && nc == COLS {
                    #[cfg(target_arch = "x86_64")]
                    match rows {
                        4 => tile_avx512::<4>(a_block, kp, &b.pairs, n, j0, at, n),
                        3 => tile_avx512::<3>(a_block, kp, &b.pairs, n, j0, at, n),
                        2 => tile_avx512::<2>(a_block, kp, &b.pairs, n, j0, at, n),
                        _ => tile_avx512::<1>(a_block, kp, &b.pairs, n, j0, at, n),
                    }
                } else {
                    tile_portable(
                        a_block,
                        rows,
                        kp,
                        &b.pairs,
                        n,
                        j0,
                        nc,
                        c_ptr.0.add(r0 * n + j0),
                        n,
                    );
                }
            }
        }
    });
    c
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

/// Whether this CPU has `vdpbf16ps` (AVX512-BF16), detected once.
pub fn has_bf16_dot() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512bf16") && std::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The portable tile: `rows × nc` of C from the pairs, in `vdpbf16ps`'s order (the high product
/// first, then the low, each addition rounded to f32).
#[allow(clippy::too_many_arguments)]
unsafe fn tile_portable(
    a: &[u32],
    rows: usize,
    kp: usize,
    b: &[u32],
    n: usize,
    j0: usize,
    nc: usize,
    c: *mut f32,
    ldc: usize,
) {
    for i in 0..rows {
        for j in 0..nc {
            let mut acc = 0.0f32;
            for p in 0..kp {
                let (wa, wb) = (a[i * kp + p], b[p * n + j0 + j]);
                acc += from_bf16((wa >> 16) as u16) * from_bf16((wb >> 16) as u16);
                acc += from_bf16(wa as u16) * from_bf16(wb as u16);
            }
            unsafe { *c.add(i * ldc + j) = acc };
        }
    }
}

/// The AVX512-BF16 tile: ROWS × COLS of C in 16 registers, one `vdpbf16ps` per (row, vector) and pair.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn tile_avx512<const R: usize>(
    a: &[u32],
    kp: usize,
    b: &[u32],
    n: usize,
    j0: usize,
    c: *mut f32,
    ldc: usize,
) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_ps(); 4]; R];
    for p in 0..kp {
        // SAFETY: the caller's columns j0..j0 + 64 lie inside B's n.
        let row = unsafe { b.as_ptr().add(p * n + j0) };
        let bv: [__m512bh; 4] = std::array::from_fn(|v| unsafe {
            std::mem::transmute::<__m512i, __m512bh>(
                _mm512_loadu_si512(row.add(16 * v) as *const _),
            )
        });
        for (i, acc) in acc.iter_mut().enumerate() {
            // SAFETY: a pair of bf16 is 32 bits, as each lane of a __m512bh.
            let av: __m512bh =
                unsafe { std::mem::transmute(_mm512_set1_epi32(a[i * kp + p] as i32)) };
            for (acc, &bv) in acc.iter_mut().zip(&bv) {
                *acc = _mm512_dpbf16_ps(*acc, av, bv);
            }
        }
    }
    for (i, acc) in acc.iter().enumerate() {
        for (v, &acc) in acc.iter().enumerate() {
            // SAFETY: row i's 64 columns lie inside the caller's block of C.
            unsafe { _mm512_storeu_ps(c.add(i * ldc + 16 * v), acc) };
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

    /// Every element within `(2⁻⁸ + k·2⁻²⁴)·(|A|·|B|)` of the float64 product of the unrounded
    /// operands, on the CPU's kernel and on the portable one, for shapes with odd k, a column count
    /// that is not a multiple of the tile, one row (a decode step) and a partial row block.
    #[test]
    fn products_stay_within_the_bf16_bound_of_float64() {
        for (m, k, n) in [(1, 96, 200), (5, 33, 64), (9, 128, 130)] {
            let (a, b) = (values(m * k, 1 + m as u64), values(k * n, 7 + n as u64));
            let packed = PackedBf16::pack(&b, k, n);
            let bound = 2f64.powi(-8) + k as f64 * 2f64.powi(-24);
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
