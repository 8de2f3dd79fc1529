//! Model names to local files: the one function every flag that names a model goes through.
//!
//! A model name is one of
//! * `draft` / `target` — the default pair in the models folder ([`crate::pull`]);
//! * `hf:OWNER/NAME/FILE.gguf[@REVISION]` — a file of a hub repository, through the hub cache
//!   ([`crate::hub`]);
//! * anything else — a path to a GGUF file.

use crate::error::{Error, Result};
use crate::hub::{self, HubFile, HubSettings};
use crate::pull::{self, DefaultModel, default_models_dir};
use std::path::PathBuf;

/// A parsed model name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelSpec {
    Default(DefaultModel),
    Hub(HubFile),
    Path(PathBuf),
}

impl ModelSpec {
    pub fn parse(spec: &str) -> Result<ModelSpec> {
        Ok(match spec {
            "draft" => ModelSpec::Default(DefaultModel::Draft),
            "target" => ModelSpec::Default(DefaultModel::Target),
            _ => match HubFile::parse_spec(spec) {
                Some(file) => ModelSpec::Hub(file?),
                None => ModelSpec::Path(PathBuf::from(spec)),
            },
        })
    }
}

/// Where names are looked up.
#[derive(Clone, Debug)]
pub struct ModelSources {
    /// The default pair's folder.
    pub models_dir: PathBuf,
    pub hub: HubSettings,
    /// Show download progress on stderr.
    pub show_progress: bool,
}

impl ModelSources {
    /// For binaries: `models_dir` or [`default_models_dir`], the hub from the environment
    /// ([`HubSettings::from_env`]), progress shown.
    pub fn from_env(models_dir: Option<PathBuf>) -> ModelSources {
        ModelSources {
            models_dir: models_dir.unwrap_or_else(default_models_dir),
            hub: HubSettings::from_env(),
            show_progress: true,
        }
    }
}

/// The local file a model name stands for.
///
/// * `draft` / `target`: the verified default file; fetched first when `pull_if_missing`, else a
///   missing file is an error that says how to pull it.
/// * `hf:…`: the cached file, else downloaded and verified now — the name says where the file
///   comes from, so it is fetched whatever `pull_if_missing` says.
/// * a path: must be an existing file.
pub fn resolve_model(spec: &str, sources: &ModelSources, pull_if_missing: bool) -> Result<PathBuf> {
    match ModelSpec::parse(spec)? {
        ModelSpec::Path(path) => {
            if path.is_file() {
                Ok(path)
            } else {
                Err(Error::NotFound(path))
            }
        }
        ModelSpec::Hub(file) => Ok(hub::fetch(&file, &sources.hub, sources.show_progress)?.path),
        ModelSpec::Default(which) => {
            let dir = &sources.models_dir;
            let path = dir.join(which.file_name());
            if path.is_file() && pull::verify(&path, &which.spec())? {
                return Ok(path);
            }
            if pull_if_missing {
                return pull::pull(dir, which, sources.show_progress);
            }
            Err(Error::Pull {
                model: which.file_name().to_string(),
                reason: format!(
                    "not present and verified in {} (run `easd models pull --dir {}`)",
                    dir.display(),
                    dir.display()
                ),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::path::Path;

    fn sources(dir: &Path) -> ModelSources {
        ModelSources {
            models_dir: dir.to_path_buf(),
            hub: HubSettings {
                // Nothing listens on port 9 (discard): a request would fail, not hang.
                endpoint: Some("http://127.0.0.1:9".into()),
                cache_dir: dir.join("hub"),
                token: None,
            },
            show_progress: false,
        }
    }

    #[test]
    fn model_names_resolve_to_default_files_or_existing_paths() {
        let dir = tempfile::tempdir().unwrap();
        let s = sources(dir.path());
        assert!(matches!(resolve_model("/no/such/model.gguf", &s, false), Err(Error::NotFound(_))));
        let e = resolve_model("draft", &s, false).unwrap_err();
        assert!(e.to_string().contains("easd models pull"), "{e}");
        let local = dir.path().join("mine.gguf");
        fs::write(&local, b"GGUF").unwrap();
        assert_eq!(resolve_model(local.to_str().unwrap(), &s, false).unwrap(), local);
        let status = pull::list(dir.path());
        assert_eq!(status.len(), 2);
        assert!(status.iter().all(|s| !s.present && !s.verified));
    }

    #[test]
    fn names_parse_into_the_three_kinds() {
        assert_eq!(ModelSpec::parse("draft").unwrap(), ModelSpec::Default(DefaultModel::Draft));
        assert_eq!(ModelSpec::parse("target").unwrap(), ModelSpec::Default(DefaultModel::Target));
        assert_eq!(ModelSpec::parse("./target").unwrap(), ModelSpec::Path(PathBuf::from("./target")));
        let ModelSpec::Hub(f) = ModelSpec::parse("hf:o/n/m.gguf@v1").unwrap() else { panic!("not a hub file") };
        assert_eq!((f.repo.as_str(), f.file.as_str(), f.revision.as_str()), ("o/n", "m.gguf", "v1"));
    }

    #[test]
    fn a_malformed_hub_name_fails_before_any_request() {
        let dir = tempfile::tempdir().unwrap();
        let e = resolve_model("hf:o/n", &sources(dir.path()), true).unwrap_err();
        assert!(matches!(e, Error::InvalidModelSpec { .. }), "{e}");
    }

    #[test]
    fn an_unreachable_hub_is_an_error_naming_the_model_and_the_step() {
        let dir = tempfile::tempdir().unwrap();
        let e = resolve_model("hf:o/n/m.gguf", &sources(dir.path()), false).unwrap_err();
        assert!(matches!(e, Error::Hub { .. }), "{e}");
        let text = e.to_string();
        assert!(text.contains("hf:o/n/m.gguf") && text.contains("listing the files of o/n"), "{text}");
    }
}
