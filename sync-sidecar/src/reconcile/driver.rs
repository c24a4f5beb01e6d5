//! The reconciler's loop: wait for work (a policy or data change, objects
//! changed, leadership or the engine's sync, a retry due), let it settle,
//! and run a pass over it ([`super::pass`]) when this replica may act; then
//! record the configured revision the pass applied.

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::context::ReconcilerContext;
use super::pass::Pass;
use super::schedule::{Observed, Plan, Schedule, Wake};
use crate::replication::revision::configured_revision;

/// The loop over the passes of every target.
pub(crate) struct Driver {
    pub(crate) pass: Pass,
}

impl Driver {
    fn ctx(&self) -> &ReconcilerContext {
        &self.pass.common.ctx
    }
}

impl Driver {
    /// The configured revision now: the policy set (`policy_revision`) and
    /// the configured part of the data it reads.
    fn configured_revision(&self, policy_revision: &str) -> String {
        configured_revision(
            policy_revision,
            &self.ctx().replicated.revision(&self.ctx().reads),
        )
    }

    /// Keep the targets placed until `cancel`: wait for work, let it
    /// settle, and pass over it when this replica may act.
    pub(crate) async fn run(&self, cancel: CancellationToken) {
        let mut signals = Signals {
            leader: self.ctx().leader.clone(),
            synced: self.ctx().state.subscribe_synced(),
        };
        let mut schedule = Schedule::default();
        loop {
            if schedule.is_idle() {
                match self.wake(&mut signals, schedule.retry_at(), &cancel).await {
                    Some(wake) => schedule.wake(wake),
                    None => return,
                }
                continue;
            }
            if !sleep_or_cancel(schedule.quiet(self.ctx().debounce), &cancel).await {
                return;
            }
            if !self.pass.common.writer.may_act() {
                if !wait_to_act(&mut signals, &cancel).await {
                    return;
                }
                schedule.cannot_act();
                continue;
            }
            let (seen, revision) = self.observe(&mut signals);
            let Some(plan) = schedule.begin(seen) else {
                continue;
            };
            self.pass_and_record(&mut schedule, plan, &revision, &cancel)
                .await;
        }
    }

    /// What wakes the idle loop; `None` when it must stop.
    async fn wake(
        &self,
        signals: &mut Signals,
        retry_at: Option<Instant>,
        cancel: &CancellationToken,
    ) -> Option<Wake> {
        let retry_due = async {
            match retry_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        Some(tokio::select! {
            _ = self.ctx().trigger.fired() => Wake::Fired,
            _ = self.pass.common.changes.notify.notified() => Wake::Changed(self.pass.common.changes.take()),
            r = signals.leader.changed() => {
                r.ok()?;
                Wake::Leader(*signals.leader.borrow_and_update())
            }
            r = signals.synced.changed() => {
                r.ok()?;
                Wake::Synced(*signals.synced.borrow_and_update())
            }
            _ = retry_due => Wake::RetryDue,
            _ = cancel.cancelled() => return None,
        })
    }

    /// What happened up to now, consumed, and the revision of the policy
    /// set in force: the pass reads the engine and the leadership as they
    /// are now, so it covers what was signalled before it starts.
    fn observe(&self, signals: &mut Signals) -> (Observed, String) {
        let fired = self.ctx().trigger.take();
        let revision = self.ctx().trigger.policy_revision();
        let leader_changed = signals.leader.has_changed().unwrap_or(false);
        let synced_changed = signals.synced.has_changed().unwrap_or(false);
        let leader = *signals.leader.borrow_and_update();
        signals.synced.borrow_and_update();
        let seen = Observed {
            fired,
            leader_changed,
            leader,
            synced_changed,
            changed: self.pass.common.changes.take(),
        };
        (seen, revision)
    }

    /// Run the pass of `plan` under policy revision `revision`, after a
    /// takeover's look at what the last leader applied, and record the
    /// revision it applied.
    async fn pass_and_record(
        &self,
        schedule: &mut Schedule,
        plan: Plan,
        revision: &str,
        cancel: &CancellationToken,
    ) {
        let Plan {
            work,
            needs_revision,
            takeover,
        } = plan;
        let configured = match needs_revision {
            true => self.configured_revision(revision),
            false => String::new(),
        };
        if let Some(fired) = takeover {
            let recorded = match &self.ctx().applied {
                Some(record) => record.get().await,
                None => schedule.applied().map(str::to_owned),
            };
            if schedule.take_over(fired, recorded.as_deref(), &configured)
                && self.ctx().policy_configmaps.held().await
            {
                schedule.last_leader_held();
            }
        }
        let only = work.only();
        let started = Instant::now();
        let report = self
            .pass
            .pass(cancel, only, schedule.owed_mut(), revision)
            .await;
        self.ctx().metrics.remediation_passes.inc();
        // A pass over a few changed objects that are all our own writes,
        // not yet seen by the watch, evaluates nothing: frequent while
        // writes are in flight, and no news.
        let quiet = only.is_some() && report.evaluated == 0 && !report.aborted;
        if quiet {
            tracing::debug!(
                only = only.map(BTreeSet::len),
                "remediation pass: nothing to evaluate"
            );
        } else {
            tracing::info!(
                mode = ?self.ctx().mode,
                only = only.map(BTreeSet::len),
                evaluated = report.evaluated,
                stale = report.stale,
                patched = report.patched,
                failed = report.failed,
                unplaceable = report.unplaceable,
                undefined = report.undefined,
                held = report.held,
                aborted = report.aborted,
                cause = only.is_none().then(|| schedule.owed().describe(revision)),
                took_ms = started.elapsed().as_millis() as u64,
                "remediation pass"
            );
        }
        if report.aborted {
            schedule.aborted(work);
            return;
        }
        if let Some(configured) =
            schedule.completed(&work, report.held, self.pass.guards(), configured)
        {
            let recorded = match &self.ctx().applied {
                Some(record) => record.set(&configured).await,
                None => true,
            };
            if recorded {
                schedule.recorded(configured);
            }
        }
        schedule.retry_after(
            &work,
            report.held,
            report.failed_objects,
            report.due,
            Instant::now(),
        );
    }
}

/// The leadership and the engine's sync, as the loop watches them.
struct Signals {
    leader: watch::Receiver<bool>,
    synced: watch::Receiver<bool>,
}

/// Sleep for `quiet`; `false` when cancelled first.
async fn sleep_or_cancel(quiet: Duration, cancel: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(quiet) => true,
        _ = cancel.cancelled() => false,
    }
}

/// Wait a while for leadership or sync; `false` when cancelled first.
async fn wait_to_act(signals: &mut Signals, cancel: &CancellationToken) -> bool {
    tokio::select! {
        _ = signals.leader.changed() => true,
        _ = signals.synced.changed() => true,
        _ = tokio::time::sleep(Duration::from_secs(1)) => true,
        _ = cancel.cancelled() => false,
    }
}
