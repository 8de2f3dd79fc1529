//! Which kernels run: chosen once per process from the CPU's features, or forced with
//! `EASD_KERNELS=portable|avx2|avx512|amx` (a forced path the CPU lacks falls back to the best one it has).

use std::sync::OnceLock;

/// An instruction-set path. Every path computes bit-identical results (see `scalar.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Plain Rust, any CPU.
    Portable,
    /// x86-64 AVX2 + F16C.
    Avx2,
    /// x86-64 AVX2 + AVX-512 F/BW/VL/VNNI (512-bit K-quant kernels, `vpdpbusd`).
    Avx512Vnni,
    /// [`Isa::Avx512Vnni`] plus Intel AMX (tile registers, `tdpbsud`) for products of several
    /// activation rows; single rows stay on the VNNI kernels. Linux only: the process must be
    /// granted the tile state (`arch_prctl`), which some hypervisors withhold.
    Amx,
}

impl Isa {
    pub const ALL: [Isa; 4] = [Isa::Portable, Isa::Avx2, Isa::Avx512Vnni, Isa::Amx];

    /// Whether this CPU can run the path.
    pub fn available(self) -> bool {
        match self {
            Isa::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("f16c"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => {
                Isa::Avx2.available()
                    && std::is_x86_feature_detected!("avx512f")
                    && std::is_x86_feature_detected!("avx512bw")
                    && std::is_x86_feature_detected!("avx512vl")
                    && std::is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
            Isa::Amx => Isa::Avx512Vnni.available() && crate::x86::amx::granted(),
            // Paths of other architectures and systems.
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// The best path this CPU has.
    pub fn best() -> Isa {
        Isa::ALL.into_iter().rev().find(|i| i.available()).unwrap_or(Isa::Portable)
    }

    /// The process-wide path: `EASD_KERNELS` if set and available, else [`Isa::best`].
    pub fn active() -> Isa {
        static ACTIVE: OnceLock<Isa> = OnceLock::new();
        *ACTIVE.get_or_init(|| {
            let forced = std::env::var("EASD_KERNELS").ok().and_then(|v| Isa::parse(&v));
            match forced {
                Some(isa) if isa.available() => isa,
                _ => Isa::best(),
            }
        })
    }

    pub fn parse(name: &str) -> Option<Isa> {
        match name.trim().to_ascii_lowercase().as_str() {
            "portable" | "scalar" => Some(Isa::Portable),
            "avx2" => Some(Isa::Avx2),
            "avx512" | "avx512vnni" | "vnni" => Some(Isa::Avx512Vnni),
            "amx" | "avx512-amx" => Some(Isa::Amx),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512Vnni => "avx512-vnni",
            Isa::Amx => "avx512-amx",
        }
    }
}
