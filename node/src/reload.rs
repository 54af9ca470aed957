//! The node config file, read again when it changes: the one hot-reload
//! both plugins use, with one set of rules.
//!
//! - At start a file that cannot be read or is not valid is an error: there
//!   is no older config to keep, and built-in defaults in place of a config
//!   an admin wrote would slice GPUs in a way nobody asked for.
//! - Later, a new valid file is put in force at once; a new invalid one is
//!   logged (once per content) and the config in force stays; a file that
//!   cannot be read is logged (once, until it can be again) and the config
//!   in force stays. The same bytes again are nothing new.
//!
//! When to look is the caller's: the device plugin looks on a timer, the
//! DRA plugin each time it needs the config (a prepare, a status to
//! publish). Either way a change is seen at the next look.

use std::path::{Path, PathBuf};

use crate::config::{Config, ConfigError};

/// The file, and what was last read from it.
#[derive(Debug)]
pub struct ConfigReloader {
    path: PathBuf,
    last: Vec<u8>,
    read_failed: bool,
}

fn parse(path: &Path, bytes: &[u8]) -> Result<Config, ConfigError> {
    let text = std::str::from_utf8(bytes).map_err(|e| ConfigError::Io {
        path: path.display().to_string(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    })?;
    Config::parse(text)
}

impl ConfigReloader {
    /// Reads the file at start: the reloader and the config in force.
    pub fn open(path: &Path) -> Result<(Self, Config), ConfigError> {
        let bytes = std::fs::read(path).map_err(|source| ConfigError::Io {
            path: path.display().to_string(),
            source,
        })?;
        let config = parse(path, &bytes)?;
        let me = Self {
            path: path.to_owned(),
            last: bytes,
            read_failed: false,
        };
        Ok((me, config))
    }

    /// The file watched.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// One look at the file: the new config when the file changed to a
    /// valid one; None when it did not change, is invalid or cannot be read
    /// (logged as the module docs say).
    pub fn poll(&mut self) -> Option<Config> {
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => {
                self.read_failed = false;
                b
            }
            Err(e) => {
                if !self.read_failed {
                    tracing::warn!(path = %self.path.display(), error = %e, "cannot read the node config; the config in force stays");
                    self.read_failed = true;
                }
                return None;
            }
        };
        if bytes == self.last {
            return None;
        }
        let result = parse(&self.path, &bytes);
        self.last = bytes;
        match result {
            Ok(config) => {
                tracing::info!(path = %self.path.display(), "node config reloaded");
                Some(config)
            }
            Err(e) => {
                tracing::error!(path = %self.path.display(), error = %e, "the new node config is not valid; the config in force stays");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_change_is_taken_and_anything_else_keeps_the_config() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config.yaml");
        let four = "default:\n  slice: {slicesPerGpu: 4}\n";
        std::fs::write(&path, four).expect("write");
        let (mut r, c) = ConfigReloader::open(&path).expect("open");
        assert_eq!(c, Config::parse(four).expect("parse"));
        assert!(r.poll().is_none(), "unchanged");

        std::fs::write(&path, "default:\n  slice: {slicesPerGpu: 0}\n").expect("write");
        assert!(r.poll().is_none(), "invalid: the config in force stays");
        std::fs::write(&path, [0xff, 0xfe]).expect("write");
        assert!(r.poll().is_none(), "not UTF-8");
        std::fs::remove_file(&path).expect("rm");
        assert!(r.poll().is_none(), "unreadable");
        assert!(r.read_failed);

        let two = "default:\n  slice: {slicesPerGpu: 2}\n";
        std::fs::write(&path, two).expect("write");
        assert_eq!(r.poll(), Some(Config::parse(two).expect("parse")));
        assert!(!r.read_failed);
        // Back to an earlier content is a change too.
        std::fs::write(&path, four).expect("write");
        assert_eq!(r.poll(), Some(c));
    }

    #[test]
    fn at_start_a_bad_or_missing_file_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config.yaml");
        let e = ConfigReloader::open(&path).unwrap_err();
        assert!(e.to_string().contains("config.yaml"), "{e}");
        std::fs::write(&path, "default: {placement: nowhere}\n").expect("write");
        assert!(ConfigReloader::open(&path).is_err());
    }
}
