//! The ggml tensor types ringbench dequantizes, their block geometry, and each type's dequantization
//! to f32: blocks of 32 values (Q8_0, Q4_0, Q4_1) or super-blocks of 256 (the K-quants Q4_K, Q5_K,
//! Q6_K), each with its f16 scales, as llama.cpp lays them out.

use half::{bf16, f16};

/// A ggml tensor type this reader dequantizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    /// 4-byte floats.
    F32,
    /// IEEE half floats.
    F16,
    /// bfloat16.
    Bf16,
    /// 32 values: an f16 scale `d`, 32 signed bytes; `x = d·q`.
    Q8_0,
    /// 32 values: an f16 `d`, 16 bytes of 4-bit `q`; `x = d·(q − 8)`.
    Q4_0,
    /// 32 values: f16 `d` and `m`, 16 bytes of 4-bit `q`; `x = d·q + m`.
    Q4_1,
    /// 256 values in 8 groups of 32: f16 `d`, `dmin`, 12 bytes of 6-bit group scales and mins, 128
    /// bytes of 4-bit `q`; `x = d·scale·q − dmin·min`.
    Q4K,
    /// As Q4_K, with a fifth bit of each `q` in 32 more bytes.
    Q5K,
    /// 256 values in 16 groups of 16: 128 bytes of low 4 bits, 64 of high 2 bits, 16 signed 8-bit
    /// group scales, an f16 `d`; `x = d·scale·(q − 32)`.
    Q6K,
}

/// The names of the types above, for a refusal.
pub(crate) const KNOWN: &str = "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K";

impl GgmlType {
    /// The type of ggml id `id`, if this reader dequantizes it.
    pub fn of_id(id: u32) -> Option<GgmlType> {
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            8 => GgmlType::Q8_0,
            12 => GgmlType::Q4K,
            13 => GgmlType::Q5K,
            14 => GgmlType::Q6K,
            30 => GgmlType::Bf16,
            _ => return None,
        })
    }

    /// The format's name of ggml type id `id` (including the types not read here), for messages.
    pub fn name_of_id(id: u32) -> &'static str {
        const NAMES: [&str; 31] = [
            "F32", "F16", "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K",
            "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S",
            "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16", "I32", "I64", "F64", "IQ1_M",
            "BF16",
        ];
        NAMES.get(id as usize).copied().unwrap_or("unknown")
    }

    /// Values a block holds.
    pub fn block_values(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16 => 1,
            GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q4_1 => 32,
            GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K => 256,
        }
    }

    /// Bytes a block takes.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::Bf16 => 2,
            GgmlType::Q8_0 => 2 + 32,
            GgmlType::Q4_0 => 2 + 16,
            GgmlType::Q4_1 => 4 + 16,
            GgmlType::Q4K => 4 + 12 + 128,
            GgmlType::Q5K => 4 + 12 + 32 + 128,
            GgmlType::Q6K => 128 + 64 + 16 + 2,
        }
    }

    /// `bytes` (whole blocks) dequantized, in order.
    pub(crate) fn dequantize(self, bytes: &[u8]) -> Vec<f32> {
        debug_assert_eq!(bytes.len() % self.block_bytes(), 0);
        let blocks = bytes.chunks_exact(self.block_bytes());
        let mut out = Vec::with_capacity(bytes.len() / self.block_bytes() * self.block_values());
        match self {
            GgmlType::F32 => {
                out.extend(blocks.map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
            }
            GgmlType::F16 => out.extend(blocks.map(half16)),
            GgmlType::Bf16 => {
                out.extend(blocks.map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()))
            }
            GgmlType::Q8_0 => blocks.for_each(|b| q8_0(b, &mut out)),
            GgmlType::Q4_0 => blocks.for_each(|b| q4_0(b, &mut out)),
            GgmlType::Q4_1 => blocks.for_each(|b| q4_1(b, &mut out)),
            GgmlType::Q4K => blocks.for_each(|b| q4_k(b, &mut out)),
            GgmlType::Q5K => blocks.for_each(|b| q5_k(b, &mut out)),
            GgmlType::Q6K => blocks.for_each(|b| q6_k(b, &mut out)),
        }
        out
    }
}

/// The f16 at the start of `b`, as f32.
fn half16(b: &[u8]) -> f32 {
    f16::from_le_bytes([b[0], b[1]]).to_f32()
}

fn q8_0(b: &[u8], out: &mut Vec<f32>) {
    let d = half16(b);
    out.extend(b[2..34].iter().map(|&q| d * f32::from(q as i8)));
}

fn q4_0(b: &[u8], out: &mut Vec<f32>) {
    let d = half16(b);
    let qs = &b[2..18];
    // The low nibbles are values 0..16, the high ones 16..32.
    out.extend(qs.iter().map(|&q| d * (f32::from(q & 0x0F) - 8.0)));
    out.extend(qs.iter().map(|&q| d * (f32::from(q >> 4) - 8.0)));
}

fn q4_1(b: &[u8], out: &mut Vec<f32>) {
    let (d, m) = (half16(b), half16(&b[2..]));
    let qs = &b[4..20];
    out.extend(qs.iter().map(|&q| d * f32::from(q & 0x0F) + m));
    out.extend(qs.iter().map(|&q| d * f32::from(q >> 4) + m));
}

/// Group `j`'s 6-bit scale and min of a K-quant's 12 packed bytes: groups 0..4 in the low 6 bits of
/// bytes j and j + 4; groups 4..8 in the nibbles of bytes j + 4, their top 2 bits in the top bits of
/// bytes j − 4 and j.
fn scale_min(j: usize, s: &[u8]) -> (f32, f32) {
    let (scale, min) = if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    };
    (f32::from(scale), f32::from(min))
}

fn q4_k(b: &[u8], out: &mut Vec<f32>) {
    let (d, dmin) = (half16(b), half16(&b[2..]));
    let (scales, qs) = (&b[4..16], &b[16..144]);
    // Four runs of 64 values: 32 low nibbles (group 2i), then the same bytes' high nibbles (2i + 1).
    for (i, q) in qs.chunks_exact(32).enumerate() {
        let (s1, m1) = scale_min(2 * i, scales);
        let (s2, m2) = scale_min(2 * i + 1, scales);
        out.extend(q.iter().map(|&q| d * s1 * f32::from(q & 0x0F) - dmin * m1));
        out.extend(q.iter().map(|&q| d * s2 * f32::from(q >> 4) - dmin * m2));
    }
}

fn q5_k(b: &[u8], out: &mut Vec<f32>) {
    let (d, dmin) = (half16(b), half16(&b[2..]));
    let (scales, qh, qs) = (&b[4..16], &b[16..48], &b[48..176]);
    // As Q4_K; group g's fifth bits are bit g of the 32 `qh` bytes.
    for (i, q) in qs.chunks_exact(32).enumerate() {
        let (s1, m1) = scale_min(2 * i, scales);
        let (s2, m2) = scale_min(2 * i + 1, scales);
        let (bit1, bit2) = (1u8 << (2 * i), 1u8 << (2 * i + 1));
        let high = |h: u8, bit: u8| if h & bit != 0 { 16.0 } else { 0.0 };
        out.extend(
            q.iter()
                .zip(qh)
                .map(|(&q, &h)| d * s1 * (f32::from(q & 0x0F) + high(h, bit1)) - dmin * m1),
        );
        out.extend(
            q.iter()
                .zip(qh)
                .map(|(&q, &h)| d * s2 * (f32::from(q >> 4) + high(h, bit2)) - dmin * m2),
        );
    }
}

fn q6_k(b: &[u8], out: &mut Vec<f32>) {
    let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = half16(&b[208..]);
    let start = out.len();
    out.resize(start + 256, 0.0);
    let y = &mut out[start..];
    // Two halves of 128 values; in each, value l of the four runs of 32 takes its low 4 bits from a
    // nibble of ql and its high 2 bits from a bit pair of qh[l].
    for half in 0..2 {
        let (ql, qh, sc) = (&ql[64 * half..], &qh[32 * half..], &scales[8 * half..]);
        let y = &mut y[128 * half..];
        for l in 0..32 {
            let group = l / 16;
            let q =
                |low: u8, shift: u32| f32::from(((low | (((qh[l] >> shift) & 3) << 4)) as i8) - 32);
            let scale = |k: usize| d * f32::from(sc[group + k] as i8);
            y[l] = scale(0) * q(ql[l] & 0x0F, 0);
            y[l + 32] = scale(2) * q(ql[l + 32] & 0x0F, 2);
            y[l + 64] = scale(4) * q(ql[l] >> 4, 4);
            y[l + 96] = scale(6) * q(ql[l + 32] >> 4, 6);
        }
    }
}
