//! The coordinator's defaults for what a request leaves unset: mode, block size and the EASD parameters.
//!
//! Each has a flag and an environment variable named like the Kubernetes ConfigMap keys (`EASD_MODE`,
//! `EASD_BLOCK_K`, `EASD_TAU_DRAFT`, …). The thresholds come, by precedence, from the flag (or its variable), then
//! the calibration file's recommendation (`easd calibrate`), then DESIGN §2.2's start values.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use easd_core::{EasdParams, Order, Penalty};
use easd_server::coordinator::ModeKind;
use serde::Deserialize;

/// The `format` field a calibration file must carry.
pub const CALIBRATION_FORMAT: &str = "easd-calibration/1";

#[derive(clap::Args, Debug, Clone)]
pub struct EasdDefaultsArgs {
    /// Mode of requests that name none: sd | easd | target | draft.
    #[arg(long, env = "EASD_MODE", default_value = "sd")]
    pub mode: ModeKind,
    /// Block size k of requests that name none.
    #[arg(long, env = "EASD_BLOCK_K", default_value_t = easd_server::coordinator::request::DEFAULT_BLOCK_SIZE)]
    pub k: usize,
    /// Calibration file (`easd calibrate`): its recommended τ_draft and τ_target become the defaults.
    #[arg(long, env = "EASD_CALIBRATION")]
    pub calibration: Option<PathBuf>,
    /// τ_draft: minimum draft entropy (nats) for the EASD rule; overrides the calibration file.
    #[arg(long, env = "EASD_TAU_DRAFT")]
    pub tau_draft: Option<f32>,
    /// τ_target: minimum target entropy (nats); overrides the calibration file.
    #[arg(long, env = "EASD_TAU_TARGET")]
    pub tau_target: Option<f32>,
    /// ρ: minimum top-N overlap fraction.
    #[arg(long, env = "EASD_RHO")]
    pub rho: Option<f32>,
    /// N: size of the top-N sets compared.
    #[arg(long, env = "EASD_TOP_N")]
    pub top_n: Option<usize>,
    /// When the EASD rule runs: after-sd (only on tokens the SD test accepted) | gate (before it).
    #[arg(long, env = "EASD_ORDER", value_parser = parse_order)]
    pub order: Option<Order>,
    /// What the EASD resample does to the rejected token: mask | scale:ALPHA (ALPHA in [0, 1)).
    #[arg(long, env = "EASD_PENALTY", value_parser = parse_penalty)]
    pub penalty: Option<Penalty>,
}

/// The defaults, resolved and validated.
#[derive(Clone, Debug, PartialEq)]
pub struct Defaults {
    pub mode: ModeKind,
    pub k: usize,
    pub easd: EasdParams,
}

impl EasdDefaultsArgs {
    pub fn resolve(&self) -> anyhow::Result<Defaults> {
        let mut easd = EasdParams::default();
        if let Some(path) = &self.calibration {
            let (tau_draft, tau_target) = read_calibration(path)?;
            (easd.tau_draft, easd.tau_target) = (tau_draft, tau_target);
        }
        easd.tau_draft = self.tau_draft.unwrap_or(easd.tau_draft);
        easd.tau_target = self.tau_target.unwrap_or(easd.tau_target);
        easd.rho = self.rho.unwrap_or(easd.rho);
        easd.top_n = self.top_n.unwrap_or(easd.top_n);
        easd.order = self.order.unwrap_or(easd.order);
        easd.penalty = self.penalty.unwrap_or(easd.penalty);
        easd.validate().map_err(|e| anyhow::anyhow!("invalid EASD default {}: {}", e.field, e.reason))?;
        easd_core::validate_block_size(self.k).map_err(|e| anyhow::anyhow!("invalid default k: {}", e.reason))?;
        Ok(Defaults { mode: self.mode, k: self.k, easd })
    }
}

/// The recommended (τ_draft, τ_target) of a calibration file. Only the fields needed here are read, so the
/// coordinator does not depend on the evaluation crate.
pub fn read_calibration(path: &Path) -> anyhow::Result<(f32, f32)> {
    #[derive(Deserialize)]
    struct File {
        format: String,
        recommended: Recommended,
    }
    #[derive(Deserialize)]
    struct Recommended {
        tau_draft: f32,
        tau_target: f32,
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("reading calibration {}", path.display()))?;
    let file: File = serde_json::from_str(&text).with_context(|| format!("parsing calibration {}", path.display()))?;
    if file.format != CALIBRATION_FORMAT {
        bail!("calibration {}: expected format {CALIBRATION_FORMAT}, got {:?}", path.display(), file.format);
    }
    Ok((file.recommended.tau_draft, file.recommended.tau_target))
}

fn parse_order(s: &str) -> Result<Order, String> {
    match s.trim().to_ascii_lowercase().replace('_', "-").as_str() {
        "after-sd" => Ok(Order::AfterSd),
        "gate" => Ok(Order::Gate),
        other => Err(format!("unknown order {other:?}: expected after-sd or gate")),
    }
}

fn parse_penalty(s: &str) -> Result<Penalty, String> {
    let s = s.trim().to_ascii_lowercase();
    if s == "mask" {
        return Ok(Penalty::Mask);
    }
    let alpha =
        s.strip_prefix("scale:").ok_or_else(|| format!("unknown penalty {s:?}: expected mask or scale:ALPHA"))?;
    match alpha.parse::<f32>() {
        Ok(a) if (0.0..1.0).contains(&a) => Ok(Penalty::Scale(a)),
        _ => Err(format!("penalty scale must be a number in [0, 1), got {alpha:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        defaults: EasdDefaultsArgs,
    }

    fn resolve(args: &[&str]) -> anyhow::Result<Defaults> {
        let cli = Cli::try_parse_from(std::iter::once("coordinator").chain(args.iter().copied()))?;
        cli.defaults.resolve()
    }

    fn calibration(dir: &Path, format: &str) -> PathBuf {
        let path = dir.join("calibration.json");
        let json = format!(
            r#"{{"format": "{format}", "method": "m", "recommended": {{"percentile": 60.0, "tau_draft": 1.25, "tau_target": 0.5}}}}"#
        );
        std::fs::write(&path, json).unwrap();
        path
    }

    #[test]
    fn without_flags_the_design_defaults_apply() {
        let d = resolve(&[]).unwrap();
        assert_eq!(d, Defaults { mode: ModeKind::Sd, k: 4, easd: EasdParams::default() });
    }

    #[test]
    fn flags_set_every_parameter_in_the_configmap_spelling() {
        let d = resolve(&[
            "--mode=easd",
            "--k=6",
            "--tau-draft=1.5",
            "--tau-target=0.9",
            "--rho=0.4",
            "--top-n=8",
            "--order=after_sd",
            "--penalty=scale:0.25",
        ])
        .unwrap();
        assert_eq!(d.mode, ModeKind::Easd);
        assert_eq!(d.k, 6);
        let expected = EasdParams {
            top_n: 8,
            rho: 0.4,
            tau_draft: 1.5,
            tau_target: 0.9,
            order: Order::AfterSd,
            penalty: Penalty::Scale(0.25),
        };
        assert_eq!(d.easd, expected);
        assert_eq!(resolve(&["--order=gate"]).unwrap().easd.order, Order::Gate);
    }

    #[test]
    fn the_calibration_sets_the_thresholds_and_explicit_flags_win() {
        let dir = tempfile::tempdir().unwrap();
        let path = calibration(dir.path(), CALIBRATION_FORMAT);
        let arg = format!("--calibration={}", path.display());
        let d = resolve(&[&arg]).unwrap();
        assert_eq!((d.easd.tau_draft, d.easd.tau_target), (1.25, 0.5));
        let d = resolve(&[&arg, "--tau-target=2.0"]).unwrap();
        assert_eq!((d.easd.tau_draft, d.easd.tau_target), (1.25, 2.0));
    }

    #[test]
    fn bad_values_are_clear_errors() {
        let err = |args: &[&str]| resolve(args).unwrap_err().to_string();
        assert!(err(&["--penalty=scale:1.5"]).contains("[0, 1)"));
        assert!(err(&["--penalty=zero"]).contains("mask or scale:ALPHA"));
        assert!(err(&["--order=before"]).contains("after-sd or gate"));
        assert!(err(&["--mode=fast"]).contains("sd, easd, target or draft"));
        assert!(err(&["--rho=1.5"]).contains("rho"));
        assert!(err(&["--k=0"]).contains("default k"));
        let dir = tempfile::tempdir().unwrap();
        let path = calibration(dir.path(), "other/9");
        assert!(err(&[&format!("--calibration={}", path.display())]).contains("expected format"));
    }
}
