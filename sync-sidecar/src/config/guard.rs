//! The blast-radius guard's flags and the rules they set: how much one
//! change may re-place unconfirmed, and when clusters turning unhealthy
//! together look like a partition.

use std::time::Duration;

use crate::error::SyncError;

/// The blast-radius guard: when a pass is held until confirmed.
#[derive(Debug, Clone, clap::Args)]
pub(super) struct GuardArgs {
    /// Hold a remediation pass (report it, patch nothing) that would rewrite or
    /// remove the placement of more than this share of the placed workloads,
    /// until an administrator confirms it (1 never holds).
    #[arg(
        long,
        env = "PLACEMENT_SYNC_REMEDIATION_HOLD_SHARE",
        default_value_t = 0.5
    )]
    pub(crate) remediation_hold_share: f64,

    /// Passes changing at most this many placements are never held.
    #[arg(
        long,
        env = "PLACEMENT_SYNC_REMEDIATION_HOLD_MIN",
        default_value_t = 10
    )]
    pub(crate) remediation_hold_min: usize,

    /// Cluster health changes re-place without confirmation, unless at least
    /// this share of the clusters (and at least 3) turned unhealthy within
    /// --remediation-partition-window: that looks like a partition of the
    /// control plane, and is held like an edit (kube-controller-manager's
    /// --unhealthy-zone-threshold).
    #[arg(
        long,
        env = "PLACEMENT_SYNC_REMEDIATION_PARTITION_THRESHOLD",
        default_value_t = 0.55
    )]
    pub(crate) remediation_partition_threshold: f64,

    /// The window of --remediation-partition-threshold, e.g. `60s`.
    #[arg(long, env = "PLACEMENT_SYNC_REMEDIATION_PARTITION_WINDOW", default_value = "60s", value_parser = humantime::parse_duration)]
    pub(crate) remediation_partition_window: Duration,
}

impl GuardArgs {
    pub(super) fn blast_radius(&self) -> Result<BlastRadius, SyncError> {
        if !(0.0..=1.0).contains(&self.remediation_hold_share) {
            return Err(SyncError::Config(format!(
                "--remediation-hold-share must be between 0 and 1, got {}",
                self.remediation_hold_share
            )));
        }
        Ok(BlastRadius {
            share: self.remediation_hold_share,
            min: self.remediation_hold_min,
        })
    }

    pub(super) fn partition(&self) -> Result<PartitionRule, SyncError> {
        if !(0.0..=1.0).contains(&self.remediation_partition_threshold) {
            return Err(SyncError::Config(format!(
                "--remediation-partition-threshold must be between 0 and 1, got {}",
                self.remediation_partition_threshold
            )));
        }
        Ok(PartitionRule {
            threshold: self.remediation_partition_threshold,
            window: self.remediation_partition_window,
        })
    }
}

/// How much of the placed workloads one change may re-place unconfirmed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct BlastRadius {
    /// Share of the placed workloads (0 to 1).
    pub share: f64,
    /// Changes of at most this many placements are never held.
    pub min: usize,
}

impl BlastRadius {
    /// Whether re-placing `affected` of `placed` workloads is beyond the
    /// radius.
    pub(crate) fn holds(&self, affected: usize, placed: usize) -> bool {
        affected > self.min && affected as f64 > self.share * placed as f64
    }
}

/// When a share of the clusters turning unhealthy together looks like a
/// partition of the control plane rather than an outage.
///
/// Learnt from kube-controller-manager's node lifecycle controller: a zone is
/// partially disrupted when at least `--unhealthy-zone-threshold` (0.55) of
/// its nodes, and more than two, are not ready; it then evicts from no node
/// (in clusters up to `--large-cluster-size-threshold`), and when every node
/// is not ready it stops evicting altogether, since the controller itself is
/// more likely cut off than every node down. Healthy, it evicts at
/// `--node-eviction-rate` (0.1 nodes/s), so that a disruption shows itself
/// before much has moved. Here the clusters that turned unhealthy within
/// `window` count: a handful going down one after another is a series of
/// outages, each re-placed at once; a large share going down together is held
/// (the blast-radius guard) until confirmed or until they come back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct PartitionRule {
    /// Share of all clusters (0 to 1).
    pub threshold: f64,
    pub window: Duration,
}

/// Clusters that must turn unhealthy together, at least, to look like a
/// partition (kube-controller-manager's "more than two").
const PARTITION_MIN: usize = 3;

impl PartitionRule {
    /// Whether `recent` of `total` clusters turning unhealthy within the
    /// window looks like a partition.
    pub(crate) fn applies(&self, recent: usize, total: usize) -> bool {
        recent >= PARTITION_MIN && recent as f64 >= self.threshold * total as f64
    }
}
