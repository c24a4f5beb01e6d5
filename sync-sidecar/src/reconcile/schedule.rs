//! The reconciler loop's decisions, apart from its waiting and its I/O: when
//! a pass runs and over what ([`Work`]), what it owes ([`Causes`]), what a
//! replica that takes the lease over weighs (the revision the last leader
//! recorded on the Lease), the revision this replica applied, and when
//! failed or held work is tried again. [`Schedule`] takes what happened and
//! says what to do; the loop in `mod.rs` waits, reads and writes.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use policy_client::retry::Backoff;
use tokio::time::Instant;

use super::changes::ItemKey;
use crate::cause::{Cause, Causes};

/// The longest a pass of changed objects (not a policy or data change)
/// waits for more of them.
const CHANGES_COALESCE: Duration = Duration::from_millis(50);

/// How often a held change looks for its confirmation.
const HELD_RECHECK: Duration = Duration::from_secs(5);

/// The delays between the retries of failed objects.
const RETRY_BACKOFF: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));

/// What a pass evaluates.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Work {
    /// Every target object in scope (a policy or data change, a new leader).
    All,
    /// These objects only (created or changed, or failed before).
    Only(BTreeSet<ItemKey>),
}

impl Work {
    fn merge(pending: Option<Work>, more: Work) -> Option<Work> {
        Some(match (pending, more) {
            (Some(Work::Only(mut a)), Work::Only(b)) => {
                a.extend(b);
                Work::Only(a)
            }
            (None, more) => more,
            _ => Work::All,
        })
    }

    /// The objects of a pass over some only; `None` for all.
    pub(super) fn only(&self) -> Option<&BTreeSet<ItemKey>> {
        match self {
            Work::All => None,
            Work::Only(keys) => Some(keys),
        }
    }
}

/// What woke the idle loop.
#[derive(Debug)]
pub(super) enum Wake {
    /// A policy or the data it reads changed.
    Fired,
    /// These objects were created or changed.
    Changed(BTreeSet<ItemKey>),
    /// Leadership changed; whether this replica leads now.
    Leader(bool),
    /// The engine's sync changed; whether it is in sync now.
    Synced(bool),
    /// The retry of held or failed work is due.
    RetryDue,
}

/// What the loop saw when its quiet time ended and it may act.
#[derive(Debug, Default)]
pub(super) struct Observed {
    /// The causes fired since the last pass, consumed.
    pub(super) fired: Causes,
    /// Leadership changed meanwhile; whether this replica leads now.
    pub(super) leader_changed: bool,
    pub(super) leader: bool,
    /// The engine's sync changed meanwhile.
    pub(super) synced_changed: bool,
    /// Objects changed during the quiet time.
    pub(super) changed: BTreeSet<ItemKey>,
}

/// A pass to run.
#[derive(Debug)]
pub(super) struct Plan {
    /// Never `Only` of nothing.
    pub(super) work: Work,
    /// The pass needs the configured revision now: it passes over
    /// everything, or this replica takes over.
    pub(super) needs_revision: bool,
    /// This replica starts or takes the lease over: the causes fired
    /// meanwhile, for [`Schedule::take_over`].
    pub(super) takeover: Option<Causes>,
}

/// The reconciler loop's state.
pub(super) struct Schedule {
    /// Work to do after the quiet time.
    pending: Option<Work>,
    /// Work to do later: a held change looks for its confirmation, failed
    /// objects are retried alone (one failing object must not cost a pass
    /// over every target).
    retry: Option<(Instant, Work)>,
    retry_delays: Box<dyn Iterator<Item = Duration> + Send>,
    /// Why the targets may need re-placing, since the last pass over
    /// everything that was applied (a held change keeps its causes).
    owed: Causes,
    /// This replica starts, or takes the lease over: what changed before is
    /// known from the revision the last leader recorded.
    takeover: bool,
    /// The configured revision of the last pass this replica applied.
    applied: Option<String>,
}

fn fresh_delays() -> Box<dyn Iterator<Item = Duration> + Send> {
    Box::new(RETRY_BACKOFF.delays())
}

impl Default for Schedule {
    /// A replica that starts: a pass over everything, as at a takeover.
    fn default() -> Self {
        Schedule {
            pending: Some(Work::All),
            retry: None,
            retry_delays: fresh_delays(),
            owed: Causes::default(),
            takeover: true,
            applied: None,
        }
    }
}

impl Schedule {
    /// Nothing to do until something wakes the loop.
    pub(super) fn is_idle(&self) -> bool {
        self.pending.is_none()
    }

    /// When the retry of held or failed work is due.
    pub(super) fn retry_at(&self) -> Option<Instant> {
        self.retry.as_ref().map(|(at, _)| *at)
    }

    /// The idle loop woke.
    pub(super) fn wake(&mut self, wake: Wake) {
        match wake {
            Wake::Fired | Wake::Leader(true) | Wake::Synced(true) => {
                self.pending = Some(Work::All);
                self.retry = None;
            }
            Wake::Changed(keys) => self.pending = Some(Work::Only(keys)),
            Wake::Leader(false) | Wake::Synced(false) => {}
            Wake::RetryDue => self.pending = self.retry.take().map(|(_, work)| work),
        }
    }

    /// How long pending work waits for more: a policy or data change waits
    /// for the quiet time that coalesces its bursts into one pass; a few
    /// changed objects are each one query, and a new binding waits for
    /// nothing but its schedule.
    pub(super) fn quiet(&self, debounce: Duration) -> Duration {
        match self.pending {
            Some(Work::Only(_)) => debounce.min(CHANGES_COALESCE),
            _ => debounce,
        }
    }

    /// This replica may not act (not the leader, or the engine not in
    /// sync): a new leader or a fresh sync starts over with every target.
    pub(super) fn cannot_act(&mut self) {
        self.pending = Some(Work::All);
    }

    /// The quiet time ended and the loop may act: the pass to run, if any.
    /// Triggers, leadership and sync changes signalled before it make it a
    /// pass over everything and are consumed with it (left pending, each
    /// cost one more pass over everything once this one ended); objects
    /// changed meanwhile join it.
    pub(super) fn begin(&mut self, seen: Observed) -> Option<Plan> {
        if seen.leader_changed && seen.leader {
            self.takeover = true;
        }
        let mut work = self.pending.take();
        if !seen.fired.is_empty() || seen.leader_changed || seen.synced_changed {
            work = Work::merge(work, Work::All);
        }
        if !seen.changed.is_empty() {
            work = Work::merge(work, Work::Only(seen.changed));
        }
        let work = work.unwrap_or(Work::All);
        if matches!(&work, Work::Only(keys) if keys.is_empty()) {
            return None;
        }
        let needs_revision = self.takeover || work == Work::All;
        let takeover = match self.takeover {
            true => Some(seen.fired),
            false => {
                self.owed.merge(seen.fired);
                None
            }
        };
        Some(Plan {
            work,
            needs_revision,
            takeover,
        })
    }

    /// The configured revision of the last pass this replica applied (what
    /// a takeover compares with when no Lease keeps it).
    pub(super) fn applied(&self) -> Option<&str> {
        self.applied.as_deref()
    }

    /// This replica takes over: the edits seen while another replica led
    /// (or before this one started) were that leader's to apply, and it did
    /// unless the revision it recorded (`recorded`) differs from the one now
    /// (`configured`) or it held a change. Returns whether the revisions
    /// match, so that a change the last leader held must be looked for
    /// ([`Schedule::last_leader_held`]).
    pub(super) fn take_over(
        &mut self,
        fired: Causes,
        recorded: Option<&str>,
        configured: &str,
    ) -> bool {
        self.takeover = false;
        self.owed = self.owed.without_edits();
        self.owed.merge(fired.without_edits());
        let unchanged = recorded == Some(configured);
        if !unchanged {
            self.owed.add(Cause::Resync);
        }
        unchanged
    }

    /// The last leader held a change: its causes are unknown here.
    pub(super) fn last_leader_held(&mut self) {
        self.owed.add(Cause::Resync);
    }

    /// What the next pass owes (the pass adds to it, e.g. a partition).
    pub(super) fn owed_mut(&mut self) -> &mut Causes {
        &mut self.owed
    }

    pub(super) fn owed(&self) -> &Causes {
        &self.owed
    }

    /// The pass was aborted (leadership or sync lost, or stopping): its
    /// work is pending again.
    pub(super) fn aborted(&mut self, work: Work) {
        self.pending = Work::merge(self.pending.take(), work);
    }

    /// The pass ended; `held` placements were held back. A pass over
    /// everything that held nothing is applied: what caused it is done
    /// with, and when the guard is in force (`guards`) its revision
    /// (`configured`) is the one to record, if it is new (then
    /// [`Schedule::recorded`]).
    pub(super) fn completed(
        &mut self,
        work: &Work,
        held: usize,
        guards: bool,
        configured: String,
    ) -> Option<String> {
        if *work != Work::All || held > 0 {
            return None;
        }
        self.owed = Causes::default();
        (guards && self.applied.as_deref() != Some(configured.as_str())).then_some(configured)
    }

    /// `revision` was recorded as applied.
    pub(super) fn recorded(&mut self, revision: String) {
        self.applied = Some(revision);
    }

    /// After a pass at `now`: a held change looks for its confirmation
    /// again soon; failed objects are retried alone, later each time
    /// (a later pass over everything still owes them their retry); objects
    /// `due` at a time of their own are evaluated again then, with what
    /// else is due by then; a pass over everything without failures starts
    /// the delays over.
    pub(super) fn retry_after(
        &mut self,
        work: &Work,
        held: usize,
        failed: BTreeSet<ItemKey>,
        due: BTreeMap<ItemKey, Instant>,
        now: Instant,
    ) {
        if held > 0 {
            self.retry = Some((now + HELD_RECHECK, Work::All));
            return;
        }
        let mut next = self.retry.take();
        if !failed.is_empty() {
            let delay = self.retry_delays.next().unwrap_or(RETRY_BACKOFF.max_delay);
            let merged = match next {
                Some((_, Work::All)) => Work::All,
                _ => Work::Only(failed),
            };
            next = Some((now + delay, merged));
        } else if *work == Work::All {
            self.retry_delays = fresh_delays();
        }
        if let Some(earliest) = due.values().min().copied() {
            let keys = Work::Only(due.into_keys().collect());
            next = match next {
                Some((at, work)) => Work::merge(Some(work), keys).map(|w| (at.min(earliest), w)),
                None => Some((earliest, keys)),
            };
        }
        self.retry = next;
    }
}

#[cfg(test)]
mod tests;
