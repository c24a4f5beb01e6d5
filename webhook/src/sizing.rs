//! Memory defaults that fit the container. A process whose memory limit
//! (its cgroup's) is lower than the fixed defaults would be killed before
//! its own limits refuse anything: with a limit, the request budget, the
//! embedded engine's heap ceiling, the largest single review and the
//! connection cap are derived from it, unless given.

use std::path::Path;

const MIB: u64 = 1024 * 1024;

/// Kept for the process itself: code, the engine's compiled policies and
/// data, the allocator's slack (about 35 MiB at rest, measured).
const BASELINE: u64 = 64 * MIB;

/// What one open connection may hold: TLS records in both directions (16 KiB
/// each, and their plaintext), the HTTP/1 head buffer (up to 64 KiB).
pub(crate) const PER_CONNECTION: u64 = 96 * 1024;

/// The fixed defaults (no memory limit).
const BUDGET: u64 = 256 * MIB;
const REQUEST: u64 = 64 * MIB;
const ENGINE: u64 = 1024 * MIB;

/// Limits of this magnitude mean "no limit" (cgroup v1 reports 2^63 rounded
/// down to a page).
const UNLIMITED: u64 = 1 << 60;

/// The memory limits in force and where they come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MemorySizing {
    /// The container's memory limit, if any.
    pub(crate) container_limit: Option<u64>,
    pub(crate) memory_budget: usize,
    pub(crate) max_request_memory: usize,
    pub(crate) engine_memory_limit: usize,
    /// Open admission connections the limit leaves room for (`None`: no limit).
    pub(crate) max_connections: Option<usize>,
}

/// The flags as given (`None`: not given).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Requested {
    pub(crate) memory_budget: Option<usize>,
    pub(crate) max_request_memory: Option<usize>,
    pub(crate) engine_memory_limit: Option<usize>,
}

impl MemorySizing {
    /// Defaults for a container limited to `limit` bytes (`None`: the fixed
    /// defaults); what `requested` gives wins.
    pub(crate) fn new(limit: Option<u64>, requested: Requested) -> MemorySizing {
        let size = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        let (budget, engine, connections) = match limit {
            None => (BUDGET, ENGINE, None),
            Some(limit) => (
                // Half of what the process itself leaves: the rest covers the
                // connections, the engine's evaluations and the allocator
                // keeping freed memory for a while.
                BUDGET.min(limit.saturating_sub(BASELINE) / 2),
                // Below the limit, so that a runaway evaluation stops before
                // the kernel kills the process.
                ENGINE.min(limit - limit / 8),
                Some(size(limit / 8 / PER_CONNECTION).max(1)),
            ),
        };
        let memory_budget = requested.memory_budget.unwrap_or(size(budget));
        // At most three quarters of the budget, or no review that large could
        // ever be admitted (`budget.rs`).
        let request = REQUEST.min(memory_budget as u64 / 4 * 3);
        MemorySizing {
            container_limit: limit,
            memory_budget,
            max_request_memory: requested.max_request_memory.unwrap_or(size(request)),
            engine_memory_limit: requested.engine_memory_limit.unwrap_or(size(engine)),
            max_connections: connections,
        }
    }
}

/// The memory limit of this process's cgroup (v2, or v1's hierarchical
/// limit), if one is set.
pub(crate) fn container_memory_limit() -> Option<u64> {
    let membership = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let root = Path::new("/sys/fs/cgroup");
    if root.join("cgroup.controllers").exists() {
        let path = membership.lines().find_map(|l| l.strip_prefix("0::"))?;
        // The lowest limit on the way up (inside a container the path is
        // usually `/`, its own cgroup).
        let mut dir = root.join(path.trim_start_matches('/'));
        let mut lowest: Option<u64> = None;
        while dir.starts_with(root) {
            if let Ok(text) = std::fs::read_to_string(dir.join("memory.max"))
                && let Some(limit) = v2_limit(&text)
            {
                lowest = Some(lowest.map_or(limit, |l| l.min(limit)));
            }
            if !dir.pop() {
                break;
            }
        }
        return lowest;
    }
    let path = membership.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then_some(path)
    })?;
    let memory = root.join("memory");
    // Without a cgroup namespace the path is the host's; a container's mount
    // then shows its own cgroup at the root.
    [memory.join(path.trim_start_matches('/')), memory]
        .iter()
        .find_map(|dir| std::fs::read_to_string(dir.join("memory.stat")).ok())
        .and_then(|stat| v1_limit(&stat))
}

/// `memory.max`: a byte count, or `max`.
fn v2_limit(text: &str) -> Option<u64> {
    text.trim().parse().ok().filter(|n| *n < UNLIMITED)
}

/// `memory.stat`'s `hierarchical_memory_limit`.
fn v1_limit(stat: &str) -> Option<u64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("hierarchical_memory_limit "))
        .and_then(|n| n.trim().parse().ok())
        .filter(|n| *n < UNLIMITED)
}

#[cfg(test)]
mod tests;
