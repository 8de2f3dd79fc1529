//! Opening GGUF files with clear errors, and typed access to their metadata.
//!
//! candle's reader reports a wrong magic or a short file as a generic error; we check the magic
//! ourselves and verify that every tensor lies inside the file before any weight is read, so a
//! truncated download fails at once with the tensor and byte counts, never mid-load.

use crate::error::{Error, Result};
use candle_core::quantized::gguf_file::{Content, TensorInfo, Value};
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// An opened, structurally validated GGUF file.
pub(crate) struct GgufFile {
    pub path: PathBuf,
    pub content: Content,
    pub reader: BufReader<File>,
    pub file_bytes: u64,
}

impl GgufFile {
    /// Opens `path`, reads the header and metadata, and checks the tensor extents.
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::NotFound(path.to_path_buf()),
            _ => Error::io(path, e),
        })?;
        let file_bytes = file.metadata().map_err(|e| Error::io(path, e))?.len();
        let mut reader = BufReader::new(file);
        let mut magic = [0u8; 4];
        let got = read_up_to(&mut reader, &mut magic).map_err(|e| Error::io(path, e))?;
        if &magic[..got] != b"GGUF" {
            return Err(Error::NotGguf { path: path.to_path_buf(), magic: magic[..got].to_vec() });
        }
        reader.seek(SeekFrom::Start(0)).map_err(|e| Error::io(path, e))?;
        let content = Content::read(&mut reader)
            .map_err(|e| Error::Corrupt { path: path.to_path_buf(), reason: format!("cannot read the header: {e}") })?;
        for (name, info) in &content.tensor_infos {
            let elems = info.shape.elem_count();
            let block = info.ggml_dtype.block_size();
            if elems % block != 0 {
                return Err(Error::Corrupt {
                    path: path.to_path_buf(),
                    reason: format!(
                        "tensor `{name}` has {elems} elements, not a multiple of the {:?} block size {block}",
                        info.ggml_dtype
                    ),
                });
            }
            let bytes = tensor_bytes(info) as u64;
            let end = content.tensor_data_offset + info.offset + bytes;
            if end > file_bytes {
                return Err(Error::Corrupt {
                    path: path.to_path_buf(),
                    reason: format!(
                        "tensor `{name}` ends at byte {end} but the file has only {file_bytes} bytes (truncated download?)"
                    ),
                });
            }
        }
        Ok(Self { path: path.to_path_buf(), content, reader, file_bytes })
    }

    /// Reads the metadata only, for the tokenizer (no tensor checks beyond the header).
    pub fn metadata_only(path: &Path) -> Result<Content> {
        Ok(Self::open(path)?.content)
    }
}

/// Bytes of a tensor's blocks in the file.
pub(crate) fn tensor_bytes(info: &TensorInfo) -> usize {
    info.shape.elem_count() / info.ggml_dtype.block_size() * info.ggml_dtype.type_size()
}

fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Typed metadata look-ups with errors that name the key.
pub(crate) struct Meta<'a>(pub &'a Content);

impl<'a> Meta<'a> {
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.0.metadata.get(key)
    }

    pub fn req(&self, key: &str) -> Result<&'a Value> {
        self.get(key).ok_or_else(|| Error::MissingMetadata(key.to_string()))
    }

    pub fn string(&self, key: &str) -> Result<&'a str> {
        self.req(key)?.to_string().map(String::as_str).map_err(|e| invalid(key, e))
    }

    pub fn opt_string(&self, key: &str) -> Option<&'a str> {
        self.get(key)?.to_string().ok().map(String::as_str)
    }

    pub fn usize(&self, key: &str) -> Result<usize> {
        value_usize(self.req(key)?).map_err(|reason| Error::InvalidMetadata { key: key.to_string(), reason })
    }

    pub fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(_) => self.usize(key).map(Some),
        }
    }

    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let f = match v {
            Value::F32(x) => *x as f64,
            Value::F64(x) => *x,
            other => {
                value_usize(other).map_err(|reason| Error::InvalidMetadata { key: key.to_string(), reason })? as f64
            }
        };
        Ok(Some(f))
    }

    pub fn opt_bool(&self, key: &str) -> Option<bool> {
        self.get(key)?.to_bool().ok()
    }

    pub fn strings(&self, key: &str) -> Result<Vec<&'a str>> {
        let arr = self.req(key)?.to_vec().map_err(|e| invalid(key, e))?;
        arr.iter().map(|v| v.to_string().map(String::as_str).map_err(|e| invalid(key, e))).collect()
    }
}

fn invalid(key: &str, e: candle_core::Error) -> Error {
    Error::InvalidMetadata { key: key.to_string(), reason: e.to_string() }
}

pub(crate) fn value_usize(v: &Value) -> std::result::Result<usize, String> {
    let n: i128 = match v {
        Value::U8(x) => *x as i128,
        Value::I8(x) => *x as i128,
        Value::U16(x) => *x as i128,
        Value::I16(x) => *x as i128,
        Value::U32(x) => *x as i128,
        Value::I32(x) => *x as i128,
        Value::U64(x) => *x as i128,
        Value::I64(x) => *x as i128,
        other => return Err(format!("expected an integer, got {other:?}")),
    };
    usize::try_from(n).map_err(|_| format!("expected a non-negative integer, got {n}"))
}
