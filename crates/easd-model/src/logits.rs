//! Logits of every position of one forward, on the host.

/// Row-major `[rows, vocab]` f32 logits: row `i` is the next-token distribution after input `i`.
#[derive(Clone, Debug)]
pub struct Logits {
    data: Vec<f32>,
    rows: usize,
    vocab: usize,
}

impl Logits {
    pub(crate) fn new(data: Vec<f32>, rows: usize, vocab: usize) -> Self {
        debug_assert_eq!(data.len(), rows * vocab);
        Self { data, rows, vocab }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Row `i`; panics when `i >= rows()` like slice indexing.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.vocab..(i + 1) * self.vocab]
    }

    /// Greedy choice at row `i` (lowest id on ties).
    pub fn argmax(&self, i: usize) -> u32 {
        let mut best = 0;
        for (j, &v) in self.row(i).iter().enumerate() {
            if v > self.row(i)[best] {
                best = j;
            }
        }
        best as u32
    }

    /// Consumes the logits, returning the flat `[rows * vocab]` buffer.
    pub fn into_vec(self) -> Vec<f32> {
        self.data
    }
}
