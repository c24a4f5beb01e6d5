//! What happened to one object in a pass: each kind of target (workloads,
//! bindings, Placements) answers with it, and the pass tallies it.

use crate::error::SyncError;
use crate::reconcile::writer::is_conflict;

/// What happened to one object in a pass.
pub(crate) enum Step {
    /// Leadership or the engine's sync was lost, or the sidecar is stopping.
    Aborted,
    /// Written already; the watch cache has not caught up.
    InFlight,
    Failed,
    Placed,
    Undefined,
    Unplaceable,
    Stale {
        patched: bool,
        failed: bool,
    },
    /// Stale, but given until then to resolve itself (a guarded binding
    /// karmada-scheduler is to move): evaluated again at that time.
    Overdue(tokio::time::Instant),
    /// The write met a newer version of the object (another writer got
    /// there first): the pass evaluates it again on that version at once.
    Conflicted,
}

impl Step {
    /// A write went through: the object is placed, or (`unplaceable`) its
    /// failure is recorded.
    pub(crate) fn written(unplaceable: bool) -> Step {
        if unplaceable {
            Step::Unplaceable
        } else {
            Step::Stale {
                patched: true,
                failed: false,
            }
        }
    }

    /// Nothing to write: placed, or (`unplaceable`) it stays as it is.
    pub(crate) fn unwritten(unplaceable: bool) -> Step {
        if unplaceable {
            Step::Unplaceable
        } else {
            Step::Placed
        }
    }

    /// Stale and not written: retried.
    pub(crate) const WRITE_FAILED: Step = Step::Stale {
        patched: false,
        failed: true,
    };

    /// A write that failed: one that met a newer version of its object is
    /// [`Step::Conflicted`] (another writer's, as Karmada's taint manager
    /// evicting from a failed member beside our moves; logged at debug);
    /// any other is logged and counted by `report`, and retried after the
    /// pass.
    pub(crate) fn write_failed(e: &SyncError, report: impl FnOnce()) -> Step {
        if is_conflict(e) {
            tracing::debug!(error = %e, "the write met a newer version of its object; evaluating it again");
            Step::Conflicted
        } else {
            report();
            Step::WRITE_FAILED
        }
    }

    /// Stale and left so (reported, or remediation off, or gone).
    pub(crate) const LEFT_STALE: Step = Step::Stale {
        patched: false,
        failed: false,
    };
}
