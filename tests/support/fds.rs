//! A running Sluice's open descriptors, from /proc: what the tests under load count
//! to tell that nothing a closed connection had is left open.

use super::Sluice;

impl Sluice {
    /// The process's open files, from /proc.
    pub fn open_files(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    /// The process's open sockets (listeners, clients, servers), from /proc.
    pub fn open_sockets(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map(|d| {
                d.flatten()
                    .filter_map(|f| std::fs::read_link(f.path()).ok())
                    .filter(|t| t.to_string_lossy().starts_with("socket:"))
                    .count()
            })
            .unwrap_or(0)
    }
}
