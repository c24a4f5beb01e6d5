//! Who placement-sync is when it writes to Kubernetes: one field manager for
//! every write (policy status and last good set, the Lease, the reconciler's
//! patches and applies), so `managedFields` name one writer.
//!
//! The value stays `placement-sync`: the Lease is locked with a server-side
//! apply *without* force (crate `kube-lease-manager`), so a new manager name
//! there would conflict with the fields an older replica's apply owns. The
//! other writes are merge and JSON patches (no conflicts) or applies with
//! force.

use kube::api::{PatchParams, PostParams};

/// Field manager of every write placement-sync sends.
pub(crate) const FIELD_MANAGER: &str = "placement-sync";

/// Parameters of a patch under [`FIELD_MANAGER`].
pub(crate) fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    }
}

/// Parameters of a create under [`FIELD_MANAGER`].
pub(crate) fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    }
}

/// Parameters of a server-side apply under [`FIELD_MANAGER`], forced: the
/// objects applied are ours alone.
pub(crate) fn apply_params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}
