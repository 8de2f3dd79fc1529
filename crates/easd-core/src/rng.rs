//! Position-keyed deterministic randomness (DESIGN §2.4).
//!
//! Every draw is a pure function of (request seed, absolute token position, purpose): a keyed
//! hash, never a stateful generator. Retries, failover, re-batching and re-drafting therefore
//! cannot change which uniform a given position sees.
//!
//! The hash chains three SplitMix64 finalisers (each a bijection with full avalanche), feeding
//! the seed, the position and the purpose in turn, and keeps the top 53 bits as an f64.

/// Why a uniform is drawn; each purpose is an independent stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Purpose {
    DraftSample,
    AcceptTest,
    ResidualSample,
    EasdResample,
    BonusSample,
}

impl Purpose {
    /// Fixed, arbitrary odd constants: part of the determinism contract, never change them.
    fn key(self) -> u64 {
        match self {
            Purpose::DraftSample => 0x243F_6A88_85A3_08D3,
            Purpose::AcceptTest => 0x1319_8A2E_0370_7345,
            Purpose::ResidualSample => 0xA409_3822_299F_31D1,
            Purpose::EasdResample => 0x082E_FA98_EC4E_6C89,
            Purpose::BonusSample => 0x4528_21E6_38D0_1377,
        }
    }
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A uniform in [0, 1), a pure function of (seed, position, purpose).
pub fn uniform(seed: u64, position: u64, purpose: Purpose) -> f64 {
    let h = mix(mix(mix(seed) ^ position) ^ purpose.key());
    (h >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PURPOSES: [Purpose; 5] = [
        Purpose::DraftSample,
        Purpose::AcceptTest,
        Purpose::ResidualSample,
        Purpose::EasdResample,
        Purpose::BonusSample,
    ];

    #[test]
    fn the_same_key_always_gives_the_same_uniform() {
        for p in PURPOSES {
            assert_eq!(uniform(42, 7, p), uniform(42, 7, p));
        }
        // Pinned values (checked against an independent Python implementation of the hash):
        // a change here silently changes every seeded run, so it must be deliberate.
        assert_eq!(uniform(0, 0, Purpose::DraftSample), 0.29347987495714467);
        assert_eq!(uniform(1234, 56, Purpose::AcceptTest), 0.9036822374122184);
    }

    #[test]
    fn uniforms_are_in_the_unit_interval_with_mean_one_half() {
        // 20,000 draws: the sample mean has sd 1/sqrt(12 * 20000) ~ 0.002; 5 sd bound.
        let n = 20_000u64;
        let mut sum = 0.0;
        for i in 0..n {
            let u = uniform(9, i, Purpose::BonusSample);
            assert!((0.0..1.0).contains(&u));
            sum += u;
        }
        assert!((sum / n as f64 - 0.5).abs() < 0.0102);
    }

    #[test]
    fn purposes_positions_and_seeds_give_uncorrelated_streams() {
        // Pearson correlation of paired streams; |r| has sd ~ 1/sqrt(n) = 0.007; 5 sd bound.
        let n = 20_000u64;
        let corr = |f: &dyn Fn(u64) -> (f64, f64)| {
            let (mut sx, mut sy, mut sxx, mut syy, mut sxy) = (0.0, 0.0, 0.0, 0.0, 0.0);
            for i in 0..n {
                let (x, y) = f(i);
                sx += x;
                sy += y;
                sxx += x * x;
                syy += y * y;
                sxy += x * y;
            }
            let nf = n as f64;
            let cov = sxy / nf - sx * sy / nf / nf;
            cov / ((sxx / nf - (sx / nf).powi(2)) * (syy / nf - (sy / nf).powi(2))).sqrt()
        };
        let pairs: [&dyn Fn(u64) -> (f64, f64); 4] = [
            &|i| (uniform(1, i, Purpose::DraftSample), uniform(1, i, Purpose::AcceptTest)),
            &|i| (uniform(1, i, Purpose::ResidualSample), uniform(1, i + 1, Purpose::ResidualSample)),
            &|i| (uniform(i, 3, Purpose::BonusSample), uniform(i + 1, 3, Purpose::BonusSample)),
            &|i| (uniform(5, i, Purpose::EasdResample), uniform(6, i, Purpose::EasdResample)),
        ];
        for f in pairs {
            assert!(corr(f).abs() < 0.035, "correlation {}", corr(f));
        }
    }
}
