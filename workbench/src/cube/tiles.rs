//! The fused tile kernels in CubeCL: forward with an online softmax over key sub-tiles held in
//! shared memory, and the FlashAttention-2 backward as two kernels (dK and dV for a block of keys,
//! dQ for a block of queries), so that no two cubes write the same row and nothing is atomic.
//!
//! One cube is `tile` units, each owning one row (a query row forward and for dQ, a key row for dK
//! and dV) in registers; the other side streams through shared memory `tile` rows at a time. Rows
//! are held as 4-wide vectors (`d4 = ⌈d / 4⌉` of them, the padding zeros), so that one shared-memory
//! read feeds four multiply-adds. Masks come from each query's window `[lo, hi]` of key positions
//! and each key's position (f32, exact below 2^24): a sub-tile that no row of the cube sees is
//! skipped (each cube counts the sub-tiles it computed, in `work`), and one that every row sees
//! whole checks no position; inside a sub-tile a hidden pair's probability is selected to 0, without
//! a branch. Query head `h` reads kv head `h / (heads / kv_heads)`. Everything accumulates in f32;
//! in a bf16 run (`bf16`) P and dS are rounded to bf16 before their products, as the other kernels
//! round them (the operands arrive as f32 holding bf16 values).
//!
//! −∞ arrives as the runtime argument `neg_inf` (WGSL has no infinity literal): a row that saw no
//! key gets output 0 and lse −∞, as every kernel's.
//!
//! Shapes (any strides): q, out, dO, dq `[b, h, tq, d]`; k, v, dk, dv `[b, hk, tk, d]`; lse, δ
//! `[b, h, tq]`; windows `[tq]`; key positions `[tk]`.

use cubecl::prelude::*;

/// Four f32 lanes of a row.
type V4 = Vector<f32, Const<4>>;

/// The offset of row `i`, column 0, of head `h` in batch `b` of a `[b, h, t, d]` tensor.
#[cube]
fn row_offset(t: &Tensor<f32>, b: usize, h: usize, i: usize) -> usize {
    b * t.stride(0) + h * t.stride(1) + i * t.stride(2)
}

/// The sum of a vector's four lanes.
#[cube]
fn sum4(x: V4) -> f32 {
    x[0] + x[1] + x[2] + x[3]
}

/// Columns `4·c4 .. 4·c4 + 4` of the row at `at` of `t`, times `factor`; columns past `d` are 0.
#[cube]
fn read4(t: &Tensor<f32>, at: usize, c4: usize, factor: f32, #[comptime] d: usize) -> V4 {
    let mut x = V4::new(0.0);
    #[unroll]
    for e in 0..4usize {
        let c = c4 * 4 + e;
        if c < d {
            x[e] = t[at + c * t.stride(3)] * factor;
        }
    }
    x
}

/// Writes `x` to columns `4·c4 .. 4·c4 + 4` (those below `d`) of the row at `at` of `t`.
#[cube]
fn write4(t: &mut Tensor<f32>, at: usize, c4: usize, x: V4, #[comptime] d: usize) {
    #[unroll]
    for e in 0..4usize {
        let c = c4 * 4 + e;
        if c < d {
            t[at + c * t.stride(3)] = x[e];
        }
    }
}

/// A raw score `s` through the soft cap, `C · tanh(s / C)`, with the cap's derivative
/// `1 − tanh²` (1 without a cap).
#[cube]
fn capped_score(s: f32, cap: f32, #[comptime] capped: bool) -> (f32, f32) {
    if capped {
        let t = (s / cap).tanh();
        (cap * t, 1.0f32 - t * t)
    } else {
        (s, 1.0f32)
    }
}

/// `x` rounded to bf16's 8 significant bits (to nearest, ties to even) and kept in f32, when
/// `rounded` (a bf16 run: P and dS enter their products so, as a bf16 tensor core's operands);
/// else `x`. Integer arithmetic on the bits, so that devices without bf16 (WebGPU) run it too. For
/// finite values (P and dS are); one that rounds past bf16's largest becomes ∞, as bf16's own
/// rounding does.
#[cube]
fn to_bf16(x: f32, #[comptime] rounded: bool) -> f32 {
    if rounded {
        let bits = u32::reinterpret(x);
        let tie_to_even = (bits >> 16u32) & 1u32;
        f32::reinterpret((bits + 0x7fffu32 + tie_to_even) & 0xffff_0000u32)
    } else {
        x
    }
}

/// The `[lo_min, lo_max, hi_min, hi_max]` of the first `rows` windows in shared memory: a key below
/// `lo_min` or above `hi_max` is seen by no row; one in `[lo_max, hi_min]` by every row.
#[cube]
fn window_bounds(
    s_lo: &SharedMemory<f32>,
    s_hi: &SharedMemory<f32>,
    rows: usize,
    neg_inf: f32,
) -> Array<f32> {
    let mut bounds = Array::<f32>::new(4usize);
    bounds[0] = -neg_inf;
    bounds[1] = neg_inf;
    bounds[2] = -neg_inf;
    bounds[3] = neg_inf;
    for r in 0..rows {
        bounds[0] = min(bounds[0], s_lo[r]);
        bounds[1] = max(bounds[1], s_lo[r]);
        bounds[2] = min(bounds[2], s_hi[r]);
        bounds[3] = max(bounds[3], s_hi[r]);
    }
    bounds
}

/// The `[lowest, highest]` of the first `keys` positions in shared memory.
#[cube]
fn key_span(s_pos: &SharedMemory<f32>, keys: usize, neg_inf: f32) -> Array<f32> {
    let mut span = Array::<f32>::new(2usize);
    span[0] = -neg_inf;
    span[1] = neg_inf;
    for jj in 0..keys {
        span[0] = min(span[0], s_pos[jj]);
        span[1] = max(span[1], s_pos[jj]);
    }
    span
}

/// Whether keys spanning `span` are seen by no row of windows `bounds` (`0`), by some (`1`), or
/// whole by every row (`2`).
#[cube]
fn cover(bounds: &Array<f32>, span: &Array<f32>) -> u32 {
    let mut c = 1u32;
    if span[1] < bounds[0] || span[0] > bounds[3] {
        c = 0u32;
    } else if span[0] >= bounds[1] && span[1] <= bounds[2] {
        c = 2u32;
    }
    c
}

/// This unit's `r` query rows' windows of visible key positions into `lo` and `hi` (a row past the
/// end sees nothing: `[0, −1]`), and into `s_lo` and `s_hi` in the block's row order (row
/// `t · tile + unit`), from which [`window_bounds`] takes the cube's bounds after a `sync_cube`.
/// The forward and dQ kernels, whose units own query rows, share it.
#[allow(clippy::too_many_arguments)]
#[cube]
fn load_windows(
    q_lo: &Tensor<f32>,
    q_hi: &Tensor<f32>,
    s_lo: &mut SharedMemory<f32>,
    s_hi: &mut SharedMemory<f32>,
    lo: &mut Array<f32>,
    hi: &mut Array<f32>,
    base: usize,
    unit: usize,
    tq: usize,
    #[comptime] tile: usize,
    #[comptime] r: usize,
) {
    #[unroll]
    for t in 0..r {
        let i = base + t * tile + unit;
        lo[t] = 0.0f32;
        hi[t] = f32::new(-1.0);
        if i < tq {
            lo[t] = q_lo[i * q_lo.stride(0)];
            hi[t] = q_hi[i * q_hi.stride(0)];
        }
        s_lo[t * tile + unit] = lo[t];
        s_hi[t * tile + unit] = hi[t];
    }
}

/// Key sub-tile `kb` (`tile` keys from `kb · tile`; unit `u` loads key `u`) of kv head `hk` in
/// batch `b` into shared memory: positions, keys and values, each row as `d4` four-wide vectors.
/// Returns how many keys the sub-tile holds (the last may be partial); the caller syncs the cube
/// before reading them. The forward and dQ kernels, which stream keys past their query rows, share
/// it.
#[allow(clippy::too_many_arguments)]
#[cube]
fn stage_keys(
    k: &Tensor<f32>,
    v: &Tensor<f32>,
    k_pos: &Tensor<f32>,
    s_pos: &mut SharedMemory<f32>,
    s_k: &mut SharedMemory<V4>,
    s_v: &mut SharedMemory<V4>,
    b: usize,
    hk: usize,
    kb: usize,
    unit: usize,
    #[comptime] tile: usize,
    #[comptime] d: usize,
) -> usize {
    let d4 = comptime!(d.div_ceil(4));
    let tk = k.shape(2);
    let j = kb * tile + unit;
    if j < tk {
        s_pos[unit] = k_pos[j * k_pos.stride(0)];
        let k_at = row_offset(k, b, hk, j);
        let v_at = row_offset(v, b, hk, j);
        #[unroll]
        for c4 in 0..d4 {
            s_k[unit * d4 + c4] = read4(k, k_at, c4, 1.0f32, d);
            s_v[unit * d4 + c4] = read4(v, v_at, c4, 1.0f32, d);
        }
    }
    min(tile, tk - kb * tile)
}

/// The forward of one tile folded into the running `(out_prev, lse_prev)`: writes the merged
/// `(out, lse)`. Cubes: (query blocks of `tile · r` rows, heads, batch); unit `u` owns rows
/// `u, u + tile, …` of its block (`r` of them), so that every key it reads from shared memory feeds
/// `r` rows.
#[allow(clippy::too_many_arguments)]
#[cube(launch_unchecked)]
pub fn forward_tile(
    q: &Tensor<f32>,
    k: &Tensor<f32>,
    v: &Tensor<f32>,
    q_lo: &Tensor<f32>,
    q_hi: &Tensor<f32>,
    k_pos: &Tensor<f32>,
    out_prev: &Tensor<f32>,
    lse_prev: &Tensor<f32>,
    out: &mut Tensor<f32>,
    lse: &mut Tensor<f32>,
    work: &mut Tensor<f32>,
    scale: f32,
    cap: f32,
    neg_inf: f32,
    #[comptime] tile: usize,
    #[comptime] r: usize,
    #[comptime] d: usize,
    #[comptime] capped: bool,
    #[comptime] bf16: bool,
) {
    let d4 = comptime!(d.div_ceil(4));
    let unit = UNIT_POS_X as usize;
    let block = CUBE_POS_X as usize;
    let h = CUBE_POS_Y as usize;
    let b = CUBE_POS_Z as usize;
    let tq = q.shape(2);
    let tk = k.shape(2);
    let hk = h / (q.shape(1) / k.shape(1));
    let base = block * tile * r;
    let rows = min(tile * r, tq - base);

    // This unit's rows' windows (a row past the end sees nothing), and the cube's bounds.
    let mut s_lo = SharedMemory::<f32>::new(tile * r);
    let mut s_hi = SharedMemory::<f32>::new(tile * r);
    let mut lo = Array::<f32>::new(r);
    let mut hi = Array::<f32>::new(r);
    let mut m = Array::<f32>::new(r);
    let mut l = Array::<f32>::new(r);
    let mut q_row = Array::<V4>::new(r * d4);
    let mut acc = Array::<V4>::new(r * d4);
    load_windows(
        q_lo, q_hi, &mut s_lo, &mut s_hi, &mut lo, &mut hi, base, unit, tq, tile, r,
    );
    #[unroll]
    for t in 0..r {
        let i = base + t * tile + unit;
        m[t] = neg_inf;
        l[t] = 0.0f32;
        let q_at = row_offset(q, b, h, min(i, tq - 1));
        #[unroll]
        for c4 in 0..d4 {
            q_row[t * d4 + c4] = read4(q, q_at, c4, scale, d);
            acc[t * d4 + c4] = V4::new(0.0);
        }
    }
    sync_cube();
    let bounds = window_bounds(&s_lo, &s_hi, rows, neg_inf);

    let mut s_pos = SharedMemory::<f32>::new(tile);
    let mut s_k = SharedMemory::<V4>::new(tile * d4);
    let mut s_v = SharedMemory::<V4>::new(tile * d4);
    let mut dot = Array::<V4>::new(r);
    let mut correction = Array::<f32>::new(r);
    let mut p = Array::<f32>::new(r);
    let mut computed = 0.0f32;
    let blocks = tk.div_ceil(tile);
    for kb in 0..blocks {
        let keys = stage_keys(
            k, v, k_pos, &mut s_pos, &mut s_k, &mut s_v, b, hk, kb, unit, tile, d,
        );
        sync_cube();
        let covered = cover(&bounds, &key_span(&s_pos, keys, neg_inf));
        if covered != 0u32 {
            computed += 1.0;
            for jj in 0..keys {
                #[unroll]
                for t in 0..r {
                    dot[t] = V4::new(0.0);
                }
                #[unroll]
                for c4 in 0..d4 {
                    let key = s_k[jj * d4 + c4];
                    #[unroll]
                    for t in 0..r {
                        dot[t] += q_row[t * d4 + c4] * key;
                    }
                }
                let pos = s_pos[jj];
                #[unroll]
                for t in 0..r {
                    let (capped_s, _) = capped_score(sum4(dot[t]), cap, capped);
                    let seen = covered == 2u32 || (pos >= lo[t] && pos <= hi[t]);
                    let s = select(seen, capped_s, neg_inf);
                    // Online softmax, one key at a time; before any visible key the running max
                    // is taken as 0 so that nothing is ∞ − ∞.
                    let m_new = max(m[t], s);
                    let m_safe = select(m_new == neg_inf, 0.0f32, m_new);
                    correction[t] = (m[t] - m_safe).exp();
                    p[t] = (s - m_safe).exp();
                    // The row's sum takes P in f32; its product with V, in the operands' type.
                    l[t] = l[t] * correction[t] + p[t];
                    p[t] = to_bf16(p[t], bf16);
                    m[t] = m_new;
                }
                #[unroll]
                for c4 in 0..d4 {
                    let value = s_v[jj * d4 + c4];
                    #[unroll]
                    for t in 0..r {
                        let at = t * d4 + c4;
                        acc[at] = acc[at] * V4::new(correction[t]) + value * V4::new(p[t]);
                    }
                }
            }
        }
        sync_cube();
    }

    #[unroll]
    for t in 0..r {
        let i = base + t * tile + unit;
        if i < tq {
            // This tile's (normalized output, lse), merged with the previous ones in f32.
            let mut lse_tile = neg_inf;
            let mut inv = 0.0f32;
            if l[t] > 0.0 {
                lse_tile = m[t] + l[t].ln();
                inv = 1.0f32 / l[t];
            }
            let lse_at = b * lse_prev.stride(0) + h * lse_prev.stride(1) + i * lse_prev.stride(2);
            let lse_before = lse_prev[lse_at];
            let top = max(lse_before, lse_tile);
            let prev_at = row_offset(out_prev, b, h, i);
            let out_at = row_offset(out, b, h, i);
            let lse_out = b * lse.stride(0) + h * lse.stride(1) + i * lse.stride(2);
            if top == neg_inf {
                lse[lse_out] = neg_inf;
                #[unroll]
                for c4 in 0..d4 {
                    write4(out, out_at, c4, V4::new(0.0), d);
                }
            } else {
                let w_before = (lse_before - top).exp();
                let w_tile = (lse_tile - top).exp();
                let total = w_before + w_tile;
                lse[lse_out] = top + total.ln();
                #[unroll]
                for c4 in 0..d4 {
                    let before = read4(out_prev, prev_at, c4, w_before / total, d);
                    let mixed = before + acc[t * d4 + c4] * V4::new(inv * w_tile / total);
                    write4(out, out_at, c4, mixed, d);
                }
            }
        }
    }
    if unit == 0 {
        work[(b * CUBE_COUNT_Y as usize + h) * CUBE_COUNT_X as usize + block] = computed;
    }
}

/// dK and dV of one block of keys against every query of their group's heads. Cubes: (key blocks
/// of `tile · r` keys, kv heads, batch); unit `u` owns keys `u, u + tile, …` of its block.
#[allow(clippy::too_many_arguments)]
#[cube(launch_unchecked)]
pub fn backward_dkdv(
    q: &Tensor<f32>,
    k: &Tensor<f32>,
    v: &Tensor<f32>,
    d_out: &Tensor<f32>,
    lse: &Tensor<f32>,
    delta: &Tensor<f32>,
    q_lo: &Tensor<f32>,
    q_hi: &Tensor<f32>,
    k_pos: &Tensor<f32>,
    dk: &mut Tensor<f32>,
    dv: &mut Tensor<f32>,
    work: &mut Tensor<f32>,
    scale: f32,
    cap: f32,
    neg_inf: f32,
    #[comptime] tile: usize,
    #[comptime] r: usize,
    #[comptime] d: usize,
    #[comptime] capped: bool,
    #[comptime] bf16: bool,
) {
    let d4 = comptime!(d.div_ceil(4));
    let unit = UNIT_POS_X as usize;
    let block = CUBE_POS_X as usize;
    let hk = CUBE_POS_Y as usize;
    let b = CUBE_POS_Z as usize;
    let tq = q.shape(2);
    let tk = k.shape(2);
    let group = q.shape(1) / k.shape(1);
    let base = block * tile * r;
    let keys = min(tile * r, tk - base);

    let mut s_pos = SharedMemory::<f32>::new(tile * r);
    let mut pos = Array::<f32>::new(r);
    let mut k_row = Array::<V4>::new(r * d4);
    let mut v_row = Array::<V4>::new(r * d4);
    let mut dk_acc = Array::<V4>::new(r * d4);
    let mut dv_acc = Array::<V4>::new(r * d4);
    #[unroll]
    for t in 0..r {
        let j = base + t * tile + unit;
        pos[t] = f32::new(-1.0);
        if j < tk {
            pos[t] = k_pos[j * k_pos.stride(0)];
        }
        s_pos[t * tile + unit] = pos[t];
        let k_at = row_offset(k, b, hk, min(j, tk - 1));
        let v_at = row_offset(v, b, hk, min(j, tk - 1));
        #[unroll]
        for c4 in 0..d4 {
            k_row[t * d4 + c4] = read4(k, k_at, c4, scale, d);
            v_row[t * d4 + c4] = read4(v, v_at, c4, 1.0f32, d);
            dk_acc[t * d4 + c4] = V4::new(0.0);
            dv_acc[t * d4 + c4] = V4::new(0.0);
        }
    }
    sync_cube();
    let span = key_span(&s_pos, keys, neg_inf);

    let mut s_q = SharedMemory::<V4>::new(tile * d4);
    let mut s_do = SharedMemory::<V4>::new(tile * d4);
    let mut s_lse = SharedMemory::<f32>::new(tile);
    let mut s_delta = SharedMemory::<f32>::new(tile);
    let mut s_lo = SharedMemory::<f32>::new(tile);
    let mut s_hi = SharedMemory::<f32>::new(tile);
    let mut score = Array::<V4>::new(r);
    let mut dp = Array::<V4>::new(r);
    let mut p = Array::<f32>::new(r);
    let mut ds = Array::<f32>::new(r);
    let mut computed = 0.0f32;
    let blocks = tq.div_ceil(tile);
    for g in 0..group {
        let h = hk * group + g;
        for qb in 0..blocks {
            let i = qb * tile + unit;
            if i < tq {
                let q_at = row_offset(q, b, h, i);
                let do_at = row_offset(d_out, b, h, i);
                #[unroll]
                for c4 in 0..d4 {
                    s_q[unit * d4 + c4] = read4(q, q_at, c4, 1.0f32, d);
                    s_do[unit * d4 + c4] = read4(d_out, do_at, c4, 1.0f32, d);
                }
                s_lse[unit] = lse[b * lse.stride(0) + h * lse.stride(1) + i * lse.stride(2)];
                s_delta[unit] =
                    delta[b * delta.stride(0) + h * delta.stride(1) + i * delta.stride(2)];
                s_lo[unit] = q_lo[i * q_lo.stride(0)];
                s_hi[unit] = q_hi[i * q_hi.stride(0)];
            }
            sync_cube();
            let rows = min(tile, tq - qb * tile);
            let covered = cover(&window_bounds(&s_lo, &s_hi, rows, neg_inf), &span);
            if covered != 0u32 {
                computed += 1.0;
                for ii in 0..rows {
                    #[unroll]
                    for t in 0..r {
                        score[t] = V4::new(0.0);
                        dp[t] = V4::new(0.0);
                    }
                    #[unroll]
                    for c4 in 0..d4 {
                        let query = s_q[ii * d4 + c4];
                        let grad = s_do[ii * d4 + c4];
                        #[unroll]
                        for t in 0..r {
                            score[t] += query * k_row[t * d4 + c4];
                            dp[t] += grad * v_row[t * d4 + c4];
                        }
                    }
                    let (row_lo, row_hi) = (s_lo[ii], s_hi[ii]);
                    let (row_lse, row_delta) = (s_lse[ii], s_delta[ii]);
                    #[unroll]
                    for t in 0..r {
                        let seen = covered == 2u32 || (pos[t] >= row_lo && pos[t] <= row_hi);
                        let (s, through_cap) = capped_score(sum4(score[t]), cap, capped);
                        let p_row = select(seen, (s - row_lse).exp(), 0.0f32);
                        // dS takes P in f32; P and dS enter their products in the operands' type.
                        let ds_row = p_row * (sum4(dp[t]) - row_delta) * through_cap;
                        ds[t] = to_bf16(ds_row, bf16) * scale;
                        p[t] = to_bf16(p_row, bf16);
                    }
                    #[unroll]
                    for c4 in 0..d4 {
                        let query = s_q[ii * d4 + c4];
                        let grad = s_do[ii * d4 + c4];
                        #[unroll]
                        for t in 0..r {
                            dv_acc[t * d4 + c4] += grad * V4::new(p[t]);
                            dk_acc[t * d4 + c4] += query * V4::new(ds[t]);
                        }
                    }
                }
            }
            sync_cube();
        }
    }
    #[unroll]
    for t in 0..r {
        let j = base + t * tile + unit;
        if j < tk {
            let dk_at = row_offset(dk, b, hk, j);
            let dv_at = row_offset(dv, b, hk, j);
            #[unroll]
            for c4 in 0..d4 {
                write4(dk, dk_at, c4, dk_acc[t * d4 + c4], d);
                write4(dv, dv_at, c4, dv_acc[t * d4 + c4], d);
            }
        }
    }
    if unit == 0 {
        work[(b * CUBE_COUNT_Y as usize + hk) * CUBE_COUNT_X as usize + block] = computed;
    }
}

/// dQ of one block of queries against every key of the tile. Cubes: (query blocks of `tile · r`
/// rows, heads, batch); unit `u` owns rows `u, u + tile, …` of its block.
#[allow(clippy::too_many_arguments)]
#[cube(launch_unchecked)]
pub fn backward_dq(
    q: &Tensor<f32>,
    k: &Tensor<f32>,
    v: &Tensor<f32>,
    d_out: &Tensor<f32>,
    lse: &Tensor<f32>,
    delta: &Tensor<f32>,
    q_lo: &Tensor<f32>,
    q_hi: &Tensor<f32>,
    k_pos: &Tensor<f32>,
    dq: &mut Tensor<f32>,
    work: &mut Tensor<f32>,
    scale: f32,
    cap: f32,
    neg_inf: f32,
    #[comptime] tile: usize,
    #[comptime] r: usize,
    #[comptime] d: usize,
    #[comptime] capped: bool,
    #[comptime] bf16: bool,
) {
    let d4 = comptime!(d.div_ceil(4));
    let unit = UNIT_POS_X as usize;
    let block = CUBE_POS_X as usize;
    let h = CUBE_POS_Y as usize;
    let b = CUBE_POS_Z as usize;
    let tq = q.shape(2);
    let tk = k.shape(2);
    let hk = h / (q.shape(1) / k.shape(1));
    let base = block * tile * r;
    let rows = min(tile * r, tq - base);

    let mut s_lo = SharedMemory::<f32>::new(tile * r);
    let mut s_hi = SharedMemory::<f32>::new(tile * r);
    let mut lo = Array::<f32>::new(r);
    let mut hi = Array::<f32>::new(r);
    let mut row_lse = Array::<f32>::new(r);
    let mut row_delta = Array::<f32>::new(r);
    let mut q_row = Array::<V4>::new(r * d4);
    let mut do_row = Array::<V4>::new(r * d4);
    let mut dq_acc = Array::<V4>::new(r * d4);
    load_windows(
        q_lo, q_hi, &mut s_lo, &mut s_hi, &mut lo, &mut hi, base, unit, tq, tile, r,
    );
    #[unroll]
    for t in 0..r {
        let row = min(base + t * tile + unit, tq - 1);
        let q_at = row_offset(q, b, h, row);
        let do_at = row_offset(d_out, b, h, row);
        #[unroll]
        for c4 in 0..d4 {
            q_row[t * d4 + c4] = read4(q, q_at, c4, scale, d);
            do_row[t * d4 + c4] = read4(d_out, do_at, c4, 1.0f32, d);
            dq_acc[t * d4 + c4] = V4::new(0.0);
        }
        row_lse[t] = lse[b * lse.stride(0) + h * lse.stride(1) + row * lse.stride(2)];
        row_delta[t] = delta[b * delta.stride(0) + h * delta.stride(1) + row * delta.stride(2)];
    }
    sync_cube();
    let bounds = window_bounds(&s_lo, &s_hi, rows, neg_inf);

    let mut s_pos = SharedMemory::<f32>::new(tile);
    let mut s_k = SharedMemory::<V4>::new(tile * d4);
    let mut s_v = SharedMemory::<V4>::new(tile * d4);
    let mut score = Array::<V4>::new(r);
    let mut dp = Array::<V4>::new(r);
    let mut ds = Array::<f32>::new(r);
    let mut computed = 0.0f32;
    let blocks = tk.div_ceil(tile);
    for kb in 0..blocks {
        let keys = stage_keys(
            k, v, k_pos, &mut s_pos, &mut s_k, &mut s_v, b, hk, kb, unit, tile, d,
        );
        sync_cube();
        let covered = cover(&bounds, &key_span(&s_pos, keys, neg_inf));
        if covered != 0u32 {
            computed += 1.0;
            for jj in 0..keys {
                #[unroll]
                for t in 0..r {
                    score[t] = V4::new(0.0);
                    dp[t] = V4::new(0.0);
                }
                #[unroll]
                for c4 in 0..d4 {
                    let key = s_k[jj * d4 + c4];
                    let value = s_v[jj * d4 + c4];
                    #[unroll]
                    for t in 0..r {
                        score[t] += q_row[t * d4 + c4] * key;
                        dp[t] += do_row[t * d4 + c4] * value;
                    }
                }
                let pos = s_pos[jj];
                #[unroll]
                for t in 0..r {
                    let seen = covered == 2u32 || (pos >= lo[t] && pos <= hi[t]);
                    let (s, through_cap) = capped_score(sum4(score[t]), cap, capped);
                    let p = select(seen, (s - row_lse[t]).exp(), 0.0f32);
                    ds[t] = to_bf16(p * (sum4(dp[t]) - row_delta[t]) * through_cap, bf16) * scale;
                }
                #[unroll]
                for c4 in 0..d4 {
                    let key = s_k[jj * d4 + c4];
                    #[unroll]
                    for t in 0..r {
                        dq_acc[t * d4 + c4] += key * V4::new(ds[t]);
                    }
                }
            }
        }
        sync_cube();
    }
    #[unroll]
    for t in 0..r {
        let i = base + t * tile + unit;
        if i < tq {
            let dq_at = row_offset(dq, b, h, i);
            #[unroll]
            for c4 in 0..d4 {
                write4(dq, dq_at, c4, dq_acc[t * d4 + c4], d);
            }
        }
    }
    if unit == 0 {
        work[(b * CUBE_COUNT_Y as usize + h) * CUBE_COUNT_X as usize + block] = computed;
    }
}
