//! Choosing a replica for a new session: power of two choices on live sessions (Mitzenmacher), which keeps load
//! even without a global scan's herd behaviour. Pure: the candidates and the random draws are inputs.

/// Load view of one candidate replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub live_sessions: usize,
    pub capacity: usize,
}

impl Candidate {
    fn has_room(&self) -> bool {
        self.live_sessions < self.capacity
    }
}

/// Index of the chosen candidate among those with room, or None when all are full (or there are none).
/// `r1`, `r2` are uniform draws in [0, 1).
pub fn power_of_two(candidates: &[Candidate], r1: f64, r2: f64) -> Option<usize> {
    let open: Vec<usize> = (0..candidates.len()).filter(|&i| candidates[i].has_room()).collect();
    match open.len() {
        0 => None,
        1 => Some(open[0]),
        n => {
            let a = ((r1 * n as f64) as usize).min(n - 1);
            // Second pick among the others, so the two are distinct.
            let mut b = ((r2 * (n - 1) as f64) as usize).min(n - 2);
            if b >= a {
                b += 1;
            }
            let (a, b) = (open[a], open[b]);
            Some(if candidates[b].live_sessions < candidates[a].live_sessions { b } else { a })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(live: usize) -> Candidate {
        Candidate { live_sessions: live, capacity: 4 }
    }

    #[test]
    fn the_less_loaded_of_the_two_draws_wins() {
        let cands = [c(3), c(0), c(2)];
        // r1 -> index 0, r2 -> the first of the others, index 1.
        assert_eq!(power_of_two(&cands, 0.0, 0.0), Some(1));
        // r1 -> index 2, r2 -> index 0: 2 has fewer sessions than 0.
        assert_eq!(power_of_two(&cands, 0.99, 0.0), Some(2));
    }

    #[test]
    fn full_replicas_are_never_chosen() {
        let cands = [c(4), c(1), c(4)];
        for r in [0.0, 0.3, 0.6, 0.99] {
            assert_eq!(power_of_two(&cands, r, r), Some(1));
        }
        assert_eq!(power_of_two(&[c(4), c(4)], 0.5, 0.5), None);
        assert_eq!(power_of_two(&[], 0.5, 0.5), None);
    }

    #[test]
    fn load_spreads_over_replicas() {
        // Simulate 64 sessions arriving with deterministic pseudo-random draws.
        let mut cands = vec![Candidate { live_sessions: 0, capacity: 64 }; 2];
        let mut x = 0.123_f64;
        for _ in 0..64 {
            x = (x * 9301.0 + 0.49297).fract();
            let y = (x * 7.0 + 0.3).fract();
            let i = power_of_two(&cands, x, y).unwrap();
            cands[i].live_sessions += 1;
        }
        assert_eq!(cands[0].live_sessions + cands[1].live_sessions, 64);
        assert!(cands[0].live_sessions.abs_diff(cands[1].live_sessions) <= 1, "{cands:?}");
    }
}
