//! Decoding over a sharded KV cache against the float64 reference: a prefill's shards and one
//! decoded token a step, each attended to every rank's cached keys and merged; every decoded
//! position's output against the reference attention of the whole sequence, over strategies ×
//! kernels × ranks × merges × directions × heads × documents × windows × caps × sinks as a pairwise
//! covering design. Also: the merges' own counters (messages, bytes independent of the context's
//! length, visible pairs), the same bits on every rank, and a rank that fails in a decode step.

use burn::backend::Flex;
use burn::tensor::{Tensor, TensorData};
use ringbench_tests::covering::{missing_pairs, pairwise};
use ringbench_tests::{
    BATCH, Case, F32_ATTENTION, HEAD_DIM, Variant, case_variant, deviation, worst,
};
use std::sync::Arc;
use std::time::Duration;
use strategies::{by_name, names, padded_len};
use workbench::error::all_or_root_cause;
use workbench::host;
use workbench::ring::cache::KvCache;
use workbench::ring::context::Sequence;
use workbench::ring::decode::{DecodeMerge, attend_cached};
use workbench::transport::{Phase, Strike, run_ranks};
use workbench::{Direction, Kernel, RingConfig, RingContext, RingError, StepEvent};

type B = Flex;

/// Each decoded output against the reference, relative to the output's scale: a decoded token's
/// output sums at most a 48-key sequence in one chain (within one sub-tile) and merges one partial
/// per rank's part (at most 8 ranks × 2 parts) and the sinks: the chain [`F32_ATTENTION`] derives
/// for tiles of 128 keys and 8 + 8 merges bounds it.
const TOLERANCE: f64 = F32_ATTENTION;

const RANKS: [usize; 5] = [1, 2, 3, 4, 8];

/// How one decoding of a case runs.
#[derive(Debug, Clone)]
struct Run {
    strategy: &'static str,
    ranks: usize,
    merge: DecodeMerge,
    config: RingConfig,
    /// Each batch row's prompt length: the rest of the case's sequence is decoded a token a step.
    prompts: [usize; BATCH],
    /// A rank that fails at its `step`-th decode exchange.
    fault: Option<(usize, usize)>,
}

/// What one rank computed and counted.
struct Decoded {
    /// `out[row][t]`: the output `[heads · head_dim]` of row's decoded token `t` (position
    /// `prompts[row] + t`).
    out: [Vec<Vec<f32>>; BATCH],
    events: Vec<StepEvent>,
    decode_exchanges: usize,
    decode_bytes: u64,
    /// Keys each rank held of each row at the end.
    counts: Vec<Vec<usize>>,
}

/// `[1, heads, t, d]` of batch row `b` of `x` (`[batch, seq, heads, d]`) at `positions`; a position
/// past `real` (padding) reads NaN, which a cache that kept it would spread into every output.
fn gather(
    x: &workbench::ring::jobs::HostTensor,
    b: usize,
    positions: &[usize],
    real: usize,
) -> Tensor<B, 4> {
    let [_, seq, heads, d] = x.shape[..] else {
        unreachable!("a case's tensors have four axes")
    };
    let mut data = Vec::with_capacity(heads * positions.len() * d);
    for h in 0..heads {
        for &p in positions {
            if p < real {
                let at = ((b * seq + p) * heads + h) * d;
                data.extend_from_slice(&x.data[at..at + d]);
            } else {
                data.extend(std::iter::repeat_n(f32::NAN, d));
            }
        }
    }
    Tensor::from_data(
        TensorData::new(data, [1, heads, positions.len(), d]),
        &Default::default(),
    )
}

/// The documents of a row's first `len` tokens: the case's, cut at `len`.
fn docs_of(doc_lens: &[usize], len: usize) -> Vec<usize> {
    let mut left = len;
    doc_lens
        .iter()
        .map_while(|&n| {
            let take = n.min(left);
            left -= take;
            (take > 0).then_some(take)
        })
        .collect()
}

/// Decodes `c` as `run` says, on every rank: each row's prompt prefilled into the cache from its own
/// layout, then a token a step for the rows still short of the case's length.
fn decode(c: &Case, run: &Run) -> Result<Vec<Decoded>, RingError> {
    let seq = c.q.shape[1];
    let heads = c.q.shape[2];
    let partition = by_name(run.strategy)?;
    let world = run.ranks;
    let layouts = run.prompts.map(|p| -> Result<_, RingError> {
        Ok(Arc::new(
            partition.layout(padded_len(partition, p, world)?, world)?,
        ))
    });
    let [l0, l1] = layouts;
    let layouts = [l0?, l1?];
    let sequences = run.prompts.map(|p| Sequence {
        len: p,
        doc_lens: docs_of(&c.doc_lens, p),
    });
    let attend = workbench::ring::context::Attend {
        causal: true,
        scale: None,
        window: c.variant.window,
        softcap: c.variant.softcap.map(|x| x as f32),
    };
    let sinks = c.variant.sinks.clone();
    let results = run_ranks(world, Duration::from_secs(5), |mut comm| {
        let rank = comm.rank();
        if let Some((_, step)) = run.fault.filter(|f| f.0 == rank) {
            comm.inject_fault(Phase::Decode, step, Strike::Error);
        }
        let ctx = Arc::new(
            RingContext::new(comm, layouts[0].clone(), run.config)?
                .with_sequence(sequences[0].clone())?,
        );
        let mut cache = KvCache::<B>::new(
            (rank, world),
            1,
            seq,
            run.config.kernel,
            run.config.precision,
        );
        for b in 0..BATCH {
            let row = cache.add_row(&layouts[b], sequences[b].clone())?;
            let positions = &layouts[b].positions[rank];
            let real = run.prompts[b];
            cache.insert_prefill(
                row,
                0,
                gather(&c.k, b, positions, real),
                gather(&c.v, b, positions, real),
            );
        }
        let mut out: [Vec<Vec<f32>>; BATCH] = Default::default();
        let sinks = sinks.as_ref().map(|s| {
            Tensor::<B, 1>::from_data(TensorData::new(s.clone(), [s.len()]), &Default::default())
        });
        for position in run.prompts.iter().copied().min().unwrap_or(seq)..seq {
            let rows: Vec<usize> = (0..BATCH).filter(|&b| run.prompts[b] <= position).collect();
            let mut queries = Vec::new();
            for &b in &rows {
                let (at, place) = cache.start_token(b)?;
                assert_eq!(at, position, "row {b}'s next position");
                cache.append(
                    b,
                    0,
                    place,
                    gather(&c.k, b, &[at], seq),
                    gather(&c.v, b, &[at], seq),
                );
                queries.push(gather(&c.q, b, &[at], seq));
            }
            let q = Tensor::cat(queries, 2);
            let got = attend_cached(
                &ctx,
                &cache,
                0,
                &rows,
                q,
                sinks.clone(),
                (attend, run.merge),
            )?;
            // [1, h, R, d] → per row [h · d].
            let got = host::read(got.swap_dims(1, 2));
            for (i, &b) in rows.iter().enumerate() {
                out[b].push(got[i * heads * HEAD_DIM..(i + 1) * heads * HEAD_DIM].to_vec());
            }
        }
        let traffic = ctx.traffic();
        Ok(Decoded {
            out,
            events: ctx.take_events(),
            decode_exchanges: traffic.exchanges.of(Phase::Decode),
            decode_bytes: traffic
                .sends
                .iter()
                .filter(|s| s.phase == Phase::Decode)
                .map(|s| s.bytes)
                .sum(),
            counts: (0..BATCH).map(|b| cache.counts(b).to_vec()).collect(),
        })
    });
    all_or_root_cause(results, RingError::echo_level)
}

/// The reference output `[heads · head_dim]` of batch row `b` at `position`.
fn want(c: &Case, b: usize, position: usize) -> &[f64] {
    let [_, seq, heads, d] = c.q.shape[..] else {
        unreachable!()
    };
    let at = (b * seq + position) * heads * d;
    &c.want.out[at..at + heads * d]
}

/// Visible (query, key) pairs of a decoded query at `i`, counted from the rules one by one.
fn visible_keys(c: &Case, i: usize) -> u64 {
    let doc = |p: usize| {
        let mut end = 0;
        c.doc_lens
            .iter()
            .position(|&n| {
                end += n;
                p < end
            })
            .unwrap_or(0)
    };
    (0..=i)
        .filter(|&j| doc(j) == doc(i) && c.variant.window.is_none_or(|w| i - j < w))
        .count() as u64
}

/// Every decoded output of every rank against the reference; the ranks' bits equal; the tiles'
/// own pair counts equal the visible pairs; each rank's merge messages as its collective makes them.
/// Returns the decoded tokens checked and their worst relative error.
fn check(c: &Case, run: &Run, label: &str) -> (usize, f64) {
    let ranks = decode(c, run).unwrap_or_else(|e| panic!("{label}: {e}"));
    let seq = c.q.shape[1];
    let heads = c.q.shape[2];
    let first = &ranks[0];
    let (mut checked, mut errors) = (0, Vec::new());
    for b in 0..BATCH {
        let prompt = run.prompts[b];
        assert_eq!(
            first.out[b].len(),
            seq - prompt,
            "{label}: row {b}'s decoded tokens"
        );
        for (t, got) in first.out[b].iter().enumerate() {
            let dev = deviation(got, want(c, b, prompt + t));
            assert!(
                dev.within(TOLERANCE),
                "{label}: row {b} position {}: {dev}",
                prompt + t
            );
            errors.push(dev.rel);
            checked += 1;
        }
        // Every rank returns the same tokens, each the same bits (lengths included: a zip would
        // stop at the shorter).
        let bits = |out: &[Vec<f32>]| -> Vec<Vec<u32>> {
            out.iter()
                .map(|t| t.iter().map(|x| x.to_bits()).collect())
                .collect()
        };
        for (r, other) in ranks.iter().enumerate().skip(1) {
            assert!(
                bits(&other.out[b]) == bits(&first.out[b]),
                "{label}: rank {r} decoded other bits than rank 0 (row {b})"
            );
        }
        assert_eq!(
            first.counts[b].iter().sum::<usize>(),
            seq,
            "{label}: row {b}'s keys"
        );
    }
    let pairs: u64 = ranks
        .iter()
        .flat_map(|r| &r.events)
        .filter(|e| e.phase == Phase::Decode)
        .map(|e| e.pairs)
        .sum();
    let want_pairs: u64 = (0..BATCH)
        .flat_map(|b| (run.prompts[b]..seq).map(move |i| (b, i)))
        .map(|(_, i)| visible_keys(c, i) * heads as u64)
        .sum();
    assert_eq!(pairs, want_pairs, "{label}: pairs the tiles attended");
    let steps = seq - run.prompts.iter().min().unwrap();
    let n = run.ranks;
    let per_step = match run.merge {
        DecodeMerge::AllGather => n - 1,
        DecodeMerge::Ring => 2 * (n - 1),
    };
    for (r, rank) in ranks.iter().enumerate() {
        assert_eq!(
            rank.decode_exchanges,
            steps * per_step,
            "{label}: rank {r}'s decode exchanges"
        );
    }
    (checked, worst(errors))
}

/// The decoding table: a pairwise covering design over every axis a decoded token's attention has.
/// Windows 5 (shorter than a shard: whole ranks' parts are skipped) and 20 (crossing documents);
/// a cap of 4; sinks of either sign; rows whose prompts differ in length, one decoding alone first.
#[test]
fn decoding_table() {
    let strategies = names();
    let windows = [None, Some(5), Some(20)];
    let softcaps = [None, Some(4.0)];
    let heads = [(4, 4), (8, 2)];
    let docs: [&[usize]; 2] = [&[], &[10, 20, 18]];
    let seqs = [48, 40];
    let levels = [
        strategies.len(),
        Kernel::ALL.len(),
        RANKS.len(),
        DecodeMerge::ALL.len(),
        Direction::ALL.len(),
        heads.len(),
        docs.len(),
        windows.len(),
        softcaps.len(),
        2, // sinks
        seqs.len(),
    ];
    let design = pairwise(&levels);
    assert!(missing_pairs(&levels, &design).is_empty());
    let (mut decoded, mut errors) = (0, Vec::new());
    for row in &design {
        let [st, kn, rk, mg, fw, hd, dc, wn, sc, sk, sq] = row[..] else {
            unreachable!("one value an axis")
        };
        // Packed documents fill 48 tokens: with them the case is 48 long.
        let seq = if dc == 1 { 48 } else { seqs[sq] };
        let h = heads[hd].0;
        let variant = Variant {
            window: windows[wn],
            softcap: softcaps[sc],
            sinks: (sk == 1).then(|| (0..h).map(|i| i as f32 * 0.75 - 1.5).collect()),
        };
        let c = case_variant(
            seq,
            heads[hd],
            true,
            1.0 / (HEAD_DIM as f64).sqrt(),
            docs[dc],
            variant,
        );
        // Both prompts end in the case's last document (decoded tokens continue it).
        let run = Run {
            strategy: strategies[st],
            ranks: RANKS[rk],
            merge: DecodeMerge::ALL[mg],
            config: RingConfig {
                causal: true,
                forward: Direction::ALL[fw],
                kernel: Kernel::ALL[kn],
                ..Default::default()
            },
            prompts: [seq - 9, seq - 14],
            fault: None,
        };
        let label = format!(
            "{row:?}: {run:?} S={seq} {:?} docs {:?}",
            c.variant, c.doc_lens
        );
        let (checked, error) = check(&c, &run, &label);
        decoded += checked;
        errors.push(error);
    }
    println!(
        "decoding table: {} runs, {decoded} decoded tokens cover every pair of {} axes; worst \
         relative error {:.2e} (bound {TOLERANCE:e})",
        design.len(),
        levels.len(),
        worst(errors)
    );
}

/// A rank's bytes per decoded token depend on heads × head_dim × ranks, never on the context's
/// length: a 16-token and a 40-token context send the same bytes per step, by each merge, as the
/// transports count them; and the all-gather sends N − 1 whole partials a rank, the ring 2(N − 1)/N.
#[test]
fn bytes_per_token_do_not_depend_on_the_context() {
    let c = case_variant(48, (4, 4), true, 0.25, &[], Variant::default());
    let n = 4;
    for merge in DecodeMerge::ALL {
        let bytes = [[16, 16], [40, 40]].map(|prompts| {
            let run = Run {
                strategy: "zigzag",
                ranks: n,
                merge,
                config: RingConfig {
                    causal: true,
                    ..Default::default()
                },
                prompts,
                fault: None,
            };
            let ranks = decode(&c, &run).unwrap();
            let steps = (48 - prompts[0]) as u64;
            ranks
                .iter()
                .map(|r| r.decode_bytes / steps)
                .collect::<Vec<_>>()
        });
        assert_eq!(
            bytes[0], bytes[1],
            "{merge}: bytes per step at 16 and 40 cached keys"
        );
        // A partial of 2 rows × 4 heads: out (16 f32) and lse (1 f32) a (row, head).
        let partial = (BATCH * 4 * (HEAD_DIM + 1) * 4) as u64;
        let per_rank = match merge {
            DecodeMerge::AllGather => (n as u64 - 1) * partial,
            DecodeMerge::Ring => 2 * (n as u64 - 1) * partial / n as u64,
        };
        for (r, &b) in bytes[0].iter().enumerate() {
            assert_eq!(b, per_rank, "{merge}: rank {r}'s bytes per step");
        }
    }
}

/// A rank that fails at a decode exchange ends the decoding with a typed error naming it and the
/// phase, within the peers' timeout, on both merges: every exchange of a step (N − 1 of the
/// all-gather, 2(N − 1) of the ring), and one of a later step.
#[test]
fn a_rank_failing_in_a_decode_step_is_a_typed_error() {
    let c = case_variant(40, (4, 4), true, 0.25, &[], Variant::default());
    let n = 4;
    let strikes = (0..n - 1)
        .map(|s| (DecodeMerge::AllGather, s))
        .chain((0..2 * (n - 1)).map(|s| (DecodeMerge::Ring, s)))
        .chain([(DecodeMerge::Ring, 2 * (n - 1) + 1)]);
    for (merge, step) in strikes {
        let run = Run {
            strategy: "striped",
            ranks: n,
            merge,
            config: RingConfig {
                causal: true,
                ..Default::default()
            },
            prompts: [36, 36],
            fault: Some((2, step)),
        };
        let started = std::time::Instant::now();
        let err = decode(&c, &run).err().expect("the fault ends the decoding");
        assert!(
            started.elapsed() < Duration::from_secs(5 + 5),
            "{merge}: took {:?}",
            started.elapsed()
        );
        assert_eq!(
            err.to_string(),
            format!("rank 2 failed: injected fault at its decode exchange {step}"),
            "{merge}"
        );
    }
}

/// The placement rule: each decoded token goes to the rank holding the fewest of its sequence's
/// keys (the lowest on a tie), so a contiguous prefill whose last rank holds only 6 of its 8
/// positions' real keys fills that rank first, and the counts end within one of each other.
#[test]
fn decoded_tokens_go_to_the_rank_with_the_fewest_keys() {
    // 30 tokens on 4 contiguous ranks of 8 positions: the ranks hold 8, 8, 8, 6 real keys. Three
    // decoded tokens: two to rank 3, then one to rank 0 (all tied at 8); eighteen: 8 each, then four
    // rounds of one a rank.
    for (seq, counts) in [(33, [9, 8, 8, 8]), (48, [12, 12, 12, 12])] {
        let c = case_variant(seq, (4, 4), true, 0.25, &[], Variant::default());
        let run = Run {
            strategy: "contiguous",
            ranks: 4,
            merge: DecodeMerge::Ring,
            config: RingConfig {
                causal: true,
                ..Default::default()
            },
            prompts: [30, 30],
            fault: None,
        };
        let ranks = decode(&c, &run).unwrap();
        for r in &ranks {
            assert_eq!(
                r.counts,
                vec![counts.to_vec(); BATCH],
                "S = {seq}: keys a rank"
            );
        }
    }
}

/// A model's decoded logits against the recompute's, relative to the logits' scale. The two paths
/// compute every per-token part alike (embedding, norms, projections, feed-forward, head: a token's
/// row by the same dot products); they differ in each layer's attention, by the order its sums run
/// in (a cached token's keys in per-rank parts merged by log-sum-exp, against the ring's tiles),
/// each within [`F32_ATTENTION`] of the attention output's scale. Past the attention, the output
/// projection and the later layers carry that difference at its relative size (the seeded
/// weights' rows have norms near 1, and RMSNorm rescales a row's error with the row), so the
/// logits lie within the same bound.
const LOGITS: f64 = F32_ATTENTION;

/// A tiny seeded model of `vocab` tokens with `kv_heads` of 4 heads and a variant of its layers'
/// attention.
fn model(kv_heads: usize, variant: usize) -> workbench::model::Llama<B> {
    use workbench::model::LlamaConfig;
    let config = LlamaConfig::new(VOCAB)
        .with_d_model(32)
        .with_heads(4)
        .with_kv_heads(kv_heads)
        .with_ffn_chunk(7);
    let config = match variant {
        0 => config,
        // A window on every other layer (Gemma 2, gpt-oss): layer 0 windowed, layer 1 full.
        1 => config.with_window(Some(5)).with_window_every(2),
        2 => config.with_sinks(true),
        _ => config.with_softcap(Some(2.0)),
    };
    let device = Default::default();
    workbench::model::lazy::seeded::<B, _>(7, &device, || config.init::<B>(&device))
}

const VOCAB: usize = 29;
/// Names of [`model`]'s variants.
const MODEL_VARIANTS: [&str; 4] = ["plain", "window 5 every 2", "sinks", "softcap 2"];

/// The model-level table: greedy decoding with the cache against the whole sequence recomputed,
/// every decoded position's logits and the replies, over strategies × ranks × merges × heads ×
/// attention variants × packed prompts × batching (two prompts of different lengths decoded
/// together or one at a time), as a pairwise covering design.
#[test]
fn decoded_logits_equal_the_recompute() {
    use workbench::train::{Decoding, Prompt, decode, full_logits};
    let strategies = names();
    let ranks = [1, 2, 4];
    let kv_heads = [4, 2];
    let levels = [
        strategies.len(),
        ranks.len(),
        DecodeMerge::ALL.len(),
        kv_heads.len(),
        MODEL_VARIANTS.len(),
        2, // packed prompts
        2, // batched
    ];
    let design = pairwise(&levels);
    assert!(missing_pairs(&levels, &design).is_empty());
    let (mut positions, mut errors) = (0, Vec::new());
    for row in &design {
        let [st, rk, mg, kv, va, pk, bt] = row[..] else {
            unreachable!("one value an axis")
        };
        let m = model(kv_heads[kv], va);
        let prompts: Vec<Prompt> = [(21, [6, 15]), (13, [9, 4])]
            .into_iter()
            .enumerate()
            .map(|(i, (len, docs))| Prompt {
                tokens: (0..len)
                    .map(|t| ((t * 5 + i * 3 + 1) % VOCAB) as u32)
                    .collect(),
                doc_lens: if pk == 1 { docs.to_vec() } else { Vec::new() },
            })
            .collect();
        let decoding = Decoding {
            max_new: 6,
            // Never produced: every prompt decodes all 6 tokens.
            stop: &[],
            pad: 0,
            partition: by_name(strategies[st]).unwrap(),
            ranks: ranks[rk],
            timeout: Duration::from_secs(10),
            cache: Some(DecodeMerge::ALL[mg]),
            batch: if bt == 1 { 0 } else { 1 },
            on_batch: None,
            keep_logits: true,
            sampling: Default::default(),
            stop_reply: None,
        };
        let label = format!(
            "{row:?}: {} N={} {} kv={} {} packed={} batched={}",
            strategies[st],
            ranks[rk],
            DecodeMerge::ALL[mg],
            kv_heads[kv],
            MODEL_VARIANTS[va],
            pk == 1,
            bt == 1
        );
        let cached = decode(&m, &prompts, &decoding).unwrap_or_else(|e| panic!("{label}: {e}"));
        let recomputed = decode(
            &m,
            &prompts,
            &Decoding {
                cache: None,
                ..decoding
            },
        )
        .unwrap_or_else(|e| panic!("{label}: {e}"));
        assert_eq!(cached.replies, recomputed.replies, "{label}: replies");
        for (i, prompt) in prompts.iter().enumerate() {
            let reply = &cached.replies[i];
            assert_eq!(reply.len(), 6, "{label}: prompt {i}'s reply");
            assert_eq!(
                cached.decoded_tokens[i], 5,
                "{label}: prompt {i}'s decoding steps"
            );
            let mut whole = prompt.clone();
            whole.tokens.extend(reply);
            if let Some(last) = whole.doc_lens.last_mut() {
                *last += reply.len();
            }
            let all = full_logits(
                &m,
                &whole,
                &Decoding {
                    cache: None,
                    ..decoding
                },
            )
            .unwrap_or_else(|e| panic!("{label}: {e}"));
            let len = prompt.tokens.len();
            let want = &all[(len - 1) * VOCAB..(len - 1 + reply.len()) * VOCAB];
            let dev = deviation(&cached.logits[i], want);
            assert!(
                dev.within(LOGITS),
                "{label}: prompt {i}'s decoded logits: {dev}"
            );
            errors.push(dev.rel);
            let dev = deviation(&recomputed.logits[i], want);
            assert!(
                dev.within(LOGITS),
                "{label}: prompt {i}'s recomputed logits: {dev}"
            );
            positions += reply.len();
        }
    }
    println!(
        "decoded logits: {} runs, {positions} decoded positions cover every pair of {} axes; \
         worst relative error {:.2e} (bound {LOGITS:e})",
        design.len(),
        levels.len(),
        worst(errors)
    );
}

/// Bad input to a decoding: an empty prompt, a row longer than the cache, each one typed line.
#[test]
fn bad_decoding_input_is_a_typed_error() {
    use workbench::train::{Decoding, Prompt, decode};
    let m = model(2, 0);
    let decoding = Decoding {
        max_new: 3,
        stop: &[],
        pad: 0,
        partition: by_name("striped").unwrap(),
        ranks: 2,
        timeout: Duration::from_secs(10),
        cache: Some(DecodeMerge::Ring),
        batch: 0,
        on_batch: None,
        keep_logits: false,
        sampling: Default::default(),
        stop_reply: None,
    };
    let prompts = vec![Prompt::from(vec![1, 2, 3]), Prompt::from(Vec::new())];
    for cache in [Some(DecodeMerge::Ring), None] {
        let err = decode(&m, &prompts, &Decoding { cache, ..decoding }).unwrap_err();
        assert_eq!(
            err.to_string(),
            "batch row 1: an empty prompt has nothing to decode from"
        );
    }
    // A cache sized for 3 tokens, asked for a fourth.
    let mut cache = KvCache::<B>::new((0, 1), 1, 3, Kernel::default(), Default::default());
    let layout = by_name("contiguous").unwrap().layout(3, 1).unwrap();
    let row = cache
        .add_row(
            &layout,
            Sequence {
                len: 3,
                doc_lens: Vec::new(),
            },
        )
        .unwrap();
    let err = cache.start_token(row).unwrap_err();
    assert_eq!(
        err.to_string(),
        "batch row 0: 4 tokens do not fit a KV cache sized for 3"
    );
    let long = by_name("contiguous").unwrap().layout(4, 1).unwrap();
    let err = cache
        .add_row(
            &long,
            Sequence {
                len: 4,
                doc_lens: Vec::new(),
            },
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "batch row 1: 4 tokens do not fit a KV cache sized for 3"
    );
}

/// bf16 operands with an f32 merge: each decoded output within the bf16 bound of the float64
/// reference of the rounded inputs (`reference::bf16`: 2u of the output's terms' magnitudes,
/// plus f32's own; the partials merge in f32), on every strategy and kernel, both merges.
#[test]
fn bf16_decoding_is_within_the_bf16_bound() {
    use workbench::dtype::{Dtype, Precision};
    let c = ringbench_tests::case_in(
        Dtype::Bf16,
        40,
        (8, 2),
        true,
        1.0 / (HEAD_DIM as f64).sqrt(),
        &[],
        Variant::default(),
    );
    let bound = ringbench_tests::bf16::bounds()[0];
    for (i, strategy) in names().into_iter().enumerate() {
        for (ranks, kernel) in [
            (4, Kernel::ALL[i % 2]),
            (1 + i % 2, Kernel::ALL[(i + 1) % 2]),
        ] {
            let run = Run {
                strategy,
                ranks,
                merge: DecodeMerge::ALL[(i + ranks) % 2],
                config: RingConfig {
                    causal: true,
                    kernel,
                    precision: Precision {
                        dtype: Dtype::Bf16,
                        merge: Dtype::F32,
                    },
                    ..Default::default()
                },
                prompts: [31, 26],
                fault: None,
            };
            let ranks_out = decode(&c, &run).unwrap_or_else(|e| panic!("{run:?}: {e}"));
            for b in 0..BATCH {
                // Every position after the prompt was decoded, and so checked below.
                assert_eq!(
                    ranks_out[0].out[b].len(),
                    40 - run.prompts[b],
                    "{run:?}: row {b}'s decoded tokens"
                );
                for (t, got) in ranks_out[0].out[b].iter().enumerate() {
                    let position = run.prompts[b] + t;
                    let d = deviation(got, want(&c, b, position));
                    let error = if d.wrong.is_some() {
                        f64::INFINITY
                    } else {
                        d.abs / c.want.out_terms
                    };
                    assert!(
                        error <= bound,
                        "{run:?}: row {b} position {position}: {error:e} > {bound:e}"
                    );
                    // Returned in bf16: every value is a bf16 number.
                    assert!(
                        got.iter().all(|x| x.to_bits() & 0xffff == 0),
                        "{run:?}: not bf16"
                    );
                }
            }
        }
    }
}
