use super::*;
use crate::replication::document::ObjectKey;

fn keys(ids: &[&str]) -> BTreeSet<ItemKey> {
    ids.iter().map(|id| (0, ObjectKey::new(None, id))).collect()
}

fn only(ids: &[&str]) -> Work {
    Work::Only(keys(ids))
}

fn edit() -> Cause {
    Cause::Data {
        object: "clusters/eu-1".into(),
        revision: "abc".into(),
    }
}

fn fired(causes: &[Cause]) -> Causes {
    let mut fired = Causes::default();
    for cause in causes {
        fired.add(cause.clone());
    }
    fired
}

/// A schedule past its first pass (applied at revision `r1`), idle.
fn settled() -> Schedule {
    let mut schedule = Schedule::default();
    let plan = schedule.begin(Observed::default()).expect("a first pass");
    schedule.take_over(plan.takeover.expect("a takeover"), None, "r1");
    let record = schedule.completed(&plan.work, 0, true, "r1".into());
    schedule.recorded(record.expect("a new revision"));
    schedule.retry_after(
        &plan.work,
        0,
        BTreeSet::new(),
        BTreeMap::new(),
        Instant::now(),
    );
    assert!(schedule.is_idle());
    schedule
}

#[test]
fn work_merges_toward_everything() {
    assert_eq!(Work::merge(None, only(&["a"])), Some(only(&["a"])));
    assert_eq!(
        Work::merge(Some(only(&["a"])), only(&["b"])),
        Some(only(&["a", "b"]))
    );
    assert_eq!(Work::merge(Some(only(&["a"])), Work::All), Some(Work::All));
    assert_eq!(Work::merge(Some(Work::All), only(&["a"])), Some(Work::All));
}

#[test]
fn a_starting_replica_passes_over_everything_as_a_takeover() {
    let mut schedule = Schedule::default();
    assert!(!schedule.is_idle());
    let plan = schedule.begin(Observed::default()).expect("a pass");
    assert_eq!(plan.work, Work::All);
    assert!(plan.needs_revision);
    assert_eq!(plan.takeover, Some(Causes::default()));
}

#[test]
fn a_takeover_keeps_health_drops_edits_and_owes_a_resync_when_the_revision_differs() {
    let mut schedule = Schedule::default();
    let plan = schedule
        .begin(Observed {
            fired: fired(&[Cause::Policy("r2".into()), edit(), Cause::Health]),
            ..Observed::default()
        })
        .expect("a pass");
    let seen = plan.takeover.expect("a takeover");
    assert!(!schedule.take_over(seen, Some("r1"), "r2"));
    assert_eq!(
        *schedule.owed(),
        Causes {
            health: true,
            resync: true,
            ..Causes::default()
        }
    );
}

#[test]
fn a_takeover_at_the_recorded_revision_owes_only_health_unless_a_change_was_held() {
    let mut schedule = Schedule::default();
    let plan = schedule
        .begin(Observed {
            fired: fired(&[edit(), Cause::Health]),
            ..Observed::default()
        })
        .expect("a pass");
    assert!(schedule.take_over(plan.takeover.expect("a takeover"), Some("r1"), "r1"));
    assert_eq!(
        *schedule.owed(),
        Causes {
            health: true,
            ..Causes::default()
        }
    );
    schedule.last_leader_held();
    assert!(schedule.owed().resync);
}

#[test]
fn without_a_recorded_revision_a_takeover_is_a_resync() {
    let mut schedule = Schedule::default();
    let plan = schedule.begin(Observed::default()).expect("a pass");
    assert!(!schedule.take_over(plan.takeover.expect("a takeover"), None, "r1"));
    assert!(schedule.owed().resync);
}

#[test]
fn winning_the_lease_again_is_a_takeover_losing_it_is_not() {
    let mut schedule = settled();
    let plan = schedule
        .begin(Observed {
            leader_changed: true,
            leader: false,
            ..Observed::default()
        })
        .expect("a pass");
    assert_eq!(plan.work, Work::All);
    assert!(plan.takeover.is_none());
    let plan = schedule
        .begin(Observed {
            leader_changed: true,
            leader: true,
            ..Observed::default()
        })
        .expect("a pass");
    assert_eq!(plan.work, Work::All);
    assert!(plan.takeover.is_some());
    // Without a Lease record it compares with what this replica applied.
    assert_eq!(schedule.applied(), Some("r1"));
}

#[test]
fn causes_fired_while_leading_are_owed_by_the_next_pass() {
    let mut schedule = settled();
    schedule.wake(Wake::Fired);
    let plan = schedule
        .begin(Observed {
            fired: fired(&[edit()]),
            ..Observed::default()
        })
        .expect("a pass");
    assert_eq!(plan.work, Work::All);
    assert!(plan.needs_revision && plan.takeover.is_none());
    assert_eq!(*schedule.owed(), fired(&[edit()]));
}

#[test]
fn changed_objects_alone_are_a_short_wait_and_a_pass_over_them_only() {
    let mut schedule = settled();
    schedule.wake(Wake::Changed(keys(&["a"])));
    assert!(!schedule.is_idle());
    assert_eq!(
        schedule.quiet(Duration::from_secs(2)),
        Duration::from_millis(50)
    );
    assert_eq!(
        schedule.quiet(Duration::from_millis(10)),
        Duration::from_millis(10)
    );
    let plan = schedule
        .begin(Observed {
            changed: keys(&["b"]),
            ..Observed::default()
        })
        .expect("a pass");
    assert_eq!(plan.work, only(&["a", "b"]));
    assert!(!plan.needs_revision && plan.takeover.is_none());
    assert!(schedule.is_idle());
}

#[test]
fn a_policy_change_waits_the_whole_quiet_time_and_passes_over_everything() {
    let mut schedule = settled();
    schedule.wake(Wake::Changed(keys(&["a"])));
    let plan = schedule
        .begin(Observed {
            fired: fired(&[Cause::Policy("r2".into())]),
            ..Observed::default()
        })
        .expect("a pass");
    assert_eq!(plan.work, Work::All);
    schedule.wake(Wake::Fired);
    assert_eq!(
        schedule.quiet(Duration::from_secs(2)),
        Duration::from_secs(2)
    );
}

#[test]
fn a_wake_with_nothing_changed_is_no_pass_and_a_takeover_waits_for_the_next() {
    let mut schedule = Schedule::default();
    // Woken for changes another wake took already.
    schedule.wake(Wake::Changed(BTreeSet::new()));
    assert!(schedule.begin(Observed::default()).is_none());
    assert!(schedule.is_idle());
    schedule.wake(Wake::Changed(keys(&["a"])));
    let plan = schedule.begin(Observed::default()).expect("a pass");
    assert_eq!(plan.work, only(&["a"]));
    assert!(plan.needs_revision, "a takeover reads the revision");
    assert!(plan.takeover.is_some());
}

#[test]
fn leadership_or_sync_lost_wakes_nothing_regained_passes_over_everything() {
    let mut schedule = settled();
    schedule.wake(Wake::Leader(false));
    schedule.wake(Wake::Synced(false));
    assert!(schedule.is_idle());
    schedule.wake(Wake::Synced(true));
    assert!(!schedule.is_idle());
    assert_eq!(
        schedule.begin(Observed::default()).map(|p| p.work),
        Some(Work::All)
    );
    schedule.wake(Wake::Leader(true));
    assert_eq!(
        schedule.begin(Observed::default()).map(|p| p.work),
        Some(Work::All)
    );
}

#[test]
fn a_replica_that_may_not_act_starts_over_with_everything() {
    let mut schedule = settled();
    schedule.wake(Wake::Changed(keys(&["a"])));
    schedule.cannot_act();
    assert_eq!(
        schedule.begin(Observed::default()).map(|p| p.work),
        Some(Work::All)
    );
}

#[test]
fn an_applied_pass_over_everything_clears_its_causes_and_records_a_new_revision_once() {
    let mut schedule = settled();
    schedule.owed_mut().add(edit());
    // A pass over some objects, or one that held, applies no revision.
    assert_eq!(
        schedule.completed(&only(&["a"]), 0, true, String::new()),
        None
    );
    assert_eq!(schedule.completed(&Work::All, 2, true, "r2".into()), None);
    assert!(
        !schedule.owed().is_empty(),
        "a held change keeps its causes"
    );
    // Applied: the causes are done with; the same revision is not recorded again.
    assert_eq!(schedule.completed(&Work::All, 0, true, "r1".into()), None);
    assert!(schedule.owed().is_empty());
    assert_eq!(
        schedule.completed(&Work::All, 0, true, "r2".into()),
        Some("r2".to_owned())
    );
    // Not recorded (the Lease write failed): asked for again next time.
    assert_eq!(schedule.applied(), Some("r1"));
    assert_eq!(
        schedule.completed(&Work::All, 0, true, "r2".into()),
        Some("r2".to_owned())
    );
    schedule.recorded("r2".into());
    assert_eq!(schedule.applied(), Some("r2"));
    // Without the guard in force nothing is recorded.
    assert_eq!(schedule.completed(&Work::All, 0, false, "r3".into()), None);
}

#[test]
fn an_aborted_pass_is_pending_again_with_what_came_meanwhile() {
    let mut schedule = settled();
    schedule.wake(Wake::Changed(keys(&["a"])));
    let plan = schedule.begin(Observed::default()).expect("a pass");
    schedule.aborted(plan.work);
    assert_eq!(
        schedule
            .begin(Observed {
                changed: keys(&["b"]),
                ..Observed::default()
            })
            .map(|p| p.work),
        Some(only(&["a", "b"]))
    );
}

#[test]
fn a_held_pass_looks_for_its_confirmation_again_in_five_seconds() {
    let mut schedule = settled();
    let now = Instant::now();
    schedule.retry_after(&Work::All, 3, keys(&["a"]), BTreeMap::new(), now);
    assert_eq!(schedule.retry_at(), Some(now + Duration::from_secs(5)));
    assert!(schedule.is_idle());
    schedule.wake(Wake::RetryDue);
    assert_eq!(
        schedule.begin(Observed::default()).map(|p| p.work),
        Some(Work::All)
    );
    assert_eq!(schedule.retry_at(), None, "the retry is consumed");
}

#[test]
fn failed_objects_are_retried_alone_unless_a_pass_over_everything_is_due() {
    let mut schedule = settled();
    let now = Instant::now();
    schedule.retry_after(&only(&["a"]), 0, keys(&["a"]), BTreeMap::new(), now);
    let at = schedule.retry_at().expect("a retry");
    assert!(at >= now + Duration::from_secs(1) && at < now + Duration::from_secs(2));
    schedule.wake(Wake::RetryDue);
    assert_eq!(
        schedule.begin(Observed::default()).map(|p| p.work),
        Some(only(&["a"]))
    );
    // A held change's recheck (everything) stays everything.
    schedule.retry_after(&Work::All, 1, BTreeSet::new(), BTreeMap::new(), now);
    schedule.retry_after(&only(&["b"]), 0, keys(&["b"]), BTreeMap::new(), now);
    schedule.wake(Wake::RetryDue);
    assert_eq!(
        schedule.begin(Observed::default()).map(|p| p.work),
        Some(Work::All)
    );
    // A trigger drops the retry: its pass covers everything.
    schedule.retry_after(&only(&["c"]), 0, keys(&["c"]), BTreeMap::new(), now);
    schedule.wake(Wake::Fired);
    assert_eq!(schedule.retry_at(), None);
}

#[test]
fn failures_back_off_until_a_pass_over_everything_succeeds() {
    let mut schedule = settled();
    let now = Instant::now();
    for _ in 0..6 {
        schedule.retry_after(&only(&["a"]), 0, keys(&["a"]), BTreeMap::new(), now);
    }
    let at = schedule.retry_at().expect("a retry");
    assert!(at >= now + Duration::from_secs(32), "{:?}", at - now);
    // A pass over some objects only does not start over.
    schedule.retry_after(&only(&["b"]), 0, BTreeSet::new(), BTreeMap::new(), now);
    schedule.retry_after(&only(&["a"]), 0, keys(&["a"]), BTreeMap::new(), now);
    let at = schedule.retry_at().expect("a retry");
    assert!(at >= now + Duration::from_secs(60), "{:?}", at - now);
    schedule.retry_after(&Work::All, 0, BTreeSet::new(), BTreeMap::new(), now);
    schedule.retry_after(&only(&["a"]), 0, keys(&["a"]), BTreeMap::new(), now);
    let at = schedule.retry_at().expect("a retry");
    assert!(at < now + Duration::from_secs(2), "{:?}", at - now);
}

#[test]
fn an_overdue_object_is_evaluated_again_at_its_own_time_with_what_else_is_due() {
    let mut schedule = settled();
    let now = Instant::now();
    let due_at = now + Duration::from_secs(15);
    let due: BTreeMap<ItemKey, Instant> = keys(&["a"]).into_iter().map(|k| (k, due_at)).collect();
    schedule.retry_after(&Work::All, 0, BTreeSet::new(), due.clone(), now);
    assert_eq!(schedule.retry_at(), Some(due_at));
    // A failure retried sooner takes the overdue object along.
    schedule.retry_after(&only(&["b"]), 0, keys(&["b"]), due, now);
    let at = schedule.retry_at().expect("a retry");
    assert!(at < due_at, "{:?}", at - now);
    schedule.wake(Wake::RetryDue);
    assert_eq!(
        schedule.begin(Observed::default()).map(|p| p.work),
        Some(only(&["a", "b"]))
    );
    // A held change still looks for its confirmation first.
    let due: BTreeMap<ItemKey, Instant> = keys(&["a"]).into_iter().map(|k| (k, due_at)).collect();
    schedule.retry_after(&Work::All, 2, BTreeSet::new(), due, now);
    assert_eq!(schedule.retry_at(), Some(now + Duration::from_secs(5)));
}
