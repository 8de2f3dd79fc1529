//! `hf:` model names against a mock hub on loopback: the two routes `hf-hub` uses (the
//! repository listing and `resolve` with the headers its metadata step requires), serving a tiny
//! GGUF written from code. The endpoint and cache folder are passed explicitly, never through
//! the environment, so the tests run in parallel.

use axum::Router;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use easd_model::hub::{self, Verification};
use easd_model::{
    Error, HubFile, HubSettings, LoadOptions, Model, ModelSources, TinySpec, resolve_model, write_tiny_gguf,
};
use sha2::{Digest, Sha256};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// One file the mock serves.
#[derive(Clone)]
struct Served {
    repo: &'static str,
    file: &'static str,
    /// What the resolve route sends.
    body: Vec<u8>,
    /// Published as the LFS sha256 (listing and `x-linked-etag`); `None`: a plain git file.
    lfs_sha256: Option<String>,
}

/// A request the mock answered: path, revision as the route saw it, `Range` header.
#[derive(Clone, Debug)]
struct Seen {
    path: String,
    revision: String,
    range: Option<String>,
}

#[derive(Default)]
struct Hub {
    files: Vec<Served>,
    seen: Mutex<Vec<Seen>>,
}

impl Hub {
    fn record(&self, path: String, revision: &str, headers: &HeaderMap) {
        let range = headers.get(header::RANGE).and_then(|v| v.to_str().ok()).map(str::to_string);
        self.seen.lock().unwrap().push(Seen { path, revision: revision.to_string(), range });
    }
}

async fn listing(
    State(hub): State<Arc<Hub>>,
    UrlPath((owner, name, revision)): UrlPath<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let repo = format!("{owner}/{name}");
    hub.record(format!("/api/models/{repo}/revision/{revision}"), &revision, &headers);
    let siblings: Vec<serde_json::Value> = hub
        .files
        .iter()
        .filter(|f| f.repo == repo)
        .map(|f| match &f.lfs_sha256 {
            Some(sha) => serde_json::json!({
                "rfilename": f.file, "size": f.body.len(), "blobId": "b".repeat(40),
                "lfs": { "sha256": sha, "size": f.body.len(), "pointerSize": 134 }
            }),
            None => serde_json::json!({ "rfilename": f.file, "size": f.body.len(), "blobId": git_blob_id(&f.body) }),
        })
        .collect();
    if siblings.is_empty() {
        return (StatusCode::NOT_FOUND, "Repository not found").into_response();
    }
    let body = serde_json::json!({ "id": repo, "sha": COMMIT, "siblings": siblings });
    ([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

/// Serves `bytes=A-B` / `bytes=A-` ranges as 206 with `Content-Range`, as the hub does.
async fn resolve(
    State(hub): State<Arc<Hub>>,
    UrlPath((owner, name, revision, file)): UrlPath<(String, String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let repo = format!("{owner}/{name}");
    hub.record(format!("/{repo}/resolve/{revision}/{file}"), &revision, &headers);
    let Some(f) = hub.files.iter().find(|f| f.repo == repo && f.file == file) else {
        return (StatusCode::NOT_FOUND, "Entry not found").into_response();
    };
    let total = f.body.len();
    let (start, end) = match headers.get(header::RANGE).and_then(|v| v.to_str().ok()) {
        Some(range) => {
            let (a, b) = range.strip_prefix("bytes=").and_then(|r| r.split_once('-')).expect("a bytes range");
            let a: usize = a.parse().unwrap();
            let b: usize = if b.is_empty() { total - 1 } else { b.parse::<usize>().unwrap().min(total - 1) };
            (a, b)
        }
        None => (0, total - 1),
    };
    let mut response = f.body[start..=end].to_vec().into_response();
    let h = response.headers_mut();
    h.insert("x-repo-commit", COMMIT.parse().unwrap());
    h.insert(header::ACCEPT_RANGES, "bytes".parse().unwrap());
    match &f.lfs_sha256 {
        Some(sha) => {
            h.insert(header::ETAG, format!("\"{}\"", "c".repeat(40)).parse().unwrap());
            h.insert("x-linked-etag", format!("\"{sha}\"").parse().unwrap());
            h.insert("x-linked-size", total.to_string().parse().unwrap());
        }
        None => {
            h.insert(header::ETAG, format!("\"{}\"", git_blob_id(&f.body)).parse().unwrap());
        }
    }
    if headers.contains_key(header::RANGE) {
        h.insert(header::CONTENT_RANGE, format!("bytes {start}-{end}/{total}").parse().unwrap());
        *response.status_mut() = StatusCode::PARTIAL_CONTENT;
    }
    response
}

/// A stand-in for a git object id (40 hex digits, not a sha256).
fn git_blob_id(bytes: &[u8]) -> String {
    hex::encode(&Sha256::digest(bytes)[..20])
}

/// The mock hub on a loopback port, served by its own runtime until dropped.
struct MockHub {
    hub: Arc<Hub>,
    endpoint: String,
    _runtime: tokio::runtime::Runtime,
}

impl MockHub {
    fn start(files: Vec<Served>) -> MockHub {
        let hub = Arc::new(Hub { files, ..Hub::default() });
        let app = Router::new()
            .route("/api/models/{owner}/{name}/revision/{revision}", get(listing))
            .route("/{owner}/{name}/resolve/{revision}/{*file}", get(resolve))
            .with_state(hub.clone());
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        runtime.spawn(async move { axum::serve(listener, app).await });
        MockHub { hub, endpoint, _runtime: runtime }
    }

    fn seen(&self) -> Vec<Seen> {
        self.hub.seen.lock().unwrap().clone()
    }

    fn sources(&self, cache: &Path) -> ModelSources {
        ModelSources {
            models_dir: cache.join("easd-models"),
            hub: HubSettings { endpoint: Some(self.endpoint.clone()), cache_dir: cache.to_path_buf(), token: None },
            show_progress: false,
        }
    }
}

/// A tiny qwen2 GGUF's bytes.
fn tiny_gguf() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_tiny_gguf(&path, &TinySpec::qwen2(7)).unwrap();
    fs::read(path).unwrap()
}

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn lfs_file(repo: &'static str, file: &'static str, bytes: &[u8]) -> Served {
    Served { repo, file, body: bytes.to_vec(), lfs_sha256: Some(sha256(bytes)) }
}

fn spec(s: &str) -> HubFile {
    HubFile::parse_spec(s).unwrap().unwrap()
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() { out.extend(files_under(&path)) } else { out.push(path) }
    }
    out
}

#[test]
fn a_hub_file_arrives_byte_identical_verified_loads_and_comes_from_the_cache_next_time() {
    let bytes = tiny_gguf();
    let mock = MockHub::start(vec![lfs_file("acme/tiny-GGUF", "tiny-q8_0.gguf", &bytes)]);
    let cache = tempfile::tempdir().unwrap();
    let sources = mock.sources(cache.path());

    let fetched = hub::fetch(&spec("hf:acme/tiny-GGUF/tiny-q8_0.gguf"), &sources.hub, false).unwrap();
    assert_eq!(fetched.verification, Verification::Sha256(sha256(&bytes)));
    assert_eq!(fs::read(&fetched.path).unwrap(), bytes, "byte-identical");
    // The standard hub cache layout, so other hub tools share the file.
    let snapshot = cache.path().join("models--acme--tiny-GGUF/snapshots").join(COMMIT).join("tiny-q8_0.gguf");
    assert_eq!(fetched.path, snapshot);
    assert_eq!(fs::read_to_string(cache.path().join("models--acme--tiny-GGUF/refs/main")).unwrap(), COMMIT);
    let model = Model::load(&fetched.path, &LoadOptions::default()).unwrap();
    let tiny = TinySpec::qwen2(7);
    let info = model.info();
    assert_eq!(
        (&info.architecture, info.n_layers, info.hidden_size),
        (&tiny.architecture, tiny.n_layers, tiny.hidden_size)
    );
    assert_eq!(info.file_bytes, bytes.len() as u64);

    let seen = mock.seen();
    assert!(seen[0].path == "/api/models/acme/tiny-GGUF/revision/main", "{seen:?}");
    assert!(seen.iter().any(|s| s.path.ends_with("/resolve/main/tiny-q8_0.gguf")), "{seen:?}");

    // Every model flag goes through resolve_model: same file, no request.
    let again = resolve_model("hf:acme/tiny-GGUF/tiny-q8_0.gguf", &sources, false).unwrap();
    assert_eq!(again, fetched.path);
    assert_eq!(mock.seen().len(), seen.len(), "the second look-up made requests: {:?}", mock.seen());
    let cached = hub::fetch(&spec("hf:acme/tiny-GGUF/tiny-q8_0.gguf"), &sources.hub, false).unwrap();
    assert_eq!(cached.verification, Verification::Cached);
    assert_eq!(mock.seen().len(), seen.len());
}

#[test]
fn a_download_that_fails_its_published_sha256_is_a_clear_error_and_never_cached() {
    let bytes = tiny_gguf();
    let mut corrupted = bytes.clone();
    let middle = corrupted.len() / 2;
    corrupted[middle] ^= 0x5a;
    let published = sha256(&bytes);
    let served = Served { body: corrupted, ..lfs_file("acme/tiny-GGUF", "tiny.gguf", &bytes) };
    let mock = MockHub::start(vec![served]);
    let cache = tempfile::tempdir().unwrap();
    let sources = mock.sources(cache.path());

    let e = resolve_model("hf:acme/tiny-GGUF/tiny.gguf", &sources, true).unwrap_err();
    let Error::Checksum { expected, actual, .. } = &e else { panic!("not a checksum error: {e}") };
    assert_eq!(expected, &published);
    assert_ne!(actual, &published);
    assert!(e.to_string().contains("checksum mismatch") && e.to_string().contains(&published), "{e}");
    // Nothing of the bad download stays where a later look-up would find it.
    let left: Vec<PathBuf> = files_under(cache.path())
        .into_iter()
        .filter(|p| p.extension().is_none_or(|x| x != "lock") && !p.ends_with("refs/main"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let requests = mock.seen().len();
    resolve_model("hf:acme/tiny-GGUF/tiny.gguf", &sources, true).unwrap_err();
    assert!(mock.seen().len() > requests, "the failed file was served from the cache");
}

#[test]
fn a_file_without_a_published_sha256_is_reported_unverified() {
    let bytes = tiny_gguf();
    let plain = Served { repo: "acme/plain", file: "models/tiny.gguf", body: bytes.clone(), lfs_sha256: None };
    let mock = MockHub::start(vec![plain]);
    let cache = tempfile::tempdir().unwrap();
    let fetched = hub::fetch(&spec("hf:acme/plain/models/tiny.gguf"), &mock.sources(cache.path()).hub, false).unwrap();
    assert_eq!(fetched.verification, Verification::NotPublished);
    assert_eq!(fs::read(&fetched.path).unwrap(), bytes);
}

#[test]
fn a_revision_is_asked_for_and_cached_under_its_own_ref() {
    let bytes = tiny_gguf();
    let mock = MockHub::start(vec![lfs_file("acme/tiny-GGUF", "tiny.gguf", &bytes)]);
    let cache = tempfile::tempdir().unwrap();
    let sources = mock.sources(cache.path());
    let path = resolve_model("hf:acme/tiny-GGUF/tiny.gguf@v1.0", &sources, false).unwrap();
    assert_eq!(fs::read(&path).unwrap(), bytes);
    let seen = mock.seen();
    assert!(!seen.is_empty() && seen.iter().all(|s| s.revision == "v1.0"), "{seen:?}");
    assert_eq!(fs::read_to_string(cache.path().join("models--acme--tiny-GGUF/refs/v1.0")).unwrap(), COMMIT);
    // `main` was never fetched, so it is not in the cache.
    resolve_model("hf:acme/tiny-GGUF/tiny.gguf", &sources, false).unwrap();
    assert!(mock.seen().iter().any(|s| s.revision == "main"));
}

#[test]
fn an_interrupted_download_resumes_from_its_part_file_and_is_still_verified() {
    let bytes = tiny_gguf();
    let sha = sha256(&bytes);
    let mock = MockHub::start(vec![lfs_file("acme/tiny-GGUF", "tiny.gguf", &bytes)]);
    let cache = tempfile::tempdir().unwrap();
    let blobs = cache.path().join("models--acme--tiny-GGUF/blobs");
    fs::create_dir_all(&blobs).unwrap();
    let half = bytes.len() / 2;
    fs::write(blobs.join(format!("{sha}.part")), &bytes[..half]).unwrap();

    let fetched = hub::fetch(&spec("hf:acme/tiny-GGUF/tiny.gguf"), &mock.sources(cache.path()).hub, false).unwrap();
    assert_eq!(fetched.verification, Verification::Sha256(sha));
    assert_eq!(fs::read(&fetched.path).unwrap(), bytes);
    let ranges: Vec<Option<String>> =
        mock.seen().into_iter().filter(|s| s.path.contains("/resolve/")).map(|s| s.range).collect();
    assert!(ranges.contains(&Some(format!("bytes={half}-"))), "{ranges:?}");
}

#[test]
fn a_file_the_repository_lacks_is_named_with_the_files_it_has() {
    let bytes = tiny_gguf();
    let mock = MockHub::start(vec![
        lfs_file("acme/tiny-GGUF", "tiny-q8_0.gguf", &bytes),
        lfs_file("acme/tiny-GGUF", "tiny-f16.gguf", &bytes),
    ]);
    let cache = tempfile::tempdir().unwrap();
    let sources = mock.sources(cache.path());
    let e = resolve_model("hf:acme/tiny-GGUF/tiny-q4.gguf", &sources, false).unwrap_err();
    let text = e.to_string();
    assert!(text.contains("has no file `tiny-q4.gguf`") && text.contains("tiny-f16.gguf, tiny-q8_0.gguf"), "{text}");
    assert!(mock.seen().iter().all(|s| !s.path.contains("/resolve/")), "downloaded before checking the listing");

    let e = resolve_model("hf:acme/no-such-repo/x.gguf", &sources, false).unwrap_err();
    assert!(matches!(e, Error::Hub { .. }), "{e}");
    assert!(e.to_string().contains("listing the files of acme/no-such-repo"), "{e}");
}
