//! The writer's side of the engine's revisions: every write to the engine is
//! announced to the readers that remember its decisions, and held until they
//! have stopped answering from what they remember.
//!
//! A revision is `(epoch, counter)`: the epoch is random per writer process,
//! so a restarted writer is never mistaken for the one before. An even counter
//! means the engine is at rest; odd, that writes are in progress. The first
//! write of a burst makes the counter odd and waits until every reader that
//! may still trust the previous revision has acknowledged the new one, or
//! until its trust has run out ([`LEASE`] after the last answer it was sent);
//! when the last write of the burst ends the counter is even again, unless
//! a write may still take effect in the engine although it failed (it timed
//! out, or its connection was lost: the engine may commit it later, see
//! [`EngineError::write_in_doubt`]): then the counter stays odd until a
//! later write succeeds, so that no reader remembers answers of a state that
//! may still change under it.
//!
//! Readers long-poll [`RevisionBoard::poll`], carrying the revision they act
//! on as their acknowledgement; see `crate::revision_feed` for the reader.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::delegating;
use crate::engine::{EncodedJson, EngineError, PolicyEngine};

/// How long a reader may trust a revision after it asked (and so after the
/// answer was sent): the longest a write waits for a reader that is gone.
pub const LEASE: Duration = Duration::from_secs(3);

/// How long a poll that carries the current revision is held before it is
/// answered with that revision again (the reader's trust is renewed each time).
pub const HOLD: Duration = Duration::from_secs(1);

/// Readers at once; more are refused (a reader is one webhook process).
pub const MAX_READERS: usize = 16;

/// Waited past a lease's end before a write goes ahead without its reader's
/// acknowledgement (the reader measures its lease from before it asked; this
/// covers scheduling between the two processes' clocks reading).
const LEASE_MARGIN: Duration = Duration::from_millis(100);

/// A revision of the engine's policies and data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Revision {
    pub epoch: u64,
    pub counter: u64,
}

impl Revision {
    /// Whether the engine is at rest (no write in progress).
    pub fn at_rest(self) -> bool {
        self.counter.is_multiple_of(2)
    }
}

/// A revision as the board answers it: with how many writes of policy
/// modules (not data) it has announced, so that readers read the modules
/// again only when they may have changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Announcement {
    #[serde(flatten)]
    pub revision: Revision,
    pub module_writes: u64,
}

/// What a write changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteKind {
    Data,
    Modules,
}

impl fmt::Display for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}/{}", self.epoch, self.counter)
    }
}

/// A reader's poll: who it is and the revision it acts on (its
/// acknowledgement), if any yet. Flat, to travel as a query string.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Poll {
    /// Random per reader process.
    pub reader: String,
    pub epoch: Option<u64>,
    pub counter: Option<u64>,
}

impl Poll {
    pub fn new(reader: &str, acknowledged: Option<Revision>) -> Self {
        Poll {
            reader: reader.to_owned(),
            epoch: acknowledged.map(|r| r.epoch),
            counter: acknowledged.map(|r| r.counter),
        }
    }

    fn acknowledged(&self) -> Option<Revision> {
        Some(Revision {
            epoch: self.epoch?,
            counter: self.counter?,
        })
    }
}

/// Why a poll was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PollError {
    #[error("{MAX_READERS} readers already follow this engine's revisions")]
    TooManyReaders,
    #[error("a reader id is 1 to 64 letters, digits, '-' or '_'")]
    BadReader,
}

#[derive(Debug)]
struct Reader {
    acknowledged: Option<Revision>,
    /// The reader trusts no answer of ours beyond this.
    trusted_until: Instant,
}

#[derive(Debug)]
struct Board {
    counter: u64,
    module_writes: u64,
    writers: usize,
    /// A write failed without the engine saying it was not applied; until a
    /// later write succeeds the engine is not at rest.
    in_doubt: bool,
    readers: HashMap<String, Reader>,
}

/// How a write ended, as far as the engine's state goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// The engine applied it.
    Applied,
    /// The engine refused it: its state is as it was.
    Refused,
    /// It failed without an answer, or was abandoned: the engine may apply
    /// it still.
    InDoubt,
}

/// See the module documentation.
#[derive(Debug)]
pub struct RevisionBoard {
    epoch: u64,
    board: Mutex<Board>,
    /// The counter, for held polls.
    changed: watch::Sender<u64>,
    /// Bumped on every acknowledgement, for held writes.
    acknowledged: watch::Sender<u64>,
}

impl Default for RevisionBoard {
    fn default() -> Self {
        Self::new()
    }
}

impl RevisionBoard {
    pub fn new() -> Self {
        RevisionBoard {
            epoch: random_u64(),
            board: Mutex::new(Board {
                counter: 0,
                module_writes: 0,
                writers: 0,
                in_doubt: false,
                readers: HashMap::new(),
            }),
            changed: watch::channel(0).0,
            acknowledged: watch::channel(0).0,
        }
    }

    /// The current revision.
    pub fn current(&self) -> Revision {
        self.revision(self.board.lock().counter)
    }

    fn revision(&self, counter: u64) -> Revision {
        Revision {
            epoch: self.epoch,
            counter,
        }
    }

    /// Answer a reader: at once when it acts on another revision than the
    /// current one, else when the revision changes or after `hold`.
    pub async fn poll(&self, poll: Poll, hold: Duration) -> Result<Announcement, PollError> {
        let valid = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
        if poll.reader.is_empty() || poll.reader.len() > 64 || !poll.reader.chars().all(valid) {
            return Err(PollError::BadReader);
        }
        let mut changed = self.changed.subscribe();
        {
            let mut board = self.board.lock();
            let now = Instant::now();
            board
                .readers
                .retain(|_, r| r.trusted_until + LEASE_MARGIN > now);
            let count = board.readers.len();
            let acknowledged = poll.acknowledged().filter(|r| r.epoch == self.epoch);
            match board.readers.entry(poll.reader.clone()) {
                Entry::Occupied(mut reader) => reader.get_mut().acknowledged = acknowledged,
                Entry::Vacant(slot) => {
                    if count >= MAX_READERS {
                        return Err(PollError::TooManyReaders);
                    }
                    // Trusts nothing yet: its first answer starts its lease.
                    slot.insert(Reader {
                        acknowledged,
                        trusted_until: now,
                    });
                }
            }
            self.acknowledged.send_modify(|n| *n += 1);
            if poll.acknowledged() != Some(self.revision(board.counter)) {
                return Ok(self.answer(&mut board, &poll.reader));
            }
        }
        let _ = tokio::time::timeout(hold, changed.changed()).await;
        Ok(self.answer(&mut self.board.lock(), &poll.reader))
    }

    /// The current revision, as sent to `reader` now (which starts its lease).
    fn answer(&self, board: &mut Board, reader: &str) -> Announcement {
        let revision = Announcement {
            revision: self.revision(board.counter),
            module_writes: board.module_writes,
        };
        let trusted_until = Instant::now() + LEASE;
        board
            .readers
            .entry(reader.to_owned())
            .and_modify(|r| r.trusted_until = trusted_until)
            .or_insert(Reader {
                acknowledged: None,
                trusted_until,
            });
        revision
    }

    /// Announce a write and wait until no reader can still be answering from
    /// the revision before it. Hold the ticket for as long as the write runs.
    pub async fn begin_write(self: &Arc<Self>, kind: WriteKind) -> WriteTicket {
        let target = {
            let mut board = self.board.lock();
            board.writers += 1;
            if kind == WriteKind::Modules {
                // Counted before the write reaches the engine, so the revision
                // at rest after it tells readers to read the modules again.
                board.module_writes += 1;
            }
            if board.counter.is_multiple_of(2) {
                board.counter += 1;
                self.changed.send_replace(board.counter);
            }
            self.revision(board.counter)
        };
        let ticket = WriteTicket {
            board: Arc::clone(self),
            ended: Ended::InDoubt,
        };
        let mut acknowledged = self.acknowledged.subscribe();
        loop {
            acknowledged.mark_unchanged();
            let waiting_until = {
                let board = self.board.lock();
                let now = Instant::now();
                board
                    .readers
                    .values()
                    .filter(|r| r.acknowledged != Some(target))
                    .map(|r| r.trusted_until + LEASE_MARGIN)
                    .filter(|&until| until > now)
                    .max()
            };
            let Some(until) = waiting_until else {
                return ticket;
            };
            let _ = tokio::time::timeout_at(until, acknowledged.changed()).await;
        }
    }

    fn end_write(&self, ended: Ended) {
        let mut board = self.board.lock();
        board.writers -= 1;
        match ended {
            Ended::Applied => board.in_doubt = false,
            Ended::InDoubt => board.in_doubt = true,
            Ended::Refused => {}
        }
        if board.writers == 0 && !board.in_doubt {
            board.counter += 1;
            self.changed.send_replace(board.counter);
        }
    }
}

/// A random number from the system's source (epochs here, reader ids in
/// `revision_feed`).
pub(crate) fn random_u64() -> u64 {
    use ring::rand::{SecureRandom, SystemRandom};
    let mut bytes = [0u8; 8];
    SystemRandom::new()
        .fill(&mut bytes)
        .expect("the system's random source works");
    u64::from_le_bytes(bytes)
}

/// A write in progress (see [`RevisionBoard::begin_write`]); the engine is at
/// rest again when the last ticket is dropped, unless a write may still take
/// effect. A ticket dropped without [`WriteTicket::finish`] (the write was
/// abandoned) counts as such a write.
#[derive(Debug)]
pub struct WriteTicket {
    board: Arc<RevisionBoard>,
    ended: Ended,
}

impl WriteTicket {
    /// End the write with the engine's answer (passed through).
    pub fn finish<T>(mut self, result: Result<T, EngineError>) -> Result<T, EngineError> {
        self.ended = match &result {
            Ok(_) => Ended::Applied,
            Err(e) if e.write_in_doubt() => Ended::InDoubt,
            Err(_) => Ended::Refused,
        };
        result
    }
}

impl Drop for WriteTicket {
    fn drop(&mut self) {
        self.board.end_write(self.ended);
    }
}

/// An engine whose every write is announced on a [`RevisionBoard`] first.
#[derive(Debug)]
pub struct AnnouncedWrites {
    inner: Arc<dyn PolicyEngine>,
    board: Arc<RevisionBoard>,
}

impl AnnouncedWrites {
    pub fn new(inner: Arc<dyn PolicyEngine>, board: Arc<RevisionBoard>) -> Self {
        AnnouncedWrites { inner, board }
    }
}

/// Every write announced; everything else as the inner engine does it.
#[async_trait]
impl delegating::Delegating for AnnouncedWrites {
    fn inner(&self) -> &dyn PolicyEngine {
        &*self.inner
    }

    async fn put_data(&self, path: &str, value: &Value) -> Result<(), EngineError> {
        let write = self.board.begin_write(WriteKind::Data).await;
        write.finish(self.inner.put_data(path, value).await)
    }

    async fn put_data_encoded(&self, path: &str, json: EncodedJson) -> Result<(), EngineError> {
        let write = self.board.begin_write(WriteKind::Data).await;
        write.finish(self.inner.put_data_encoded(path, json).await)
    }

    async fn patch_data(&self, path: &str, patch: &json_patch::Patch) -> Result<(), EngineError> {
        let write = self.board.begin_write(WriteKind::Data).await;
        write.finish(self.inner.patch_data(path, patch).await)
    }

    async fn delete_data(&self, path: &str) -> Result<(), EngineError> {
        let write = self.board.begin_write(WriteKind::Data).await;
        write.finish(self.inner.delete_data(path).await)
    }

    async fn put_policy(&self, id: &str, source: &str) -> Result<(), EngineError> {
        let write = self.board.begin_write(WriteKind::Modules).await;
        write.finish(self.inner.put_policy(id, source).await)
    }

    async fn delete_policy(&self, id: &str) -> Result<(), EngineError> {
        let write = self.board.begin_write(WriteKind::Modules).await;
        write.finish(self.inner.delete_policy(id).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// End a write as the engine applied it.
    fn applied(ticket: WriteTicket) {
        ticket.finish(Ok(())).unwrap();
    }

    async fn ask(
        board: &RevisionBoard,
        reader: &str,
        acknowledged: Option<Revision>,
    ) -> Result<Revision, PollError> {
        let answer = board.poll(Poll::new(reader, acknowledged), HOLD).await?;
        Ok(answer.revision)
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_waits_for_every_trusting_reader_to_acknowledge() {
        let board = Arc::new(RevisionBoard::new());
        let rest = ask(&board, "a", None).await.unwrap();
        assert!(rest.at_rest());
        // Reader "a" now trusts `rest`: a write must wait for it.
        let writing = {
            let board = Arc::clone(&board);
            tokio::spawn(async move { board.begin_write(WriteKind::Data).await })
        };
        tokio::task::yield_now().await;
        let announced = ask(&board, "a", Some(rest)).await.unwrap();
        assert_eq!(
            announced.counter,
            rest.counter + 1,
            "the write is announced"
        );
        assert!(!writing.is_finished(), "held until acknowledged");
        // Acknowledging is the next poll, carrying the announced revision.
        let board2 = Arc::clone(&board);
        let held = tokio::spawn(async move { ask(&board2, "a", Some(announced)).await });
        applied(writing.await.unwrap());
        let after = held.await.unwrap().unwrap();
        assert_eq!(after.counter, rest.counter + 2);
        assert!(after.at_rest());
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_reader_holds_a_write_only_until_its_lease_ends() {
        let board = Arc::new(RevisionBoard::new());
        ask(&board, "gone", None).await.unwrap();
        let start = Instant::now();
        let ticket = board.begin_write(WriteKind::Data).await;
        let waited = start.elapsed();
        assert!(waited >= LEASE, "waited {waited:?}");
        assert!(waited <= LEASE + LEASE_MARGIN + Duration::from_millis(10));
        applied(ticket);
        // Without readers a write does not wait at all.
        let start = Instant::now();
        applied(board.begin_write(WriteKind::Data).await);
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn writes_of_a_burst_share_one_announcement() {
        let board = Arc::new(RevisionBoard::new());
        let first = board.begin_write(WriteKind::Data).await;
        let second = board.begin_write(WriteKind::Data).await;
        assert_eq!(board.current().counter, 1);
        applied(first);
        assert!(!board.current().at_rest(), "one write still runs");
        applied(second);
        assert_eq!(board.current().counter, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn module_writes_are_counted_apart_from_data() {
        let board = Arc::new(RevisionBoard::new());
        let module_writes = || async {
            let answer = board.poll(Poll::new("a", None), HOLD).await.unwrap();
            answer.module_writes
        };
        applied(board.begin_write(WriteKind::Data).await);
        assert_eq!(module_writes().await, 0);
        // A module write joining a burst of data writes counts too.
        let data = board.begin_write(WriteKind::Data).await;
        let modules = board.begin_write(WriteKind::Modules).await;
        applied(modules);
        applied(data);
        assert_eq!(module_writes().await, 1);
        assert!(board.current().at_rest());
    }

    /// A write that timed out (or lost its connection, or was abandoned) may
    /// still be committed by the engine: the revision stays odd, so no reader
    /// remembers answers, until a later write succeeds. A write the engine
    /// refused changed nothing.
    #[tokio::test(start_paused = true)]
    async fn a_write_the_engine_may_still_apply_keeps_the_revision_odd() {
        let board = Arc::new(RevisionBoard::new());
        let timeout = || EngineError::Timeout {
            endpoint: "http://127.0.0.1:8181/v1/data/x".into(),
            timeout: Duration::from_secs(5),
        };
        let write = board.begin_write(WriteKind::Data).await;
        assert!(write.finish(Err::<(), _>(timeout())).is_err());
        let after = board.current();
        assert!(!after.at_rest(), "in doubt after a timeout: {after}");
        // A poll sees it odd, and the next write starts no new announcement.
        assert_eq!(ask(&board, "a", None).await.unwrap(), after);
        let refused = board.begin_write(WriteKind::Data).await;
        assert_eq!(board.current(), after);
        let bad_request = EngineError::Http {
            endpoint: "x".into(),
            status: 400,
            message: "bad".into(),
            retry_after: None,
        };
        assert!(refused.finish(Err::<(), _>(bad_request)).is_err());
        assert!(!board.current().at_rest(), "a refusal settles nothing");
        // Abandoned (dropped unfinished): in doubt as well.
        drop(board.begin_write(WriteKind::Data).await);
        assert!(!board.current().at_rest());
        applied(board.begin_write(WriteKind::Data).await);
        assert_eq!(board.current().counter, after.counter + 1);
        assert!(board.current().at_rest());
        // A refusal alone ends a burst at rest.
        let write = board.begin_write(WriteKind::Modules).await;
        let compile = EngineError::Compile(Vec::new());
        assert!(write.finish(Err::<(), _>(compile)).is_err());
        assert!(board.current().at_rest());
    }

    #[tokio::test(start_paused = true)]
    async fn a_poll_on_the_current_revision_is_held() {
        let board = Arc::new(RevisionBoard::new());
        let current = ask(&board, "a", None).await.unwrap();
        let start = Instant::now();
        let again = ask(&board, "a", Some(current)).await.unwrap();
        assert_eq!(again, current);
        assert_eq!(start.elapsed(), HOLD);
        // Another epoch's acknowledgement is none: answered at once.
        let stale = Revision {
            epoch: current.epoch ^ 1,
            counter: current.counter,
        };
        let start = Instant::now();
        assert_eq!(ask(&board, "a", Some(stale)).await, Ok(current));
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn readers_are_bounded_and_named_plainly() {
        let board = Arc::new(RevisionBoard::new());
        for n in 0..MAX_READERS {
            ask(&board, &format!("r{n}"), None).await.unwrap();
        }
        assert_eq!(
            ask(&board, "one-more", None).await,
            Err(PollError::TooManyReaders)
        );
        assert_eq!(ask(&board, "a b", None).await, Err(PollError::BadReader));
        // Readers whose lease ran out make room.
        tokio::time::advance(LEASE + LEASE_MARGIN).await;
        assert!(ask(&board, "one-more", None).await.is_ok());
    }
}
