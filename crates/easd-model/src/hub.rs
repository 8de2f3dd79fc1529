//! GGUF files from HF-style model repositories: `hf:OWNER/NAME/FILE.gguf[@REVISION]`.
//!
//! `hf-hub` (its blocking API over ureq + rustls) does the transfer and owns the cache, in the
//! standard hub layout shared with other tools: under the hub cache folder, per repository,
//! `blobs/<etag>` (written as `<etag>.part` and renamed when complete; an interrupted download
//! resumes from the `.part` file), `snapshots/<commit>/<file>` (a link to the blob) and
//! `refs/<revision>` (the commit a branch or tag pointed to when it was fetched).
//!
//! On top of it, [`fetch`]:
//! * looks in the cache first — a file already there for that revision is returned without any
//!   request (pin a commit as the revision for reproducibility; delete the ref to refresh);
//! * otherwise lists the repository at the revision (`/api/models/{repo}/revision/{rev}` with
//!   blob metadata), so a misspelt file name fails before any transfer with the GGUF files the
//!   repository does have, and learns the file's size and, for files stored with LFS, its
//!   sha256;
//! * downloads through `hf-hub` with the project's progress bar;
//! * checks the size and the sha256 — the listing's, and the blob's etag when that is a sha256
//!   (LFS files' `x-linked-etag`) — and on a mismatch deletes the download so the cache never
//!   serves it. Files not stored with LFS have no published sha256 (their etag is a git object
//!   id); they are reported as [`Verification::NotPublished`], never silently as verified.
//!
//! The endpoint and cache folder are passed in ([`HubSettings`]); only
//! [`HubSettings::from_env`], called by the binaries, reads `HF_ENDPOINT`, `HF_HOME`,
//! `HF_HUB_CACHE` and `HF_TOKEN`.

use crate::error::{Error, Result};
use crate::pull::{progress_bar, sha256_file};
use hf_hub::api::Progress;
use hf_hub::api::sync::{ApiBuilder, ApiError};
use hf_hub::{Cache, Repo, RepoType};
use serde::Deserialize;
use std::fmt;
use std::fs;
use std::path::{Component, Path, PathBuf};

/// The prefix that marks a model name as a hub file.
pub const HUB_PREFIX: &str = "hf:";

/// The revision used when none is given.
pub const DEFAULT_REVISION: &str = "main";

/// One file of a model repository at a revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HubFile {
    /// `OWNER/NAME`.
    pub repo: String,
    /// Path of the file inside the repository (may contain folders).
    pub file: String,
    /// Branch, tag or commit.
    pub revision: String,
}

impl HubFile {
    /// Checks the parts: `OWNER/NAME` with two non-empty segments, a relative `.gguf` file path
    /// without `.`/`..` segments (it becomes a path inside the cache), a non-empty revision.
    pub fn new(repo: &str, file: &str, revision: Option<&str>) -> Result<HubFile> {
        let revision = revision.unwrap_or(DEFAULT_REVISION);
        let shown = format!("{HUB_PREFIX}{repo}/{file}@{revision}");
        let bad = |reason: &str| Error::InvalidModelSpec { spec: shown.clone(), reason: reason.to_string() };
        let segments: Vec<&str> = repo.split('/').collect();
        if segments.len() != 2 || segments.iter().any(|s| !plain_segment(s)) {
            return Err(bad("the repository must be OWNER/NAME"));
        }
        if file.is_empty()
            || file.starts_with('/')
            || !Path::new(file).components().all(|c| matches!(c, Component::Normal(_)))
            || file.split('/').any(|s| !plain_segment(s))
        {
            return Err(bad("the file must be a path inside the repository, without `.` or `..` segments"));
        }
        if !file.to_ascii_lowercase().ends_with(".gguf") {
            return Err(bad("only GGUF files can be loaded (the file name must end in .gguf)"));
        }
        if revision.is_empty() || revision.split('/').any(|s| !plain_segment(s)) {
            return Err(bad("the revision must be a branch, tag or commit"));
        }
        Ok(HubFile { repo: repo.to_string(), file: file.to_string(), revision: revision.to_string() })
    }

    /// Parses `hf:OWNER/NAME/FILE.gguf[@REVISION]`; `None` when `spec` lacks the `hf:` prefix.
    /// FILE may contain folders; REVISION may contain `/` (e.g. `refs/pr/1`).
    pub fn parse_spec(spec: &str) -> Option<Result<HubFile>> {
        let rest = spec.strip_prefix(HUB_PREFIX)?;
        let (path, revision) = match rest.rsplit_once('@') {
            Some((path, revision)) => (path, Some(revision)),
            None => (rest, None),
        };
        let mut parts = path.splitn(3, '/');
        let (Some(owner), Some(name), Some(file)) = (parts.next(), parts.next(), parts.next()) else {
            return Some(Err(Error::InvalidModelSpec {
                spec: spec.to_string(),
                reason: "expected hf:OWNER/NAME/FILE.gguf or hf:OWNER/NAME/FILE.gguf@REVISION".into(),
            }));
        };
        Some(HubFile::new(&format!("{owner}/{name}"), file, revision))
    }

    fn hf_repo(&self) -> Repo {
        Repo::with_revision(self.repo.clone(), RepoType::Model, self.revision.clone())
    }
}

impl fmt::Display for HubFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{HUB_PREFIX}{}/{}", self.repo, self.file)?;
        if self.revision != DEFAULT_REVISION {
            write!(f, "@{}", self.revision)?;
        }
        Ok(())
    }
}

/// Not empty, not `.`/`..`, no whitespace, control characters, `\`, `?` or `#` (which would
/// change the request URL or the cache path).
fn plain_segment(s: &str) -> bool {
    !s.is_empty()
        && s != "."
        && s != ".."
        && !s.chars().any(|c| c.is_whitespace() || c.is_control() || "\\?#".contains(c))
}

/// Where the hub is and where its files are cached.
#[derive(Clone, Debug)]
pub struct HubSettings {
    /// Base URL of the hub (`HF_ENDPOINT`); `None` is `hf-hub`'s default, the public hub.
    pub endpoint: Option<String>,
    /// The hub cache folder (the one holding `models--OWNER--NAME`).
    pub cache_dir: PathBuf,
    /// Bearer token for private or gated repositories.
    pub token: Option<String>,
}

impl HubSettings {
    /// The settings other hub tools use: `HF_ENDPOINT`; the cache at `HF_HUB_CACHE`, else
    /// `HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`;
    /// the token from `HF_TOKEN`, else the `token` file in `HF_HOME` (or its default).
    /// For binaries: libraries and tests pass settings explicitly.
    pub fn from_env() -> HubSettings {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        let home = var("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
            var("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| dirs::home_dir().map(|h| h.join(".cache")))
                .unwrap_or_else(|| PathBuf::from(".cache"))
                .join("huggingface")
        });
        let cache_dir = var("HF_HUB_CACHE").map(PathBuf::from).unwrap_or_else(|| home.join("hub"));
        let token = var("HF_TOKEN")
            .and_then(|t| t.into_string().ok())
            .or_else(|| fs::read_to_string(home.join("token")).ok())
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty());
        let endpoint = var("HF_ENDPOINT").and_then(|e| e.into_string().ok());
        HubSettings { endpoint, cache_dir, token }
    }

    fn endpoint_name(&self) -> &str {
        self.endpoint.as_deref().unwrap_or("the default hub")
    }
}

/// How the fetched file was checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verification {
    /// Downloaded now; its sha256 matches the one the repository publishes.
    Sha256(String),
    /// Downloaded now; the repository publishes no sha256 for it (not stored with LFS), so only
    /// its size was checked.
    NotPublished,
    /// Found in the cache, not downloaded or re-hashed (files this module downloads are
    /// verified before they enter the cache).
    Cached,
}

/// A file on local disk.
#[derive(Clone, Debug)]
pub struct Fetched {
    /// The file in the cache's snapshot folder.
    pub path: PathBuf,
    pub verification: Verification,
}

/// The local path of `file`: from the cache, else downloaded and verified (see the module doc).
pub fn fetch(file: &HubFile, hub: &HubSettings, show_progress: bool) -> Result<Fetched> {
    let cache = Cache::new(hub.cache_dir.clone());
    if let Some(path) = cache.repo(file.hf_repo()).get(&file.file) {
        return Ok(Fetched { path, verification: Verification::Cached });
    }
    let failed = |context: String| {
        let spec = file.to_string();
        move |source: ApiError| Error::Hub { spec, context, source: Box::new(source) }
    };
    let mut builder = ApiBuilder::from_cache(cache).with_progress(false).with_token(hub.token.clone()).with_retries(3);
    if let Some(endpoint) = &hub.endpoint {
        builder = builder.with_endpoint(endpoint.trim_end_matches('/').to_string());
    }
    let api = builder.build().map_err(failed("setting up the hub client".into()))?;
    let repo = api.repo(file.hf_repo());

    let listing_context =
        format!("listing the files of {} at revision {} on {}", file.repo, file.revision, hub.endpoint_name());
    let listing: Listing = repo
        .info_request()
        .query("blobs", "true")
        .call()
        .and_then(|mut response| response.body_mut().read_json())
        .map_err(|e| failed(listing_context)(ApiError::from(Box::new(e))))?;
    let Some(entry) = listing.siblings.iter().find(|s| s.rfilename == file.file) else {
        let mut ggufs: Vec<&str> = listing
            .siblings
            .iter()
            .map(|s| s.rfilename.as_str())
            .filter(|n| n.to_ascii_lowercase().ends_with(".gguf"))
            .collect();
        ggufs.sort_unstable();
        let have = if ggufs.is_empty() { "none".to_string() } else { ggufs.join(", ") };
        return Err(Error::Pull {
            model: file.to_string(),
            reason: format!(
                "{} has no file `{}` at revision {}; its GGUF files: {have}",
                file.repo, file.file, file.revision
            ),
        });
    };

    let bar = progress_bar(show_progress, &file.file, entry.size().unwrap_or(0));
    let path = repo
        .download_with_progress(&file.file, Bar(bar))
        .map_err(failed(format!("downloading from {}", hub.endpoint_name())))?;
    let verification = verify_download(file, &path, entry).inspect_err(|_| discard(&path))?;
    if verification == Verification::NotPublished {
        tracing::warn!(
            model = %file,
            "the repository publishes no sha256 for this file (not stored with LFS): only its size was checked"
        );
    }
    Ok(Fetched { path, verification })
}

/// Size against the listing; sha256 against the listing's LFS hash and the blob's etag where
/// that is a sha256 (both, when both are there).
fn verify_download(file: &HubFile, path: &Path, entry: &Sibling) -> Result<Verification> {
    let len = fs::metadata(path).map_err(|e| Error::io(path, e))?.len();
    if let Some(size) = entry.size()
        && size != len
    {
        return Err(Error::Pull {
            model: file.to_string(),
            reason: format!("downloaded {len} bytes, the repository lists {size}; the download was deleted"),
        });
    }
    let etag = fs::read_link(path).ok().and_then(|blob| blob.file_name().and_then(|n| n.to_str()).map(str::to_string));
    let mut expected: Vec<String> = entry.lfs.iter().map(|l| l.sha256.to_ascii_lowercase()).collect();
    expected.extend(etag.filter(|e| is_sha256(e)).map(|e| e.to_ascii_lowercase()));
    expected.dedup();
    if expected.is_empty() {
        return Ok(Verification::NotPublished);
    }
    let actual = sha256_file(path)?;
    match expected.iter().find(|want| **want != actual) {
        Some(want) => Err(Error::Checksum { path: path.to_path_buf(), expected: want.clone(), actual }),
        None => Ok(Verification::Sha256(actual)),
    }
}

/// Removes a download that failed verification: the blob and the snapshot's link to it.
fn discard(path: &Path) {
    if let Ok(blob) = fs::canonicalize(path) {
        let _ = fs::remove_file(blob);
    }
    let _ = fs::remove_file(path);
}

fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The parts of the repository listing this module reads.
#[derive(Debug, Deserialize)]
struct Listing {
    siblings: Vec<Sibling>,
}

#[derive(Debug, Deserialize)]
struct Sibling {
    rfilename: String,
    #[serde(default)]
    size: Option<u64>,
    #[serde(default)]
    lfs: Option<Lfs>,
}

impl Sibling {
    fn size(&self) -> Option<u64> {
        self.lfs.as_ref().and_then(|l| l.size).or(self.size)
    }
}

#[derive(Debug, Deserialize)]
struct Lfs {
    sha256: String,
    #[serde(default)]
    size: Option<u64>,
}

/// The project's progress bar behind `hf-hub`'s progress callbacks. `hf-hub` calls `init` again
/// for each (resumed) request, followed by `update(bytes already on disk)`.
struct Bar(indicatif::ProgressBar);

impl Progress for Bar {
    fn init(&mut self, size: usize, _filename: &str) {
        self.0.set_length(size as u64);
        self.0.set_position(0);
    }

    fn update(&mut self, size: usize) {
        self.0.inc(size as u64);
    }

    fn finish(&mut self) {
        self.0.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(spec: &str) -> Result<HubFile> {
        HubFile::parse_spec(spec).expect("has the hf: prefix")
    }

    #[test]
    fn specs_name_owner_repository_file_and_revision() {
        let f = parse("hf:Qwen/Qwen2.5-0.5B-GGUF/qwen2.5-0.5b-q4_k_m.gguf").unwrap();
        assert_eq!(
            f,
            HubFile {
                repo: "Qwen/Qwen2.5-0.5B-GGUF".into(),
                file: "qwen2.5-0.5b-q4_k_m.gguf".into(),
                revision: "main".into()
            }
        );
        assert_eq!(f.to_string(), "hf:Qwen/Qwen2.5-0.5B-GGUF/qwen2.5-0.5b-q4_k_m.gguf");
        let f = parse("hf:o/n/Q4_K_M/model.GGUF@refs/pr/1").unwrap();
        assert_eq!((f.repo.as_str(), f.file.as_str(), f.revision.as_str()), ("o/n", "Q4_K_M/model.GGUF", "refs/pr/1"));
        assert_eq!(f.to_string(), "hf:o/n/Q4_K_M/model.GGUF@refs/pr/1");
        assert!(HubFile::parse_spec("draft").is_none());
        assert!(HubFile::parse_spec("/models/hf:x.gguf").is_none());
    }

    #[test]
    fn malformed_specs_say_what_is_wrong() {
        for (spec, says) in [
            ("hf:o/n", "expected hf:OWNER/NAME/FILE.gguf"),
            ("hf:o//f.gguf", "OWNER/NAME"),
            ("hf:o/n/", "path inside the repository"),
            ("hf:o/n/../../../etc/x.gguf", "path inside the repository"),
            ("hf:o/n/a//b.gguf", "path inside the repository"),
            ("hf:o/n/model.safetensors", "must end in .gguf"),
            ("hf:o/n/m.gguf@", "revision"),
            ("hf:o/n/m.gguf@a/../b", "revision"),
            ("hf:o/n/m x.gguf", "path inside the repository"),
        ] {
            let e = parse(spec).unwrap_err();
            assert!(matches!(e, Error::InvalidModelSpec { .. }), "{spec}: {e}");
            assert!(e.to_string().contains(says), "{spec}: {e}");
        }
        let e = HubFile::new("just-a-name", "m.gguf", None).unwrap_err();
        assert!(e.to_string().contains("OWNER/NAME"), "{e}");
    }

    #[test]
    fn sha256_etags_are_told_from_git_object_ids() {
        assert!(is_sha256(&"a".repeat(64)));
        assert!(is_sha256(&"0123456789ABCDEF".repeat(4)));
        assert!(!is_sha256(&"a".repeat(40)));
        assert!(!is_sha256(&"g".repeat(64)));
    }
}
