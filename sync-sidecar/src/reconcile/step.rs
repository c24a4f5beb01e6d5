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
}
