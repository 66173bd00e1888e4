//! A scratch directory for the config readers' unit tests.

use std::path::PathBuf;

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// `tag` keeps the tests of one module apart from another's; the process id, from
    /// another test run's.
    pub fn new(tag: &str, name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("sluice-{tag}-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
