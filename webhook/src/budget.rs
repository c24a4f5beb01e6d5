//! The memory requests may hold: charged before a body is read (for its
//! declared length), then for what parsing and converting it will take, so a
//! flood of large or stalled bodies, or bodies that expand a lot when parsed,
//! is refused instead of growing the process.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};

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
    used: AtomicUsize,
    metrics: Arc<Metrics>,
}

impl fmt::Debug for MemoryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryBudget")
            .field("total", &self.total)
            .field("used", &self.used.load(Ordering::Relaxed))
            .finish()
    }
}

/// A charge was refused: the budget is taken by requests in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Exhausted {
    pub(crate) wanted: usize,
    pub(crate) used: usize,
    pub(crate) total: usize,
}

/// Bytes held against the budget; given back when dropped.
#[derive(Debug)]
pub(crate) struct Charge {
    budget: Arc<MemoryBudget>,
    bytes: usize,
}

impl MemoryBudget {
    pub(crate) fn new(total: usize, metrics: Arc<Metrics>) -> Arc<Self> {
        metrics.memory_budget(0, total);
        Arc::new(MemoryBudget {
            total,
            reserve: total / 4,
            used: AtomicUsize::new(0),
            metrics,
        })
    }

    /// Hold `bytes`, or refuse at once: waiting would let stalled requests
    /// queue up everyone else.
    pub(crate) fn charge(self: &Arc<Self>, bytes: usize) -> Result<Charge, Exhausted> {
        let mut charge = Charge {
            budget: Arc::clone(self),
            bytes: 0,
        };
        charge.resize(bytes)?;
        Ok(charge)
    }

    fn publish(&self, used: usize) {
        self.metrics.memory_budget(used, self.total);
    }
}

impl Charge {
    /// Grow (if the budget allows) or shrink to `bytes`.
    pub(crate) fn resize(&mut self, bytes: usize) -> Result<(), Exhausted> {
        let budget = &self.budget;
        if bytes <= self.bytes {
            let freed = self.bytes - bytes;
            let used = budget.used.fetch_sub(freed, Ordering::AcqRel) - freed;
            self.bytes = bytes;
            budget.publish(used);
            return Ok(());
        }
        let extra = bytes - self.bytes;
        // Large charges leave the reserve to small ones.
        let ceiling = if bytes <= SMALL_CHARGE {
            budget.total
        } else {
            budget.total - budget.reserve
        };
        let result = budget
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(extra).filter(|after| *after <= ceiling)
            });
        match result {
            Ok(before) => {
                self.bytes = bytes;
                budget.publish(before + extra);
                Ok(())
            }
            Err(used) => Err(Exhausted {
                wanted: bytes,
                used,
                total: budget.total,
            }),
        }
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
    /// Bytes of strings and object keys.
    pub(crate) string_bytes: usize,
}

impl JsonShape {
    /// Count `body`'s values and string bytes in one pass that allocates
    /// nothing per value. Fails as the parse would (serde_json's errors,
    /// nesting deeper than 128 included).
    pub(crate) fn of(body: &[u8]) -> Result<JsonShape, serde_json::Error> {
        let mut shape = JsonShape::default();
        let mut de = serde_json::Deserializer::from_slice(body);
        Counter(&mut shape).deserialize(&mut de)?;
        de.end()?;
        Ok(shape)
    }

    /// Memory to hold `body` and what answering it builds from it.
    pub(crate) fn cost(&self, body_len: usize) -> usize {
        body_len
            .saturating_add(self.nodes.saturating_mul(NODE_BYTES))
            .saturating_add(self.string_bytes.saturating_mul(STRING_COPIES))
    }
}

struct Counter<'a>(&'a mut JsonShape);

impl<'de> DeserializeSeed<'de> for Counter<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Counter<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        self.0.nodes += 1;
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        self.0.nodes += 1;
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        self.0.nodes += 1;
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        self.0.nodes += 1;
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        self.0.nodes += 1;
        Ok(())
    }

    fn visit_str<E>(self, value: &str) -> Result<(), E> {
        self.0.nodes += 1;
        self.0.string_bytes += value.len();
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let shape = self.0;
        shape.nodes += 1;
        while seq.next_element_seed(Counter(&mut *shape))?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let shape = self.0;
        shape.nodes += 1;
        while map.next_key_seed(Counter(&mut *shape))?.is_some() {
            map.next_value_seed(Counter(&mut *shape))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(total: usize) -> Arc<MemoryBudget> {
        MemoryBudget::new(total, Arc::new(Metrics::new()))
    }

    #[test]
    fn charges_are_held_until_dropped() {
        let budget = budget(64 << 20);
        let a = budget.charge(20 << 20).unwrap();
        let b = budget.charge(20 << 20).unwrap();
        // Large charges cannot take the reserve (16 MiB of 64).
        let refused = budget.charge(20 << 20).unwrap_err();
        assert_eq!(refused.used, 40 << 20);
        // A small one can.
        let small = budget.charge(1 << 20).unwrap();
        drop(a);
        let mut c = budget.charge(20 << 20).unwrap();
        c.resize(4 << 20).unwrap();
        drop((b, small, c));
        assert_eq!(budget.used.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn growing_a_charge_can_fail_and_keeps_what_it_had() {
        let budget = budget(16 << 20);
        let mut charge = budget.charge(1 << 20).unwrap();
        assert!(charge.resize(15 << 20).is_err());
        assert_eq!(charge.bytes, 1 << 20);
        assert_eq!(budget.used.load(Ordering::Relaxed), 1 << 20);
    }

    #[test]
    fn shape_counts_values_keys_and_string_bytes() {
        let shape = JsonShape::of(br#"{"a": [1, "xyz", null, {"b": true}], "c": []}"#).unwrap();
        // object, "a", array, 1, "xyz", null, object, "b", true, "c", array
        assert_eq!(shape.nodes, 11);
        assert_eq!(shape.string_bytes, 1 + 3 + 1 + 1);
        assert!(JsonShape::of(b"[1,").is_err());
        assert!(JsonShape::of(b"[1] x").is_err());
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert!(JsonShape::of(deep.as_bytes()).is_err());
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
