//! The fused tile kernels in CubeCL: forward with an online softmax over key sub-tiles held in
//! shared memory, and the FlashAttention-2 backward as two kernels (dK and dV for a block of keys,
//! dQ for a block of queries), so that no two cubes write the same row and nothing is atomic.
//!
//! One cube is `tile` units, each owning one row (a query row forward and for dQ, a key row for dK
//! and dV); the other side streams through shared memory `tile` rows at a time. Masks come from each
//! query's window `[lo, hi]` of key positions and each key's position (f32, exact below 2^24): a
//! sub-tile that no row of the cube sees is skipped (each cube counts the sub-tiles it computed, in
//! `work`), and one that every row sees whole checks no position. Query head `h` reads kv head
//! `h / (heads / kv_heads)`. Everything accumulates in f32.
//!
//! −∞ arrives as the runtime argument `neg_inf` (WGSL has no infinity literal): a row that saw no
//! key gets output 0 and lse −∞, as every kernel's.
//!
//! Shapes (any strides): q, out, dO, dq `[b, h, tq, d]`; k, v, dk, dv `[b, hk, tk, d]`; lse, δ
//! `[b, h, tq]`; windows `[tq]`; key positions `[tk]`.

use cubecl::prelude::*;

/// The offset of row `i`, column 0, of head `h` in batch `b` of a `[b, h, t, d]` tensor.
#[cube]
fn row_offset(t: &Tensor<f32>, b: usize, h: usize, i: usize) -> usize {
    b * t.stride(0) + h * t.stride(1) + i * t.stride(2)
}

/// A score `s` through the soft cap `C · tanh(s / C)` when there is one.
#[cube]
fn capped_score(s: f32, cap: f32, #[comptime] capped: bool) -> f32 {
    if capped { cap * (s / cap).tanh() } else { s }
}

/// The forward of one tile folded into the running `(out_prev, lse_prev)`: writes the merged
/// `(out, lse)`. Cubes: (query blocks, heads, batch).
#[allow(clippy::too_many_arguments)]
#[cube(launch)]
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
    #[comptime] d: usize,
    #[comptime] capped: bool,
) {
    let unit = UNIT_POS_X as usize;
    let block = CUBE_POS_X as usize;
    let h = CUBE_POS_Y as usize;
    let b = CUBE_POS_Z as usize;
    let tq = q.shape(2);
    let tk = k.shape(2);
    let hk = h / (q.shape(1) / k.shape(1));
    let i = block * tile + unit;
    let row_ok = i < tq;
    let rows = min(tile, tq - block * tile);

    // This row's window, and the cube's: what any row sees and what every row does.
    let mut s_lo = SharedMemory::<f32>::new(tile);
    let mut s_hi = SharedMemory::<f32>::new(tile);
    let mut lo = 0.0f32;
    let mut hi = f32::new(-1.0);
    if row_ok {
        lo = q_lo[i * q_lo.stride(0)];
        hi = q_hi[i * q_hi.stride(0)];
    }
    s_lo[unit] = lo;
    s_hi[unit] = hi;

    let mut q_row = Array::<f32>::new(d);
    let mut acc = Array::<f32>::new(d);
    let q_at = row_offset(q, b, h, min(i, tq - 1));
    for c in 0..d {
        q_row[c] = q[q_at + c * q.stride(3)] * scale;
        acc[c] = 0.0f32;
    }
    sync_cube();
    let bounds = window_bounds(&s_lo, &s_hi, rows, neg_inf);

    let mut s_pos = SharedMemory::<f32>::new(tile);
    let mut s_k = SharedMemory::<f32>::new(tile * d);
    let mut s_v = SharedMemory::<f32>::new(tile * d);
    let mut scores = Array::<f32>::new(tile);
    let mut m = neg_inf;
    let mut l = 0.0f32;
    let mut computed = 0.0f32;
    let blocks = tk.div_ceil(tile);
    for kb in 0..blocks {
        let j = kb * tile + unit;
        if j < tk {
            s_pos[unit] = k_pos[j * k_pos.stride(0)];
            let k_at = row_offset(k, b, hk, j);
            let v_at = row_offset(v, b, hk, j);
            for c in 0..d {
                s_k[unit * d + c] = k[k_at + c * k.stride(3)];
                s_v[unit * d + c] = v[v_at + c * v.stride(3)];
            }
        }
        sync_cube();
        let keys = min(tile, tk - kb * tile);
        let mut k_min = -neg_inf;
        let mut k_max = neg_inf;
        for jj in 0..keys {
            k_min = min(k_min, s_pos[jj]);
            k_max = max(k_max, s_pos[jj]);
        }
        let empty = k_max < bounds[0] || k_min > bounds[3];
        let full = k_min >= bounds[1] && k_max <= bounds[2];
        if !empty {
            computed += 1.0;
            let mut tile_max = neg_inf;
            for jj in 0..keys {
                let mut s = 0.0f32;
                for c in 0..d {
                    s += q_row[c] * s_k[jj * d + c];
                }
                s = capped_score(s, cap, capped);
                let pos = s_pos[jj];
                if !full && (pos < lo || pos > hi) {
                    s = neg_inf;
                }
                scores[jj] = s;
                tile_max = max(tile_max, s);
            }
            if tile_max > neg_inf {
                let m_new = max(m, tile_max);
                let correction = (m - m_new).exp();
                l *= correction;
                for c in 0..d {
                    acc[c] *= correction;
                }
                for jj in 0..keys {
                    let p = (scores[jj] - m_new).exp();
                    l += p;
                    for c in 0..d {
                        acc[c] += p * s_v[jj * d + c];
                    }
                }
                m = m_new;
            }
        }
        sync_cube();
    }

    if row_ok {
        // This tile's (normalized output, lse), merged with the previous ones in f32.
        let mut lse_tile = neg_inf;
        let mut inv = 0.0f32;
        if l > 0.0 {
            lse_tile = m + l.ln();
            inv = 1.0f32 / l;
        }
        let lse_at = b * lse_prev.stride(0) + h * lse_prev.stride(1) + i * lse_prev.stride(2);
        let lse_before = lse_prev[lse_at];
        let top = max(lse_before, lse_tile);
        let prev_at = row_offset(out_prev, b, h, i);
        let out_at = row_offset(out, b, h, i);
        let lse_out = b * lse.stride(0) + h * lse.stride(1) + i * lse.stride(2);
        if top == neg_inf {
            lse[lse_out] = neg_inf;
            for c in 0..d {
                out[out_at + c * out.stride(3)] = 0.0f32;
            }
        } else {
            let w_before = (lse_before - top).exp();
            let w_tile = (lse_tile - top).exp();
            let total = w_before + w_tile;
            lse[lse_out] = top + total.ln();
            for c in 0..d {
                let before = out_prev[prev_at + c * out_prev.stride(3)];
                out[out_at + c * out.stride(3)] =
                    (before * w_before + acc[c] * inv * w_tile) / total;
            }
        }
    }
    if unit == 0 {
        work[(b * CUBE_COUNT_Y as usize + h) * CUBE_COUNT_X as usize + block] = computed;
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

/// dK and dV of one block of keys against every query of their group's heads. Cubes: (key blocks,
/// kv heads, batch).
#[allow(clippy::too_many_arguments)]
#[cube(launch)]
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
    #[comptime] d: usize,
    #[comptime] capped: bool,
) {
    let unit = UNIT_POS_X as usize;
    let block = CUBE_POS_X as usize;
    let hk = CUBE_POS_Y as usize;
    let b = CUBE_POS_Z as usize;
    let tq = q.shape(2);
    let tk = k.shape(2);
    let group = q.shape(1) / k.shape(1);
    let j = block * tile + unit;
    let key_ok = j < tk;
    let keys = min(tile, tk - block * tile);

    let mut s_pos = SharedMemory::<f32>::new(tile);
    let mut pos = f32::new(-1.0);
    if key_ok {
        pos = k_pos[j * k_pos.stride(0)];
    }
    s_pos[unit] = pos;
    let mut k_row = Array::<f32>::new(d);
    let mut v_row = Array::<f32>::new(d);
    let mut dk_acc = Array::<f32>::new(d);
    let mut dv_acc = Array::<f32>::new(d);
    let k_at = row_offset(k, b, hk, min(j, tk - 1));
    let v_at = row_offset(v, b, hk, min(j, tk - 1));
    for c in 0..d {
        k_row[c] = k[k_at + c * k.stride(3)];
        v_row[c] = v[v_at + c * v.stride(3)];
        dk_acc[c] = 0.0f32;
        dv_acc[c] = 0.0f32;
    }
    sync_cube();
    let mut k_min = -neg_inf;
    let mut k_max = neg_inf;
    for jj in 0..keys {
        k_min = min(k_min, s_pos[jj]);
        k_max = max(k_max, s_pos[jj]);
    }

    let mut s_q = SharedMemory::<f32>::new(tile * d);
    let mut s_do = SharedMemory::<f32>::new(tile * d);
    let mut s_lse = SharedMemory::<f32>::new(tile);
    let mut s_delta = SharedMemory::<f32>::new(tile);
    let mut s_lo = SharedMemory::<f32>::new(tile);
    let mut s_hi = SharedMemory::<f32>::new(tile);
    let mut computed = 0.0f32;
    let blocks = tq.div_ceil(tile);
    for g in 0..group {
        let h = hk * group + g;
        for qb in 0..blocks {
            let i = qb * tile + unit;
            if i < tq {
                let q_at = row_offset(q, b, h, i);
                let do_at = row_offset(d_out, b, h, i);
                for c in 0..d {
                    s_q[unit * d + c] = q[q_at + c * q.stride(3)];
                    s_do[unit * d + c] = d_out[do_at + c * d_out.stride(3)];
                }
                s_lse[unit] = lse[b * lse.stride(0) + h * lse.stride(1) + i * lse.stride(2)];
                s_delta[unit] =
                    delta[b * delta.stride(0) + h * delta.stride(1) + i * delta.stride(2)];
                s_lo[unit] = q_lo[i * q_lo.stride(0)];
                s_hi[unit] = q_hi[i * q_hi.stride(0)];
            }
            sync_cube();
            let rows = min(tile, tq - qb * tile);
            let bounds = window_bounds(&s_lo, &s_hi, rows, neg_inf);
            let empty = k_max < bounds[0] || k_min > bounds[3];
            let full = k_min >= bounds[1] && k_max <= bounds[2];
            if !empty {
                computed += 1.0;
                for ii in 0..rows {
                    if full || (pos >= s_lo[ii] && pos <= s_hi[ii]) {
                        let mut s = 0.0f32;
                        let mut dp = 0.0f32;
                        for c in 0..d {
                            s += s_q[ii * d + c] * k_row[c];
                            dp += s_do[ii * d + c] * v_row[c];
                        }
                        s *= scale;
                        let mut through_cap = 1.0f32;
                        if capped {
                            let t = (s / cap).tanh();
                            s = cap * t;
                            through_cap = 1.0f32 - t * t;
                        }
                        let p = (s - s_lse[ii]).exp();
                        let ds = p * (dp - s_delta[ii]) * through_cap * scale;
                        for c in 0..d {
                            dv_acc[c] += p * s_do[ii * d + c];
                            dk_acc[c] += ds * s_q[ii * d + c];
                        }
                    }
                }
            }
            sync_cube();
        }
    }
    if key_ok {
        let dk_at = row_offset(dk, b, hk, j);
        let dv_at = row_offset(dv, b, hk, j);
        for c in 0..d {
            dk[dk_at + c * dk.stride(3)] = dk_acc[c];
            dv[dv_at + c * dv.stride(3)] = dv_acc[c];
        }
    }
    if unit == 0 {
        work[(b * CUBE_COUNT_Y as usize + hk) * CUBE_COUNT_X as usize + block] = computed;
    }
}

/// dQ of one block of queries against every key of the tile. Cubes: (query blocks, heads, batch).
#[allow(clippy::too_many_arguments)]
#[cube(launch)]
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
    #[comptime] d: usize,
    #[comptime] capped: bool,
) {
    let unit = UNIT_POS_X as usize;
    let block = CUBE_POS_X as usize;
    let h = CUBE_POS_Y as usize;
    let b = CUBE_POS_Z as usize;
    let tq = q.shape(2);
    let tk = k.shape(2);
    let hk = h / (q.shape(1) / k.shape(1));
    let i = block * tile + unit;
    let row_ok = i < tq;
    let rows = min(tile, tq - block * tile);
    let row = min(i, tq - 1);

    let mut s_lo = SharedMemory::<f32>::new(tile);
    let mut s_hi = SharedMemory::<f32>::new(tile);
    let mut lo = 0.0f32;
    let mut hi = f32::new(-1.0);
    if row_ok {
        lo = q_lo[i * q_lo.stride(0)];
        hi = q_hi[i * q_hi.stride(0)];
    }
    s_lo[unit] = lo;
    s_hi[unit] = hi;
    let mut q_row = Array::<f32>::new(d);
    let mut do_row = Array::<f32>::new(d);
    let mut dq_acc = Array::<f32>::new(d);
    let q_at = row_offset(q, b, h, row);
    let do_at = row_offset(d_out, b, h, row);
    for c in 0..d {
        q_row[c] = q[q_at + c * q.stride(3)];
        do_row[c] = d_out[do_at + c * d_out.stride(3)];
        dq_acc[c] = 0.0f32;
    }
    let row_lse = lse[b * lse.stride(0) + h * lse.stride(1) + row * lse.stride(2)];
    let row_delta = delta[b * delta.stride(0) + h * delta.stride(1) + row * delta.stride(2)];
    sync_cube();
    let bounds = window_bounds(&s_lo, &s_hi, rows, neg_inf);

    let mut s_pos = SharedMemory::<f32>::new(tile);
    let mut s_k = SharedMemory::<f32>::new(tile * d);
    let mut s_v = SharedMemory::<f32>::new(tile * d);
    let mut computed = 0.0f32;
    let blocks = tk.div_ceil(tile);
    for kb in 0..blocks {
        let j = kb * tile + unit;
        if j < tk {
            s_pos[unit] = k_pos[j * k_pos.stride(0)];
            let k_at = row_offset(k, b, hk, j);
            let v_at = row_offset(v, b, hk, j);
            for c in 0..d {
                s_k[unit * d + c] = k[k_at + c * k.stride(3)];
                s_v[unit * d + c] = v[v_at + c * v.stride(3)];
            }
        }
        sync_cube();
        let keys = min(tile, tk - kb * tile);
        let mut k_min = -neg_inf;
        let mut k_max = neg_inf;
        for jj in 0..keys {
            k_min = min(k_min, s_pos[jj]);
            k_max = max(k_max, s_pos[jj]);
        }
        let empty = k_max < bounds[0] || k_min > bounds[3];
        let full = k_min >= bounds[1] && k_max <= bounds[2];
        if !empty {
            computed += 1.0;
            for jj in 0..keys {
                let pos = s_pos[jj];
                if full || (pos >= lo && pos <= hi) {
                    let mut s = 0.0f32;
                    let mut dp = 0.0f32;
                    for c in 0..d {
                        s += q_row[c] * s_k[jj * d + c];
                        dp += do_row[c] * s_v[jj * d + c];
                    }
                    s *= scale;
                    let mut through_cap = 1.0f32;
                    if capped {
                        let t = (s / cap).tanh();
                        s = cap * t;
                        through_cap = 1.0f32 - t * t;
                    }
                    let p = (s - row_lse).exp();
                    let ds = p * (dp - row_delta) * through_cap * scale;
                    for c in 0..d {
                        dq_acc[c] += ds * s_k[jj * d + c];
                    }
                }
            }
        }
        sync_cube();
    }
    if row_ok {
        let dq_at = row_offset(dq, b, h, i);
        for c in 0..d {
            dq[dq_at + c * dq.stride(3)] = dq_acc[c];
        }
    }
    if unit == 0 {
        work[(b * CUBE_COUNT_Y as usize + h) * CUBE_COUNT_X as usize + block] = computed;
    }
}
