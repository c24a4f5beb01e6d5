//! Decisions of a remote engine remembered soundly: only while its writer
//! tells us every revision before it happens (`crate::revision_board`).
//!
//! [`RememberingEngine`] long-polls the writer's board, carrying the revision
//! it acts on. It remembers answers only while the engine is at rest at a
//! revision the writer confirmed within the last [`LEASE`] (measured from
//! before it asked), with the input paths read by the modules the engine held
//! at that revision. A new revision forgets everything before the next poll
//! acknowledges it, and the writer holds its writes until that poll or until
//! the lease has run out; so no answer remembered, and none being computed,
//! can outlive the revision it was computed under. When the board does not
//! answer, the lease runs out and every review is evaluated.
//!
//! The writer itself follows its own board the same way, in process
//! ([`RememberingEngine::beside_writer`]): placement-sync asks the engine it
//! writes once per binding and workload, and most of them share a decision.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use async_trait::async_trait;
use reqwest::Url;
use serde_json::Value;
use tokio::time::Instant;

use crate::delegating;
use crate::engine::{DecisionCacheStats, EngineError, PolicyEngine, QueryOutcome};
use crate::input::{InputRoot, PolicyInput};
use crate::input_reads::{InputReads, Uncacheable};
use crate::memo::DecisionMemo;
use crate::revision_board::{Announcement, HOLD, LEASE, Poll, Revision, RevisionBoard};

/// An engine whose decisions are remembered while its writer's revisions are
/// followed. See the module documentation.
pub struct RememberingEngine {
    inner: Arc<dyn PolicyEngine>,
    memo: DecisionMemo,
    feed: Feed,
    reader: String,
    state: Mutex<Following>,
}

/// Where the writer's revisions are read.
enum Feed {
    /// Its board over HTTP: a webhook beside the writer.
    Remote { board: Url, client: reqwest::Client },
    /// Its board in this process: the writer's own queries.
    Local(Arc<RevisionBoard>),
}

/// The writer's epoch and its count of module writes: the same pair, the
/// same modules.
type ModulesAt = (u64, u64);

#[derive(Debug)]
struct Following {
    /// The last revision the board sent.
    seen: Option<Revision>,
    /// The board's count of module writes with it.
    seen_module_writes: u64,
    /// What is remembered belongs to this generation (bumped with `seen`).
    generation: u64,
    /// The lease on `seen`.
    trusted_until: Instant,
    /// The input paths the modules read, fetched at rest, for the (epoch,
    /// module writes) they were fetched at: a revision that changed only data
    /// keeps them.
    reads: Option<(ModulesAt, Result<Arc<InputReads>, Uncacheable>)>,
    /// Why the board's last answer did not come.
    feed_error: Option<String>,
    /// Why the input reads of `seen` are not known.
    reads_error: Option<String>,
}

impl Following {
    /// Why nothing is remembered now (a write in progress aside).
    fn off(&self) -> Option<String> {
        if let Some(error) = &self.feed_error {
            return Some(error.clone());
        }
        if self.seen.is_none() {
            return Some("no revision from the engine's writer yet".to_owned());
        }
        if let Some(error) = &self.reads_error {
            return Some(error.clone());
        }
        (Instant::now() >= self.trusted_until)
            .then(|| format!("the engine's writer has not confirmed its revision within {LEASE:?}"))
    }
}

impl fmt::Debug for RememberingEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RememberingEngine")
            .field("inner", &self.inner)
            .field("board", &self.shown_board())
            .field("state", &*self.state.lock())
            .finish()
    }
}

impl RememberingEngine {
    /// The answer remembered for `input`, or `asked` (the inner engine's,
    /// awaited only then), remembered while its generation is trusted.
    async fn remembered(
        &self,
        path: &str,
        input: InputRoot<'_>,
        asked: impl Future<Output = Result<QueryOutcome, EngineError>>,
    ) -> Result<QueryOutcome, EngineError> {
        let key = match self.remembering() {
            Some((generation, reads)) if self.memo.enabled() => {
                reads.key(path, input).map(|key| (generation, key))
            }
            _ => None,
        };
        if let Some((generation, key)) = &key
            && let Some(outcome) = self.memo.get(*generation, key)
        {
            return Ok(outcome);
        }
        let outcome = asked.await?;
        if let Some((generation, key)) = &key
            && self.still_trusted(*generation)
        {
            self.memo.put(*generation, key, &outcome);
        }
        Ok(outcome)
    }

    /// `inner`'s decisions remembered in about `budget` bytes while the board
    /// at `board` (the writer's revisions endpoint) is followed; run
    /// [`RememberingEngine::follow`] for that.
    pub fn new(
        inner: Arc<dyn PolicyEngine>,
        budget: usize,
        board: Url,
    ) -> Result<Self, EngineError> {
        if board.scheme() != "http" {
            return Err(EngineError::Config(format!(
                "the engine's revisions are served over plain HTTP on the pod's loopback, not {}",
                crate::opa::redacted_url(&board)
            )));
        }
        // reqwest needs a process-wide provider even for plain HTTP (as `Opa`).
        let _ = rustls::crypto::ring::default_provider().install_default();
        // Plain HTTP: images carry no system CA store, and none is needed.
        let client = reqwest::Client::builder()
            .timeout(HOLD + Duration::from_secs(2))
            .tls_certs_only([])
            .build()
            .map_err(|e| EngineError::Config(format!("HTTP client: {e}")))?;
        Ok(Self::following(
            inner,
            budget,
            Feed::Remote { board, client },
            "webhook",
        ))
    }

    /// `inner`'s decisions remembered in about `budget` bytes by the writer of
    /// the engine itself, following `board` (its own) in this process; run
    /// [`RememberingEngine::follow`] for that. `inner` is the engine whose
    /// writes `board` announces.
    pub fn beside_writer(
        inner: Arc<dyn PolicyEngine>,
        budget: usize,
        board: Arc<RevisionBoard>,
    ) -> Self {
        Self::following(inner, budget, Feed::Local(board), "writer")
    }

    fn following(inner: Arc<dyn PolicyEngine>, budget: usize, feed: Feed, role: &str) -> Self {
        RememberingEngine {
            inner,
            memo: DecisionMemo::new(budget),
            feed,
            reader: reader_id(role),
            state: Mutex::new(Following {
                seen: None,
                seen_module_writes: 0,
                generation: 0,
                trusted_until: Instant::now(),
                reads: None,
                feed_error: None,
                reads_error: None,
            }),
        }
    }

    /// The generation and input reads to remember under, when remembering is
    /// sound now.
    fn remembering(&self) -> Option<(u64, Arc<InputReads>)> {
        let state = self.state.lock();
        let seen = state.seen?;
        if !seen.at_rest() || Instant::now() >= state.trusted_until {
            return None;
        }
        match &state.reads {
            Some((at, Ok(reads))) if *at == (seen.epoch, state.seen_module_writes) => {
                Some((state.generation, Arc::clone(reads)))
            }
            _ => None,
        }
    }

    /// Whether an answer that arrived now, asked for under `generation`,
    /// belongs to it: no newer revision acknowledged, and the lease still on.
    fn still_trusted(&self, generation: u64) -> bool {
        let state = self.state.lock();
        state.generation == generation && Instant::now() < state.trusted_until
    }

    /// Follow the board for the life of the process.
    pub async fn follow(&self) {
        let mut failing = false;
        loop {
            let acknowledged = self.state.lock().seen;
            let asked = Instant::now();
            match self.ask(acknowledged).await {
                Ok(announced) => {
                    if failing {
                        tracing::info!(board = %self.shown_board(), "following the engine's revisions again");
                        failing = false;
                    }
                    if self.observe(announced, asked) {
                        let reads = self
                            .inner
                            .policies()
                            .await
                            .map_err(|e| format!("cannot read the engine's modules: {e}"))
                            .map(|modules| crate::embedded::input_reads(&modules));
                        self.install_reads(announced, reads);
                    }
                }
                Err(detail) => {
                    if !failing {
                        tracing::warn!(
                            board = %self.shown_board(),
                            %detail,
                            "the engine's revisions are not answering: every review is evaluated"
                        );
                        failing = true;
                    }
                    // Unconfirmed is untrusted: stop remembering now rather
                    // than when the lease would have run out.
                    self.lose_trust(format!(
                        "the engine's revisions are not answering: {detail}"
                    ));
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }

    fn shown_board(&self) -> String {
        match &self.feed {
            Feed::Remote { board, .. } => crate::opa::redacted_url(board),
            Feed::Local(_) => "this process's own".to_owned(),
        }
    }

    async fn ask(&self, acknowledged: Option<Revision>) -> Result<Announcement, String> {
        let (board, client) = match &self.feed {
            Feed::Remote { board, client } => (board, client),
            Feed::Local(board) => {
                return board
                    .poll(Poll::new(&self.reader, acknowledged), HOLD)
                    .await
                    .map_err(|e| e.to_string());
            }
        };
        let mut url = board.clone();
        {
            let mut query = url.query_pairs_mut();
            query.append_pair("reader", &self.reader);
            if let Some(revision) = acknowledged {
                query
                    .append_pair("epoch", &revision.epoch.to_string())
                    .append_pair("counter", &revision.counter.to_string());
            }
        }
        let response = client
            .get(url)
            .send()
            .await
            .map_err(|e| e.without_url().to_string())?;
        let status = response.status();
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            return Err(format!(
                "HTTP {status}: {}",
                crate::text::truncate(body.trim(), 200)
            ));
        }
        response
            .json::<Announcement>()
            .await
            .map_err(|e| format!("not a revision: {}", e.without_url()))
    }

    /// Take in the board's answer to a poll sent at `asked`: a new revision
    /// forgets everything (before the next poll acknowledges it). Returns
    /// whether the input reads of this revision are to be fetched.
    fn observe(&self, announced: Announcement, asked: Instant) -> bool {
        let revision = announced.revision;
        let mut state = self.state.lock();
        state.feed_error = None;
        if state.seen != Some(revision) {
            state.seen = Some(revision);
            state.generation += 1;
            self.memo.advance(state.generation);
        }
        state.seen_module_writes = announced.module_writes;
        state.trusted_until = asked + LEASE;
        let modules = (revision.epoch, announced.module_writes);
        revision.at_rest() && !matches!(&state.reads, Some((at, _)) if *at == modules)
    }

    /// Keep the input reads fetched at `announced`, if the engine is still
    /// known to be there (a write after the lease ran out could have changed
    /// the modules while they were read).
    fn install_reads(
        &self,
        announced: Announcement,
        reads: Result<Result<Arc<InputReads>, Uncacheable>, String>,
    ) {
        let mut state = self.state.lock();
        if state.seen != Some(announced.revision) || Instant::now() >= state.trusted_until {
            return;
        }
        match reads {
            Ok(reads) => {
                state.reads_error = reads.as_ref().err().map(ToString::to_string);
                let modules = (announced.revision.epoch, announced.module_writes);
                state.reads = Some((modules, reads));
            }
            Err(detail) => {
                if state.reads_error.as_ref() != Some(&detail) {
                    tracing::warn!(%detail, "decisions not remembered: every review is evaluated");
                }
                state.reads_error = Some(detail);
            }
        }
    }

    fn lose_trust(&self, why: String) {
        let mut state = self.state.lock();
        state.feed_error = Some(why);
        state.trusted_until = state.trusted_until.min(Instant::now());
    }
}

/// Random per process, so that a restarted webhook is a new reader.
fn reader_id(role: &str) -> String {
    format!("{role}-{:016x}", crate::revision_board::random_u64())
}

/// Queries answered from memory where that is sound; everything else as the
/// inner engine does it.
#[async_trait]
impl delegating::Delegating for RememberingEngine {
    fn inner(&self) -> &dyn PolicyEngine {
        &*self.inner
    }

    async fn query(
        &self,
        path: &str,
        input: &Value,
        deadline: Instant,
    ) -> Result<QueryOutcome, EngineError> {
        let asked = self.inner.query(path, input, deadline);
        self.remembered(path, InputRoot::Value(input), asked).await
    }

    async fn query_input(
        &self,
        path: &str,
        input: &PolicyInput<'_>,
        deadline: Instant,
    ) -> Result<QueryOutcome, EngineError> {
        let asked = self.inner.query_input(path, input, deadline);
        self.remembered(path, input.root(), asked).await
    }

    fn decision_cache(&self) -> Option<DecisionCacheStats> {
        let off = self.state.lock().off();
        Some(self.memo.stats(off))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embedded::Embedded;
    use serde_json::json;

    const MODULE: &str = r#"package t
answer := input.kind
"#;

    /// An engine (embedded, its own memory off) behind a feed nobody serves:
    /// the tests play the board's answers through `observe`.
    async fn remembering() -> RememberingEngine {
        let inner = Embedded::new().with_decision_cache(0);
        inner.put_policy("t.rego", MODULE).await.unwrap();
        RememberingEngine::new(
            Arc::new(inner),
            1 << 20,
            Url::parse("http://127.0.0.1:9/engine/revisions").unwrap(),
        )
        .unwrap()
    }

    /// Revision `counter` of epoch 7, after `module_writes` module writes.
    fn revision(counter: u64, module_writes: u64) -> Announcement {
        Announcement {
            revision: Revision { epoch: 7, counter },
            module_writes,
        }
    }

    async fn ask(engine: &RememberingEngine, kind: &str) -> QueryOutcome {
        let deadline = Instant::now() + Duration::from_secs(5);
        engine
            .query("t/answer", &json!({"kind": kind, "name": "x"}), deadline)
            .await
            .unwrap()
    }

    async fn at_rest(engine: &RememberingEngine, counter: u64) {
        let r = revision(counter, counter);
        assert!(engine.observe(r, Instant::now()), "reads to fetch");
        let modules = engine.inner.policies().await.unwrap();
        engine.install_reads(r, Ok(crate::embedded::input_reads(&modules)));
    }

    fn hits(engine: &RememberingEngine) -> u64 {
        engine.decision_cache().unwrap().hits
    }

    #[tokio::test(start_paused = true)]
    async fn remembers_only_at_rest_at_a_confirmed_revision() {
        let engine = remembering().await;
        ask(&engine, "A").await;
        ask(&engine, "A").await;
        assert_eq!(hits(&engine), 0, "nothing before the first revision");
        assert!(engine.decision_cache().unwrap().refused.is_some());

        at_rest(&engine, 2).await;
        assert_eq!(engine.decision_cache().unwrap().refused, None);
        ask(&engine, "A").await;
        ask(&engine, "A").await;
        assert_eq!(hits(&engine), 1);

        // A write announced: forgotten at once, nothing remembered meanwhile.
        assert!(!engine.observe(revision(3, 3), Instant::now()));
        ask(&engine, "A").await;
        ask(&engine, "A").await;
        assert_eq!(hits(&engine), 1);
        // At rest again, under the new revision only.
        at_rest(&engine, 4).await;
        ask(&engine, "A").await;
        ask(&engine, "A").await;
        assert_eq!(hits(&engine), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn the_modules_are_read_again_only_after_a_module_write() {
        let engine = remembering().await;
        at_rest(&engine, 2).await;
        ask(&engine, "A").await;
        // Data written: forgotten, but the input reads stand.
        assert!(!engine.observe(revision(3, 2), Instant::now()));
        assert!(
            !engine.observe(revision(4, 2), Instant::now()),
            "no reads to fetch"
        );
        ask(&engine, "A").await;
        ask(&engine, "A").await;
        assert_eq!(hits(&engine), 1, "remembered anew under revision 4 only");
        // A module written: nothing is remembered until they are read again.
        assert!(!engine.observe(revision(5, 3), Instant::now()));
        assert!(
            engine.observe(revision(6, 3), Instant::now()),
            "reads to fetch"
        );
        assert!(engine.remembering().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_computed_before_a_new_revision_is_not_kept() {
        let engine = remembering().await;
        at_rest(&engine, 2).await;
        let (generation, _) = engine.remembering().unwrap();
        // The board moved on while the answer was on its way.
        engine.observe(revision(3, 3), Instant::now());
        assert!(!engine.still_trusted(generation));
        // Modules read for a revision that is no longer current are dropped.
        let modules = engine.inner.policies().await.unwrap();
        engine.install_reads(revision(2, 2), Ok(crate::embedded::input_reads(&modules)));
        assert!(engine.remembering().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn trust_ends_with_the_lease_or_at_once_when_the_board_fails() {
        let engine = remembering().await;
        at_rest(&engine, 2).await;
        assert!(engine.remembering().is_some());
        tokio::time::advance(LEASE).await;
        assert!(engine.remembering().is_none(), "the lease ran out");
        let off = engine.decision_cache().unwrap().refused.unwrap();
        assert!(off.contains("not confirmed"), "{off}");

        // Renewed by the next answer (the same revision: nothing to read again).
        assert!(!engine.observe(revision(2, 2), Instant::now()));
        assert!(engine.remembering().is_some());
        engine.lose_trust("connection refused".to_owned());
        assert!(
            engine.remembering().is_none(),
            "a failed poll ends trust now"
        );
        assert_eq!(
            engine.decision_cache().unwrap().refused.as_deref(),
            Some("connection refused")
        );
    }

    /// Until `engine` follows a revision at rest with its input reads.
    async fn trusted(engine: &RememberingEngine) {
        for _ in 0..100 {
            if engine.remembering().is_some() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "never trusted: {:?}",
            engine.decision_cache().unwrap().refused
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_writer_remembers_its_own_decisions_until_it_writes() {
        let board = Arc::new(RevisionBoard::new());
        let embedded = Embedded::new().with_decision_cache(0);
        embedded.put_policy("t.rego", MODULE).await.unwrap();
        let writes: Arc<dyn PolicyEngine> = Arc::new(crate::revision_board::AnnouncedWrites::new(
            Arc::new(embedded),
            Arc::clone(&board),
        ));
        let engine = Arc::new(RememberingEngine::beside_writer(
            writes,
            1 << 20,
            Arc::clone(&board),
        ));
        let following = Arc::clone(&engine);
        tokio::spawn(async move { following.follow().await });
        trusted(&engine).await;
        ask(&engine, "A").await;
        ask(&engine, "A").await;
        assert_eq!(hits(&engine), 1);

        // The write waits for the reader's acknowledgement, so what it
        // remembered is gone before the write reaches the engine.
        engine.put_data("x", &json!(1)).await.unwrap();
        assert!(board.current().at_rest());
        trusted(&engine).await;
        ask(&engine, "A").await;
        assert_eq!(hits(&engine), 1, "evaluated again after the write");
        ask(&engine, "A").await;
        assert_eq!(hits(&engine), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_policy_set_that_cannot_be_pinned_is_not_remembered() {
        let engine = remembering().await;
        engine
            .inner
            .put_policy("whole.rego", "package w\nall := input\n")
            .await
            .unwrap();
        at_rest(&engine, 2).await;
        assert!(engine.remembering().is_none());
        let off = engine.decision_cache().unwrap().refused.unwrap();
        assert!(off.contains("whole.rego"), "{off}");
    }
}
