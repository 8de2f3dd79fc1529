//! Entropy calibration: τ is a percentile of a model's token-entropy distribution (DESIGN §2.2).

/// Collects entropies; percentiles by linear interpolation (numpy's default).
#[derive(Clone, Debug, Default)]
pub struct EntropySamples {
    values: Vec<f32>,
    sorted: bool,
}

impl EntropySamples {
    /// Adds one entropy; NaN is ignored (it has no rank).
    pub fn push(&mut self, h: f32) {
        if !h.is_nan() {
            self.values.push(h);
            self.sorted = false;
        }
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The p-th percentile by [`percentile_sorted`]. None when empty or p is outside [0, 100].
    pub fn percentile(&mut self, p: f64) -> Option<f32> {
        if !self.sorted {
            self.values.sort_unstable_by(f32::total_cmp);
            self.sorted = true;
        }
        percentile_sorted(&self.values, p).map(|v| v as f32)
    }

    pub fn mean(&self) -> Option<f64> {
        (!self.values.is_empty()).then(|| self.values.iter().map(|&v| v as f64).sum::<f64>() / self.values.len() as f64)
    }
}

/// The p-th percentile (p in [0, 100]) of ascending `sorted`, interpolating linearly between
/// the two nearest ranks (rank = p/100 · (n − 1); numpy's default). None when empty or p is
/// outside [0, 100]. The project's one percentile: calibration thresholds and evaluation
/// statistics both use it.
pub fn percentile_sorted<T: Copy + Into<f64>>(sorted: &[T], p: f64) -> Option<f64> {
    if sorted.is_empty() || !(0.0..=100.0).contains(&p) {
        return None;
    }
    let rank = p / 100.0 * (sorted.len() - 1) as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    let (a, b) = (sorted[lo].into(), sorted[hi].into());
    Some(a + (b - a) * (rank - lo as f64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let mut s = EntropySamples::default();
        for h in [3.0, 1.0, 4.0, 1.0, 5.0, f32::NAN] {
            s.push(h);
        }
        assert_eq!(s.len(), 5);
        // numpy.percentile([1, 1, 3, 4, 5], [0, 25, 50, 80, 90, 100])
        let expected = [(0.0, 1.0), (25.0, 1.0), (50.0, 3.0), (80.0, 4.2), (90.0, 4.6), (100.0, 5.0)];
        for (p, v) in expected {
            assert!((s.percentile(p).unwrap() - v).abs() < 1e-6, "p{p}");
        }
        assert_eq!(s.mean(), Some(2.8));
        assert_eq!(s.percentile(100.5), None);
        s.push(0.0);
        assert_eq!(s.percentile(0.0), Some(0.0));
    }

    #[test]
    fn percentiles_of_sorted_slices_take_any_float_type() {
        let v = [1.0f32, 2.0, 3.0, 4.0];
        assert_eq!(percentile_sorted(&v, 50.0), Some(2.5));
        assert_eq!(percentile_sorted(&v, 0.0), Some(1.0));
        assert_eq!(percentile_sorted(&v, 100.0), Some(4.0));
        // numpy.percentile([1, 2, 3, 4], 90) = 3.7
        assert!((percentile_sorted(&v, 90.0).unwrap() - 3.7).abs() < 1e-12);
        assert_eq!(percentile_sorted(&[2.0f64, 4.0, 8.0], 50.0), Some(4.0));
        assert_eq!(percentile_sorted::<f64>(&[], 50.0), None);
        assert_eq!(percentile_sorted(&v, 101.0), None);
        assert_eq!(percentile_sorted(&v, -1.0), None);
    }

    #[test]
    fn an_empty_collection_has_no_statistics() {
        let mut s = EntropySamples::default();
        assert!(s.is_empty());
        assert_eq!(s.percentile(50.0), None);
        assert_eq!(s.mean(), None);
    }
}
