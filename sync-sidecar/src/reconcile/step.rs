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
