//! The three EASD services as a library: the draft worker, the verifier worker and the coordinator
//! (DESIGN §3). The binaries in `services/` and the `easd` CLI only parse flags and call into this crate.
//!
//! Responsibilities are split as DESIGN §3.1 says: workers compute per-position summaries from their
//! models (`easd_core::propose`, `easd_core::score_position`); the coordinator decides (`easd_core::verify_block`)
//! and holds the committed tokens, which makes every worker call safe to retry.

pub mod batcher;
pub mod convert;
pub mod coordinator;
pub mod draft;
pub mod error;
pub mod limits;
pub mod local;
pub mod prefill;
pub mod prefix;
pub mod serve;
pub mod sessions;
pub mod tls;
pub mod verifier;
pub mod worker;

pub use batcher::BatchOptions;
pub use coordinator::{Coordinator, CoordinatorConfig};
pub use error::ServerError;
pub use sessions::SessionLimits;
pub use worker::Worker;
