//! Partial selection of the largest logits without sorting the vocabulary.
//!
//! A candidate buffer holds at most 2n entries; whenever it fills, `select_nth_unstable`
//! keeps the best n and raises the admission threshold. Chunks of 16 logits whose maximum
//! is below the threshold are skipped after one vectorised max, so a 152k-entry scan costs
//! little more than reading the vector.

use std::cmp::Ordering;

const CHUNK: usize = 16;

/// Descending by value, ties by lower id: a total order on non-NaN candidates.
pub(crate) fn better(a: &(f32, u32), b: &(f32, u32)) -> Ordering {
    b.0.partial_cmp(&a.0).unwrap_or(Ordering::Equal).then(a.1.cmp(&b.1))
}

pub(crate) fn chunk_max(c: &[f32]) -> f32 {
    let mut m = [f32::NEG_INFINITY; CHUNK / 2];
    for l in 0..CHUNK / 2 {
        let (x, y) = (c[l], c[l + CHUNK / 2]);
        let xy = if y > x { y } else { x };
        m[l] = if xy > m[l] { xy } else { m[l] };
    }
    m.iter().fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a })
}

/// Keeps the `n` best (value, id) pairs offered in increasing id order.
pub(crate) struct TopBuffer {
    n: usize,
    buf: Vec<(f32, u32)>,
    threshold: f32,
}

impl TopBuffer {
    pub fn new(n: usize) -> Self {
        Self { n, buf: Vec::with_capacity(2 * n + CHUNK), threshold: f32::NEG_INFINITY }
    }

    /// Values not above this cannot enter (NaN and -inf never do).
    #[inline]
    pub fn threshold(&self) -> f32 {
        if self.n == 0 { f32::INFINITY } else { self.threshold }
    }

    #[inline]
    fn admit(&mut self, v: f32, id: usize) {
        // A later id with a value equal to the threshold ranks below the n-th kept one.
        if v > self.threshold {
            self.buf.push((v, id as u32));
            if self.buf.len() >= 2 * self.n {
                self.buf.select_nth_unstable_by(self.n - 1, better);
                self.buf.truncate(self.n);
                self.threshold = self.buf[self.n - 1].0;
            }
        }
    }

    /// Offers `values`, whose first id is `offset`; chunks below the threshold are skipped.
    pub fn offer(&mut self, values: &[f32], offset: usize) {
        if self.n == 0 {
            return;
        }
        let chunks = values.chunks_exact(CHUNK);
        let rest_start = values.len() - chunks.remainder().len();
        for (ci, c) in chunks.enumerate() {
            if chunk_max(c) > self.threshold {
                for (j, &v) in c.iter().enumerate() {
                    self.admit(v, offset + ci * CHUNK + j);
                }
            }
        }
        for (j, &v) in values[rest_start..].iter().enumerate() {
            self.admit(v, offset + rest_start + j);
        }
    }

    /// The best pairs, descending, ties by lower id.
    pub fn finish(mut self) -> Vec<(f32, u32)> {
        self.buf.sort_unstable_by(better);
        self.buf.truncate(self.n);
        self.buf
    }
}

/// Ids of the `n` largest logits, descending, ties broken by lower id. NaN and -inf entries
/// are never selected, so fewer than `n` ids come back when fewer are finite.
pub(crate) fn top_ids(logits: &[f32], n: usize) -> Vec<u32> {
    top_pairs(logits, n).into_iter().map(|(_, id)| id).collect()
}

/// As [`top_ids`], with the logit of each id.
pub(crate) fn top_pairs(logits: &[f32], n: usize) -> Vec<(f32, u32)> {
    let mut top = TopBuffer::new(n);
    top.offer(logits, 0);
    top.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(logits: &[f32], n: usize) -> Vec<u32> {
        let mut all: Vec<(f32, u32)> =
            logits.iter().enumerate().filter(|(_, v)| v.is_finite()).map(|(i, &v)| (v, i as u32)).collect();
        all.sort_by(better);
        all.into_iter().take(n).map(|(_, i)| i).collect()
    }

    #[test]
    fn top_ids_match_a_full_sort_including_ties() {
        // Values from a small set force many ties across chunk boundaries.
        let logits: Vec<f32> = (0..1000u32).map(|i| (i.wrapping_mul(2654435761) >> 28) as f32).collect();
        for n in [0, 1, 2, 5, 16, 17, 64, 999, 1000, 2000] {
            assert_eq!(top_ids(&logits, n), reference(&logits, n), "n={n}");
        }
    }

    #[test]
    fn nan_and_masked_entries_are_never_selected() {
        let mut logits = vec![f32::NEG_INFINITY; 40];
        logits[3] = 1.0;
        logits[20] = f32::NAN;
        logits[37] = 2.0;
        assert_eq!(top_ids(&logits, 5), vec![37, 3]);
        assert!(top_ids(&[], 3).is_empty());
    }
}
