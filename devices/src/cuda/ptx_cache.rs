//! The on-disk cache of compiled kernels: one PTX file per (source, options,
//! architecture), named by the SHA-256 of the three, so any change to a kernel, a compiler
//! option or the GPU generation misses the cache and recompiles. Files are written
//! atomically (a temporary file in the same directory, renamed into place), so concurrent
//! processes and interrupted writes never leave a half-written entry.
//!
//! The default directory is `$FLM_CUDA_CACHE`, else `$XDG_CACHE_HOME/flm/cuda`, else
//! `$HOME/.cache/flm/cuda`.

use std::io::Write;
use std::path::{Path, PathBuf};

use flm_core::{Error, Result};
use sha2::{Digest, Sha256};

/// A directory of cached PTX files.
#[derive(Debug, Clone)]
pub struct PtxCache {
    dir: PathBuf,
}

impl PtxCache {
    /// A cache in `dir` (created on the first write).
    pub fn new(dir: impl Into<PathBuf>) -> PtxCache {
        PtxCache { dir: dir.into() }
    }

    /// The cache in the default directory (see the module docs); `None` when neither
    /// `FLM_CUDA_CACHE`, `XDG_CACHE_HOME` nor `HOME` is set.
    pub fn default_location() -> Option<PtxCache> {
        let env = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let dir = env("FLM_CUDA_CACHE")
            .or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("flm/cuda")))
            .or_else(|| env("HOME").map(|d| d.join(".cache/flm/cuda")))?;
        Some(PtxCache::new(dir))
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cache key: lowercase hex SHA-256 over the source, each option and the
    /// architecture, each followed by a NUL byte (so no two different triples hash the
    /// same bytes).
    pub fn key(source: &str, options: &[String], arch: &str) -> String {
        let mut h = Sha256::new();
        for part in std::iter::once(source)
            .chain(options.iter().map(String::as_str))
            .chain(std::iter::once(arch))
        {
            h.update(part.as_bytes());
            h.update([0u8]);
        }
        h.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The file of an entry.
    pub fn path(&self, source: &str, options: &[String], arch: &str) -> PathBuf {
        self.dir
            .join(format!("{}.ptx", PtxCache::key(source, options, arch)))
    }

    /// The cached PTX, if there is a readable entry.
    pub fn get(&self, source: &str, options: &[String], arch: &str) -> Option<String> {
        std::fs::read_to_string(self.path(source, options, arch))
            .ok()
            .filter(|ptx| !ptx.is_empty())
    }

    /// Stores `ptx` atomically; returns the entry's path.
    ///
    /// Errors: [`Error::Io`] when the directory cannot be created or written.
    pub fn put(&self, source: &str, options: &[String], arch: &str, ptx: &str) -> Result<PathBuf> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| Error::Io { path, source }
        };
        std::fs::create_dir_all(&self.dir).map_err(io(&self.dir))?;
        let path = self.path(source, options, arch);
        let mut tmp = tempfile::NamedTempFile::new_in(&self.dir).map_err(io(&self.dir))?;
        tmp.write_all(ptx.as_bytes()).map_err(io(tmp.path()))?;
        tmp.persist(&path).map_err(|e| Error::Io {
            path: path.clone(),
            source: e.error,
        })?;
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn key_changes_with_source_options_and_arch() {
        let base = PtxCache::key("k", &opts(&["-a"]), "compute_90");
        assert_eq!(base.len(), 64);
        assert_eq!(base, PtxCache::key("k", &opts(&["-a"]), "compute_90"));
        assert_ne!(base, PtxCache::key("k2", &opts(&["-a"]), "compute_90"));
        assert_ne!(base, PtxCache::key("k", &opts(&["-b"]), "compute_90"));
        assert_ne!(base, PtxCache::key("k", &opts(&["-a"]), "compute_80"));
        // The separators keep shifted boundaries apart.
        assert_ne!(
            PtxCache::key("ab", &opts(&["c"]), "x"),
            PtxCache::key("a", &opts(&["bc"]), "x")
        );
    }

    #[test]
    fn put_then_get_reuses_the_entry_and_leaves_no_temporary_files() {
        let dir = tempfile::tempdir().unwrap();
        let cache = PtxCache::new(dir.path().join("nested/cuda"));
        let o = opts(&["--std=c++17"]);
        assert_eq!(cache.get("src", &o, "compute_90"), None);
        let path = cache.put("src", &o, "compute_90", ".version 8.0").unwrap();
        assert_eq!(
            cache.get("src", &o, "compute_90").as_deref(),
            Some(".version 8.0")
        );
        assert_eq!(cache.get("src", &o, "compute_80"), None);
        cache.put("src", &o, "compute_90", ".version 8.1").unwrap();
        assert_eq!(
            cache.get("src", &o, "compute_90").as_deref(),
            Some(".version 8.1")
        );
        let files: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(files, vec![path.file_name().unwrap().to_owned()]);
    }

    #[test]
    fn unwritable_directory_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("not-a-dir");
        std::fs::write(&file, b"x").unwrap();
        let cache = PtxCache::new(file.join("cuda"));
        assert!(matches!(
            cache.put("s", &[], "compute_90", "p"),
            Err(Error::Io { .. })
        ));
    }
}
