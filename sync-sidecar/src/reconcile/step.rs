//! What happened to one object in a pass: each kind of target (workloads,
//! bindings, Placements) answers with it, and the pass tallies it.

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

    /// Stale and left so (reported, or remediation off, or gone).
    pub(crate) const LEFT_STALE: Step = Step::Stale {
        patched: false,
        failed: false,
    };
}
