//! Statistical proof that mode `sd` is lossless (DESIGN §2.1): driving the whole path —
//! propose() from draft logits, score_position() from target logits, verify_block() — over
//! many seeds, the emitted tokens follow the target distribution p exactly, for proposals
//! truncated to K_q, proposals with mass where p has none, and p with mass where q has none.
//!
//! Test: Pearson chi-square goodness of fit against p computed independently in f64, at a
//! false-alarm rate α = 1e-4 per check (critical value from the Wilson–Hilferty
//! approximation). Seeds are fixed, so the outcome is deterministic; α is the chance that a
//! correct implementation would fail for an arbitrary seed set. A negative control shows
//! the same test rejects the draft's own distribution (q), so it has power.

use easd_core::{Mode, SamplingParams, SparseDist, TargetOptions, propose, score_position, verify_block};

const VOCAB: usize = 8;
const K_Q: usize = 4;

/// Deterministic pseudo-random logits for a context: a keyed hash of the tokens so far.
fn logits_for(context: &[u32], salt: u64, masked: &[usize]) -> Vec<f32> {
    let mut h = salt;
    for &t in context {
        h = (h ^ t as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17);
    }
    (0..VOCAB)
        .map(|i| {
            if masked.contains(&i) {
                return f32::NEG_INFINITY;
            }
            let u = easd_core::uniform(h, i as u64, easd_core::Purpose::BonusSample);
            (u * 4.0 - 2.0) as f32
        })
        .collect()
}

/// The draft never proposes token 0 (q has no mass where p has some); the target never
/// emits token 7 (p has no mass where q may have some).
fn draft_logits(context: &[u32]) -> Vec<f32> {
    logits_for(context, 11, &[0])
}

fn target_logits(context: &[u32]) -> Vec<f32> {
    logits_for(context, 29, &[7])
}

/// Exact p in f64: softmax(l / T), then top-k, then top-p (same conventions as the crate).
fn reference_p(logits: &[f32], params: &SamplingParams) -> Vec<f64> {
    let m = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let t = params.temperature as f64;
    let e: Vec<f64> = logits.iter().map(|&l| ((l as f64 - m) / t).exp()).collect();
    let mut order: Vec<usize> = (0..logits.len()).filter(|&i| e[i] > 0.0).collect();
    order.sort_by(|&a, &b| e[b].partial_cmp(&e[a]).unwrap().then(a.cmp(&b)));
    if params.top_k > 0 {
        order.truncate(params.top_k);
    }
    let mass: f64 = order.iter().map(|&i| e[i]).sum();
    let mut kept = Vec::new();
    let mut acc = 0.0;
    for &i in &order {
        kept.push(i);
        acc += e[i];
        if acc >= params.top_p as f64 * mass {
            break;
        }
    }
    let z: f64 = kept.iter().map(|&i| e[i]).sum();
    let mut p = vec![0.0; logits.len()];
    for i in kept {
        p[i] = e[i] / z;
    }
    p
}

/// Runs sd blocks of `k` drafts from an empty context until `n` tokens are emitted.
fn generate(params: &SamplingParams, k: usize, n: usize, seed: u64) -> Vec<u32> {
    let opts = TargetOptions::default();
    let mut context: Vec<u32> = Vec::new();
    while context.len() < n {
        let first = context.len() as u64;
        let mut drafted = context.clone();
        let mut draft = Vec::new();
        for j in 0..k {
            let d = propose(&draft_logits(&drafted), params, K_Q, 5, seed, first + j as u64);
            drafted.push(d.token);
            draft.push(d);
        }
        let target: Vec<_> = (0..=k)
            .map(|j| {
                let at = draft.get(j).map(|d| (d.token, &d.proposal));
                score_position(&target_logits(&drafted[..context.len() + j]), params, &opts, at, seed, first + j as u64)
            })
            .collect();
        let out = verify_block(&Mode::Sd, params.is_greedy(), seed, first, &draft, &target);
        context.extend(out.tokens);
    }
    context.truncate(n);
    context
}

/// Wilson–Hilferty approximation of the chi-square quantile; z = 3.719 is the standard
/// normal's 1 - 1e-4 quantile.
fn chi_square_critical(df: usize) -> f64 {
    let (d, z) = (df as f64, 3.719);
    d * (1.0 - 2.0 / (9.0 * d) + z * (2.0 / (9.0 * d)).sqrt()).powi(3)
}

/// Asserts `counts` fit `expected` probabilities; cells with p = 0 must be empty.
fn assert_fits(counts: &[u64], expected: &[f64], what: &str) {
    let n: u64 = counts.iter().sum();
    let (mut stat, mut cells) = (0.0, 0usize);
    for (&c, &p) in counts.iter().zip(expected) {
        if p == 0.0 {
            assert_eq!(c, 0, "{what}: a token with p = 0 was emitted");
            continue;
        }
        let e = n as f64 * p;
        stat += (c as f64 - e).powi(2) / e;
        cells += 1;
    }
    let critical = chi_square_critical(cells - 1);
    assert!(stat < critical, "{what}: chi-square {stat:.1} >= {critical:.1} with {} cells", cells);
}

fn fails_fit(counts: &[u64], expected: &[f64]) -> bool {
    std::panic::catch_unwind(|| assert_fits(counts, expected, "control")).is_err()
}

const TRIALS: u64 = 20_000;

fn cases() -> [(&'static str, SamplingParams); 3] {
    [
        ("T=1", SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0 }),
        ("T=0.7 top_p=0.9", SamplingParams { temperature: 0.7, top_k: 0, top_p: 0.9 }),
        ("T=1.3 top_k=5", SamplingParams { temperature: 1.3, top_k: 5, top_p: 1.0 }),
    ]
}

#[test]
fn the_first_emitted_token_follows_the_target_distribution() {
    for (name, params) in cases() {
        let p = reference_p(&target_logits(&[]), &params);
        let mut counts = [0u64; VOCAB];
        for seed in 0..TRIALS {
            counts[generate(&params, 1, 1, seed)[0] as usize] += 1;
        }
        assert_fits(&counts, &p, name);
        // Power: the draft's own truncated proposal differs from p and must be rejected.
        let q = propose(&draft_logits(&[]), &params, K_Q, 5, 0, 0).proposal;
        let q_dense: Vec<f64> = (0..VOCAB as u32).map(|id| q.prob(id) as f64).collect();
        let mut q_counts = [0u64; VOCAB];
        for seed in 0..TRIALS {
            q_counts[q.sample(easd_core::uniform(seed, 0, easd_core::Purpose::DraftSample)) as usize] += 1;
        }
        assert!(fails_fit(&q_counts, &p), "{name}: the test cannot tell q from p");
        assert!(!fails_fit(&q_counts, &q_dense), "{name}: q's own samples misfit q");
    }
}

#[test]
fn two_tokens_emitted_through_two_position_blocks_follow_the_target_joint() {
    for (name, params) in cases() {
        let p0 = reference_p(&target_logits(&[]), &params);
        let mut joint = vec![0.0; VOCAB * VOCAB];
        for a in 0..VOCAB {
            let p1 = reference_p(&target_logits(&[a as u32]), &params);
            for b in 0..VOCAB {
                joint[a * VOCAB + b] = p0[a] * p1[b];
            }
        }
        let mut counts = vec![0u64; VOCAB * VOCAB];
        for seed in 0..TRIALS {
            let t = generate(&params, 2, 2, 1_000_000 + seed);
            counts[t[0] as usize * VOCAB + t[1] as usize] += 1;
        }
        assert_fits(&counts, &joint, name);
    }
}

#[test]
fn greedy_speculation_reproduces_the_targets_greedy_sequence() {
    let greedy = SamplingParams::greedy();
    for k in [1, 2, 4] {
        let mut expected: Vec<u32> = Vec::new();
        for _ in 0..6 {
            expected.push(easd_core::argmax(&target_logits(&expected)));
        }
        assert_eq!(generate(&greedy, k, 6, 5), expected, "k={k}");
    }
}

#[test]
fn the_sparse_proposal_is_what_the_verifier_needs_and_no_more() {
    let params = SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0 };
    let d = propose(&draft_logits(&[]), &params, K_Q, 5, 3, 0);
    assert!(d.proposal.len() <= K_Q);
    assert_eq!(d.proposal.prob(0), 0.0);
    assert!(d.proposal.prob(d.token) > 0.0);
    assert!(SparseDist::default().is_empty());
}
