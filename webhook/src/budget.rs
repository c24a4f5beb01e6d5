//! The memory requests may hold: charged for what a body holds as it
//! arrives (never for what it only declares), then for what parsing and
//! converting it will take, so a flood of large or stalled bodies, or bodies
//! that expand a lot when parsed, is refused instead of growing the process.
//!
//! No one peer (an address, an IPv6 /64) may hold more than its share,
//! three quarters of the budget, so that one pod can never deny another's
//! admission; callers with a verified client certificate (the API server)
//! have no share to keep to.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::metrics::Metrics;

/// Charges at or below this may use the reserve, so small (normal) reviews
/// still pass while large ones have taken the rest of the budget.
const SMALL_CHARGE: usize = 1024 * 1024;

/// What one JSON value (a node) costs once parsed and converted: the parsed
/// review (`serde_json::Value`, 32 bytes plus container growth), the developer
/// view copied from it for the policy input, and the engine's own copy of the
/// input (a Rego value and its reference-counted allocation, or OPA's request
/// body), with allocator rounding. Checked against the resident memory an
/// UPDATE review (object and oldObject) grew the embedded-engine webhook by:
/// 180,000 empty arrays, empty objects or short strings, 360,000 object keys, or
/// one 12 MB string were estimated at 1.5 to 4.6 times their real growth (the
/// closest: object keys, 95 MiB estimated, 62 MiB measured).
pub(crate) const NODE_BYTES: usize = 256;

/// Copies of every string byte alive while a review is answered: the body,
/// the parsed review, the developer view, the engine's input.
pub(crate) const STRING_COPIES: usize = 4;

/// The shared budget.
pub(crate) struct MemoryBudget {
    total: usize,
    reserve: usize,
    held: Mutex<Held>,
    metrics: Arc<Metrics>,
}

/// What is held, in all and by each peer that keeps to a share.
#[derive(Debug, Default)]
struct Held {
    used: usize,
    peers: HashMap<IpAddr, usize>,
}

impl fmt::Debug for MemoryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryBudget")
            .field("total", &self.total)
            .field("used", &self.held.lock().used)
            .finish()
    }
}

/// A charge was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The budget is taken by requests in progress.
    Exhausted {
        wanted: usize,
        used: usize,
        total: usize,
    },
    /// The caller's peer holds its share of the budget already.
    PeerShare {
        wanted: usize,
        held: usize,
        share: usize,
    },
}

impl Refusal {
    /// The reason counted and logged.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Refusal::Exhausted { .. } => "memory_budget",
            Refusal::PeerShare { .. } => "peer_memory_share",
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Exhausted {
                wanted,
                used,
                total,
            } => write!(
                f,
                "the webhook is at its memory budget ({used} of {total} bytes held by reviews in progress; this one needs {wanted}): retry (--memory-budget)"
            ),
            Refusal::PeerShare {
                wanted,
                held,
                share,
            } => write!(
                f,
                "this client's reviews in progress hold {held} bytes, its share of the webhook's memory budget is {share} (this one needs {wanted}): retry when they are answered (--memory-budget)"
            ),
        }
    }
}

/// Bytes held against the budget; given back when dropped.
#[derive(Debug)]
pub(crate) struct Charge {
    budget: Arc<MemoryBudget>,
    /// The peer whose share it counts toward (`None`: a verified caller).
    peer: Option<IpAddr>,
    bytes: usize,
}

impl MemoryBudget {
    pub(crate) fn new(total: usize, metrics: Arc<Metrics>) -> Arc<Self> {
        metrics.memory_budget(0, total);
        Arc::new(MemoryBudget {
            total,
            reserve: total / 4,
            held: Mutex::new(Held::default()),
            metrics,
        })
    }

    /// The share of one peer: everything but the reserve.
    fn share(&self) -> usize {
        self.total - self.reserve
    }

    /// A charge of nothing yet for a request from `peer` (`None`: a caller
    /// with a verified certificate, which keeps to no share); it grows with
    /// [`Charge::resize`], refused at once when the budget does not allow it
    /// (waiting would let stalled requests queue up everyone else).
    pub(crate) fn charge_for(self: &Arc<Self>, peer: Option<IpAddr>) -> Charge {
        Charge {
            budget: Arc::clone(self),
            peer,
            bytes: 0,
        }
    }
}

impl Charge {
    /// Grow (if the budget allows) or shrink to `bytes`.
    pub(crate) fn resize(&mut self, bytes: usize) -> Result<(), Refusal> {
        let budget = &self.budget;
        let mut held = budget.held.lock();
        if bytes <= self.bytes {
            let freed = self.bytes - bytes;
            held.used -= freed;
            if let Some(peer) = self.peer {
                let emptied = held.peers.get_mut(&peer).is_some_and(|mine| {
                    *mine -= freed;
                    *mine == 0
                });
                if emptied {
                    held.peers.remove(&peer);
                }
            }
            self.bytes = bytes;
            budget.metrics.memory_budget(held.used, budget.total);
            return Ok(());
        }
        let extra = bytes - self.bytes;
        // Large charges leave the reserve to small ones.
        let ceiling = if bytes <= SMALL_CHARGE {
            budget.total
        } else {
            budget.total - budget.reserve
        };
        if held.used + extra > ceiling {
            return Err(Refusal::Exhausted {
                wanted: bytes,
                used: held.used,
                total: budget.total,
            });
        }
        if let Some(peer) = self.peer {
            let mine = held.peers.get(&peer).copied().unwrap_or(0);
            if mine + extra > budget.share() {
                return Err(Refusal::PeerShare {
                    wanted: bytes,
                    held: mine,
                    share: budget.share(),
                });
            }
            *held.peers.entry(peer).or_default() += extra;
        }
        held.used += extra;
        self.bytes = bytes;
        budget.metrics.memory_budget(held.used, budget.total);
        Ok(())
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        let _ = self.resize(0);
    }
}

/// The shape of a JSON document, counted without building it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct JsonShape {
    /// Values, object keys included.
    pub(crate) nodes: usize,
    /// Bytes of strings and object keys, as written.
    pub(crate) string_bytes: usize,
}

/// Why a body is not JSON, as far as counting its shape tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ShapeError {
    #[error("EOF while parsing a value")]
    Empty,
    #[error("EOF while parsing a string")]
    OpenString,
    #[error("EOF while parsing a list or an object ({0} left open)")]
    Open(usize),
    #[error("unbalanced `{}` at byte {at}", char::from(*.byte))]
    Unbalanced { byte: u8, at: usize },
    #[error("trailing characters at byte {0}")]
    Trailing(usize),
    #[error("nested deeper than {MAX_DEPTH} lists and objects")]
    TooDeep,
}

/// The deepest nesting serde_json parses (its recursion limit, 128, is spent
/// at the 128th list or object): a deeper body would not parse.
const MAX_DEPTH: usize = 127;

impl JsonShape {
    /// Count `body`'s values and string bytes in one pass over its bytes that
    /// allocates nothing (no UTF-8, number or escape decoding; strings
    /// skipped with memchr: a fraction of a parse's time). Strings count their bytes as written, escapes
    /// included, so never less than they decode to. Fails where the
    /// structure is broken: a string or a list or object left open, an
    /// unbalanced bracket, more after the value, nesting deeper than the
    /// parser takes; what else is not JSON the parse itself refuses, having
    /// built at most what was counted here.
    pub(crate) fn of(body: &[u8]) -> Result<JsonShape, ShapeError> {
        let mut shape = JsonShape::default();
        let mut depth = 0usize;
        // A scalar (number, true, false, null) is being read.
        let mut in_scalar = false;
        // The top-level value is complete.
        let mut ended = false;
        let mut i = 0;
        while i < body.len() {
            let byte = body[i];
            let scalar = byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'+' | b'.');
            if scalar {
                if !in_scalar {
                    if ended {
                        return Err(ShapeError::Trailing(i));
                    }
                    shape.nodes += 1;
                    in_scalar = true;
                }
                i += 1;
                continue;
            }
            if in_scalar {
                in_scalar = false;
                ended |= depth == 0;
            }
            match byte {
                b' ' | b'\t' | b'\n' | b'\r' => {}
                _ if ended => return Err(ShapeError::Trailing(i)),
                b'"' => {
                    shape.nodes += 1;
                    let start = i + 1;
                    i = start;
                    // To the closing quote, past escapes: most of a review's
                    // bytes are in strings, found at memchr's pace.
                    loop {
                        let rest = body.get(i..).unwrap_or_default();
                        let found =
                            memchr::memchr2(b'"', b'\\', rest).ok_or(ShapeError::OpenString)?;
                        i += found;
                        if body[i] == b'"' {
                            break;
                        }
                        i += 2;
                    }
                    shape.string_bytes += i - start;
                    ended = depth == 0;
                }
                b'{' | b'[' => {
                    shape.nodes += 1;
                    depth += 1;
                    if depth > MAX_DEPTH {
                        return Err(ShapeError::TooDeep);
                    }
                }
                b'}' | b']' => {
                    depth = depth
                        .checked_sub(1)
                        .ok_or(ShapeError::Unbalanced { byte, at: i })?;
                    ended = depth == 0;
                }
                // Separators, and bytes no JSON has, which the parse refuses.
                _ => {}
            }
            i += 1;
        }
        match (depth, shape.nodes) {
            (0, 0) => Err(ShapeError::Empty),
            (0, _) => Ok(shape),
            (open, _) => Err(ShapeError::Open(open)),
        }
    }

    /// Memory to hold `body` and what answering it builds from it.
    pub(crate) fn cost(&self, body_len: usize) -> usize {
        body_len
            .saturating_add(self.nodes.saturating_mul(NODE_BYTES))
            .saturating_add(self.string_bytes.saturating_mul(STRING_COPIES))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(total: usize) -> Arc<MemoryBudget> {
        MemoryBudget::new(total, Arc::new(Metrics::new()))
    }

    fn charge(
        budget: &Arc<MemoryBudget>,
        peer: Option<IpAddr>,
        bytes: usize,
    ) -> Result<Charge, Refusal> {
        let mut charge = budget.charge_for(peer);
        charge.resize(bytes)?;
        Ok(charge)
    }

    fn peer(last: u8) -> Option<IpAddr> {
        Some(IpAddr::from([10, 0, 0, last]))
    }

    #[test]
    fn charges_are_held_until_dropped() {
        let budget = budget(64 << 20);
        let a = charge(&budget, None, 20 << 20).unwrap();
        let b = charge(&budget, None, 20 << 20).unwrap();
        // Large charges cannot take the reserve (16 MiB of 64).
        let refused = charge(&budget, None, 20 << 20).unwrap_err();
        assert!(
            matches!(refused, Refusal::Exhausted { used, .. } if used == 40 << 20),
            "{refused:?}"
        );
        // A small one can.
        let small = charge(&budget, None, 1 << 20).unwrap();
        drop(a);
        let mut c = charge(&budget, None, 20 << 20).unwrap();
        c.resize(4 << 20).unwrap();
        drop((b, small, c));
        assert_eq!(budget.held.lock().used, 0);
    }

    #[test]
    fn growing_a_charge_can_fail_and_keeps_what_it_had() {
        let budget = budget(16 << 20);
        let mut charge = charge(&budget, None, 1 << 20).unwrap();
        assert!(charge.resize(15 << 20).is_err());
        assert_eq!(charge.bytes, 1 << 20);
        assert_eq!(budget.held.lock().used, 1 << 20);
    }

    /// One peer holds three quarters at most, however small its charges
    /// (the reserve of small charges included): the last quarter is always
    /// another's. A verified caller keeps to no share.
    #[test]
    fn one_peer_holds_at_most_its_share() {
        let budget = budget(64 << 20);
        let held: Vec<Charge> = (0..48)
            .map(|_| charge(&budget, peer(2), 1 << 20).unwrap())
            .collect();
        let refused = charge(&budget, peer(2), 1 << 20).unwrap_err();
        assert_eq!(
            refused,
            Refusal::PeerShare {
                wanted: 1 << 20,
                held: 48 << 20,
                share: 48 << 20
            }
        );
        assert_eq!(refused.reason(), "peer_memory_share");
        let others: Vec<Charge> = (0..16)
            .map(|_| charge(&budget, peer(3), 1 << 20).unwrap())
            .collect();
        drop(held);
        assert!(!budget.held.lock().peers.contains_key(&peer(2).unwrap()));
        let verified = charge(&budget, None, 1 << 20).unwrap();
        drop((others, verified));
        assert_eq!(budget.held.lock().used, 0);
        assert!(budget.held.lock().peers.is_empty());
    }

    #[test]
    fn shape_counts_values_keys_and_string_bytes() {
        let shape = JsonShape::of(br#"{"a": [1, "xyz", null, {"b": true}], "c": []}"#).unwrap();
        // object, "a", array, 1, "xyz", null, object, "b", true, "c", array
        assert_eq!(shape.nodes, 11);
        assert_eq!(shape.string_bytes, 1 + 3 + 1 + 1);
        // Escapes count as written: never less than they decode to.
        let escaped = JsonShape::of(br#"["a\"b", "\u00e9", "]"]"#).unwrap();
        assert_eq!((escaped.nodes, escaped.string_bytes), (4, 4 + 6 + 1));
        let scalars = JsonShape::of(b" [-1.5e3, true, false, null] ").unwrap();
        assert_eq!(scalars.nodes, 5);
        assert_eq!(JsonShape::of(b"7").unwrap().nodes, 1);
    }

    #[test]
    fn shape_refuses_broken_structure() {
        assert_eq!(JsonShape::of(b"[1,"), Err(ShapeError::Open(1)));
        assert_eq!(JsonShape::of(b"[1] x"), Err(ShapeError::Trailing(4)));
        assert_eq!(JsonShape::of(b"1 2"), Err(ShapeError::Trailing(2)));
        assert_eq!(JsonShape::of(br#""a" {}"#), Err(ShapeError::Trailing(4)));
        assert_eq!(JsonShape::of(b"[]]"), Err(ShapeError::Trailing(2)));
        assert_eq!(
            JsonShape::of(b"}"),
            Err(ShapeError::Unbalanced { byte: b'}', at: 0 })
        );
        assert_eq!(JsonShape::of(br#"{"a": "b"#), Err(ShapeError::OpenString));
        assert_eq!(JsonShape::of(br#"["a\"]"#), Err(ShapeError::OpenString));
        assert_eq!(JsonShape::of(b"  "), Err(ShapeError::Empty));
        // As deep as serde_json parses, and one deeper.
        let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(serde_json::from_str::<serde_json::Value>(&nested(127)).is_ok());
        assert_eq!(JsonShape::of(nested(127).as_bytes()).unwrap().nodes, 127);
        assert!(serde_json::from_str::<serde_json::Value>(&nested(128)).is_err());
        assert_eq!(
            JsonShape::of(nested(128).as_bytes()),
            Err(ShapeError::TooDeep)
        );
    }

    #[test]
    fn expanding_bodies_cost_more_than_their_size() {
        let arrays = format!("[{}[]]", "[],".repeat(100_000));
        let shape = JsonShape::of(arrays.as_bytes()).unwrap();
        assert!(shape.cost(arrays.len()) > 80 * arrays.len());
        let text = format!("{{\"a\": \"{}\"}}", "x".repeat(100_000));
        let shape = JsonShape::of(text.as_bytes()).unwrap();
        assert!(shape.cost(text.len()) < 6 * text.len());
    }
}
