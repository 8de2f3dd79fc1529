//! Prefix claims: "the cache holds exactly these `length` tokens, whose rolling hash is `hash`".
//!
//! Every request to a worker carries a claim, so a worker that restarted, evicted the session or diverged
//! answers with a precise status instead of silently computing on the wrong context (DESIGN §3.2).

/// FNV-1a style rolling hash over token ids; `hash(&[])` is the offset basis.
pub fn extend_hash(mut hash: u64, token: u32) -> u64 {
    for byte in token.to_le_bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// Hash of the empty prefix.
pub const EMPTY_HASH: u64 = 0xcbf2_9ce4_8422_2325;

/// A token sequence with the hash of each of its prefixes, so any claim can be checked in O(1).
#[derive(Clone, Debug)]
pub struct HashedTokens {
    tokens: Vec<u32>,
    /// `hashes[i]` is the hash of `tokens[..i]`; always `tokens.len() + 1` entries.
    hashes: Vec<u64>,
}

impl Default for HashedTokens {
    fn default() -> Self {
        Self { tokens: Vec::new(), hashes: vec![EMPTY_HASH] }
    }
}

impl HashedTokens {
    pub fn from_tokens(tokens: &[u32]) -> Self {
        let mut out = Self::default();
        out.extend(tokens);
        out
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Hash of the first `len` tokens (`len <= self.len()`).
    pub fn hash_of_prefix(&self, len: usize) -> u64 {
        self.hashes[len]
    }

    /// Whether the first `length` tokens hash to `hash`.
    pub fn matches(&self, length: usize, hash: u64) -> bool {
        length <= self.len() && self.hashes[length] == hash
    }

    /// Length of the longest prefix this sequence shares with `other`, by binary search on the prefix hashes
    /// (equal hashes are taken as equal prefixes, as every prefix claim does).
    pub fn common_prefix_len(&self, other: &HashedTokens) -> usize {
        let (mut lo, mut hi) = (0, self.len().min(other.len()));
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if self.hashes[mid] == other.hashes[mid] { lo = mid } else { hi = mid - 1 }
        }
        lo
    }

    pub fn push(&mut self, token: u32) {
        let last = *self.hashes.last().expect("hashes is never empty");
        self.tokens.push(token);
        self.hashes.push(extend_hash(last, token));
    }

    pub fn extend(&mut self, tokens: &[u32]) {
        for &t in tokens {
            self.push(t);
        }
    }

    pub fn truncate(&mut self, len: usize) {
        self.tokens.truncate(len);
        self.hashes.truncate(len + 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_hashes_agree_with_hashing_the_prefix_alone() {
        let seq = HashedTokens::from_tokens(&[5, 9, 151_643, 0]);
        for len in 0..=4 {
            let alone = HashedTokens::from_tokens(&seq.tokens()[..len]);
            assert_eq!(seq.hash_of_prefix(len), alone.hash_of_prefix(len));
            assert!(seq.matches(len, alone.hash_of_prefix(len)));
        }
        assert!(!seq.matches(5, EMPTY_HASH));
    }

    #[test]
    fn different_tokens_give_different_claims() {
        let a = HashedTokens::from_tokens(&[1, 2, 3]);
        let b = HashedTokens::from_tokens(&[1, 2, 4]);
        assert_ne!(a.hash_of_prefix(3), b.hash_of_prefix(3));
        assert_eq!(a.hash_of_prefix(2), b.hash_of_prefix(2));
    }

    #[test]
    fn the_common_prefix_is_where_two_sequences_first_differ() {
        let a = HashedTokens::from_tokens(&[1, 2, 3, 4, 5]);
        for (b, expected) in [(vec![1, 2, 3, 4, 5, 6], 5), (vec![1, 2, 9, 4, 5], 2), (vec![7], 0), (vec![], 0)] {
            let b = HashedTokens::from_tokens(&b);
            assert_eq!((a.common_prefix_len(&b), b.common_prefix_len(&a)), (expected, expected));
        }
    }

    #[test]
    fn truncate_then_push_equals_building_directly() {
        let mut a = HashedTokens::from_tokens(&[1, 2, 3]);
        a.truncate(1);
        a.extend(&[7, 8]);
        assert_eq!(a.hash_of_prefix(3), HashedTokens::from_tokens(&[1, 7, 8]).hash_of_prefix(3));
    }
}
