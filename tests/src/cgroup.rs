//! A memory cgroup of its own for a process under test (v2 or v1, as the
//! machine has them), so that it runs under a container's memory limit; its
//! peak and OOM kills read back.

use std::path::{Path, PathBuf};

const ROOT: &str = "/sys/fs/cgroup";

#[derive(Debug)]
pub struct MemoryCgroup {
    dir: PathBuf,
    v2: bool,
}

impl MemoryCgroup {
    /// A new cgroup named `name` (and this process's id) limited to `limit`
    /// bytes; an error names what could not be done.
    pub fn create(name: &str, limit: u64) -> Result<MemoryCgroup, String> {
        let root = Path::new(ROOT);
        let v2 = root.join("cgroup.controllers").exists();
        let name = format!("placement-tests-{name}-{}", std::process::id());
        let dir = if v2 {
            let controllers = root.join("cgroup.subtree_control");
            let enabled = std::fs::read_to_string(&controllers).unwrap_or_default();
            if !enabled.split_whitespace().any(|c| c == "memory") {
                std::fs::write(&controllers, "+memory").map_err(|e| {
                    format!(
                        "enable the memory controller in {}: {e}",
                        controllers.display()
                    )
                })?;
            }
            root.join(name)
        } else {
            root.join("memory").join(name)
        };
        std::fs::create_dir(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let cgroup = MemoryCgroup { dir, v2 };
        let file = if v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        std::fs::write(cgroup.dir.join(file), limit.to_string())
            .map_err(|e| format!("set {file}: {e}"))?;
        Ok(cgroup)
    }

    /// The file a process writes its id into to join.
    pub fn procs(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// The most memory the cgroup's processes have used (page cache
    /// included), if the kernel reports it.
    pub fn peak(&self) -> Option<u64> {
        let file = if self.v2 {
            "memory.peak"
        } else {
            "memory.max_usage_in_bytes"
        };
        std::fs::read_to_string(self.dir.join(file))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Processes the kernel killed for lack of memory in this cgroup.
    pub fn oom_kills(&self) -> u64 {
        let file = if self.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        std::fs::read_to_string(self.dir.join(file))
            .unwrap_or_else(|e| panic!("read {file}: {e}"))
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("{file} has no oom_kill line"))
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        // Empty once its processes have exited, which takes a moment.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}
