//! The ceiling of the AVX2 Q4_K tile's loop shape on this core: eight activation rows against a 16-column tile held as
//! two `ymm` halves; per activation quad, two `maddubs` + two 16-bit `add`s. Three variants: the quads already in
//! registers, each quad broadcast from memory (what the kernel does), and the same while streaming the weights from
//! a matrix the size of the target's FFN up product. Prints `vpmaddubsw` per second, one thread.
//! `taskset -c 1 cargo run --release -p easd-kernels --example maddubs_ceiling` (x86-64 with AVX2 only).

#[cfg(target_arch = "x86_64")]
mod ceiling {
    use std::arch::x86_64::*;
    use std::time::Instant;

    const R: usize = 8;

    /// `iters` tile lines of 64 weight bytes (cycling through `w`) against `R` activation rows.
    #[target_feature(enable = "avx2")]
    unsafe fn run(iters: usize, w: &[u8], lines: usize, acts: &[Vec<u8>], from_memory: bool) -> i32 {
        // SAFETY: every load stays inside `w` (line < lines, lines · 64 + 64 ≤ w.len()) or an activation row
        // (offset + 8 ≤ 4096); AVX2 is the caller's contract.
        unsafe {
            let m4 = _mm256_set1_epi8(0x0f);
            let in_registers = _mm256_set1_epi32(0x0102_0304);
            let mut acc = [[_mm256_setzero_si256(); 2]; R];
            for i in 0..iters {
                let p = w.as_ptr().add((i % lines) * 64);
                let (l0, l1) =
                    (_mm256_loadu_si256(p as *const __m256i), _mm256_loadu_si256(p.add(32) as *const __m256i));
                let (wl0, wl1) = (_mm256_and_si256(l0, m4), _mm256_and_si256(l1, m4));
                let wh0 = _mm256_and_si256(_mm256_srli_epi16::<4>(l0), m4);
                let wh1 = _mm256_and_si256(_mm256_srli_epi16::<4>(l1), m4);
                let at = (i & 255) * 8;
                for (r, acc) in acc.iter_mut().enumerate() {
                    let (a0, a1) = if from_memory {
                        let q = acts[r].as_ptr().add(at) as *const i32;
                        (_mm256_set1_epi32(q.read_unaligned()), _mm256_set1_epi32(q.add(1).read_unaligned()))
                    } else {
                        (in_registers, in_registers)
                    };
                    acc[0] = _mm256_add_epi16(acc[0], _mm256_maddubs_epi16(wl0, a0));
                    acc[1] = _mm256_add_epi16(acc[1], _mm256_maddubs_epi16(wl1, a0));
                    acc[0] = _mm256_add_epi16(acc[0], _mm256_maddubs_epi16(wh0, a1));
                    acc[1] = _mm256_add_epi16(acc[1], _mm256_maddubs_epi16(wh1, a1));
                }
            }
            let mut s = _mm256_setzero_si256();
            for a in acc {
                s = _mm256_add_epi16(s, _mm256_add_epi16(a[0], a[1]));
            }
            _mm256_extract_epi32::<0>(s)
        }
    }

    pub fn main() {
        if !is_x86_feature_detected!("avx2") {
            println!("no AVX2 on this CPU");
            return;
        }
        let iters = 20_000_000;
        let acts: Vec<Vec<u8>> = (0..R).map(|r| (0..4096).map(|i| (i * 3 + r) as u8 & 0x7f).collect()).collect();
        // 64 lines stay in L1; 120,000 lines (7.7 MB) stream like the target's FFN up weights.
        for (name, lines, from_memory) in [
            ("quads in registers, weights in L1", 64, false),
            ("quads broadcast from memory, weights in L1", 64, true),
            ("quads broadcast from memory, weights streamed (7.7 MB)", 120_000, true),
        ] {
            let w: Vec<u8> = (0..lines * 64 + 64).map(|i| (i * 7) as u8).collect();
            let mut best = 0f64;
            for _ in 0..3 {
                let t = Instant::now();
                // SAFETY: AVX2 detected above.
                let check = unsafe { run(iters, &w, lines, &acts, from_memory) };
                let rate = (iters * R * 4) as f64 / t.elapsed().as_secs_f64() / 1e9;
                best = best.max(rate);
                std::hint::black_box(check);
            }
            println!("{name}: {best:.2} G vpmaddubsw/s");
        }
    }
}

fn main() {
    #[cfg(target_arch = "x86_64")]
    ceiling::main();
}
