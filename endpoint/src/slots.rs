//! Connection slots shared fairly between peers. A peer (an IP address) holds
//! at most its share; when every slot is taken, a newcomer from a peer that
//! holds at least two fewer connections than the largest holder takes one
//! of that holder's idle connections (the oldest), which closes. So one peer,
//! or several, holding every slot they can leaves any other peer (the API
//! server comes from few addresses) a way in, and the holder cannot win its
//! slots back by reconnecting.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// What a connection shares with the slots: whether a request is in
/// progress (only idle connections are taken), and the signal that it was.
#[derive(Debug)]
pub(crate) struct Activity {
    pub(crate) in_flight: watch::Sender<usize>,
    pub(crate) evicted: CancellationToken,
}

impl Activity {
    fn new() -> Arc<Activity> {
        Arc::new(Activity {
            in_flight: watch::Sender::new(0),
            evicted: CancellationToken::new(),
        })
    }

    fn idle(&self) -> bool {
        *self.in_flight.borrow() == 0
    }
}

/// Why a connection got no slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Its peer holds its share already.
    PeerLimit,
    /// Every slot is taken, and no peer holds two more than this one (or
    /// those that do have no idle connection).
    Full,
}

impl Refused {
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Refused::PeerLimit => "peer_limit",
            Refused::Full => "limit",
        }
    }
}

#[derive(Debug)]
pub(crate) struct Slots {
    max_total: usize,
    max_per_peer: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    total: usize,
    next_id: u64,
    /// Each peer's connections, oldest first.
    peers: HashMap<IpAddr, Vec<Held>>,
}

#[derive(Debug)]
struct Held {
    id: u64,
    activity: Arc<Activity>,
}

/// A connection's slot, given back when dropped (unless it was taken).
#[derive(Debug)]
pub(crate) struct Slot {
    slots: Arc<Slots>,
    peer: IpAddr,
    id: u64,
    pub(crate) activity: Arc<Activity>,
}

impl Slots {
    pub(crate) fn new(max_total: usize, max_per_peer: usize) -> Arc<Slots> {
        Arc::new(Slots {
            max_total: max_total.max(1),
            max_per_peer: max_per_peer.clamp(1, max_total.max(1)),
            state: Mutex::new(State::default()),
        })
    }

    /// A slot for a new connection from `peer`, taking an idle connection of
    /// the largest holder when every slot is taken and that is fairer.
    pub(crate) fn acquire(self: &Arc<Self>, peer: IpAddr) -> Result<Slot, Refused> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mine = state.peers.get(&peer).map_or(0, Vec::len);
        if mine >= self.max_per_peer {
            return Err(Refused::PeerLimit);
        }
        if state.total >= self.max_total {
            let victim = state
                .peers
                .iter_mut()
                .filter(|(_, held)| held.len() >= mine + 2)
                .max_by_key(|(_, held)| held.len())
                .and_then(|(address, held)| {
                    let idle = held.iter().position(|h| h.activity.idle())?;
                    Some((*address, held.remove(idle)))
                });
            let Some((address, taken)) = victim else {
                return Err(Refused::Full);
            };
            if state.peers.get(&address).is_some_and(Vec::is_empty) {
                state.peers.remove(&address);
            }
            state.total -= 1;
            taken.activity.evicted.cancel();
        }
        state.total += 1;
        state.next_id += 1;
        let id = state.next_id;
        let activity = Activity::new();
        state.peers.entry(peer).or_default().push(Held {
            id,
            activity: Arc::clone(&activity),
        });
        Ok(Slot {
            slots: Arc::clone(self),
            peer,
            id,
            activity,
        })
    }

    /// Slots held.
    pub(crate) fn held(&self) -> usize {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).total
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut state = self.slots.state.lock().unwrap_or_else(|p| p.into_inner());
        let Some(held) = state.peers.get_mut(&self.peer) else {
            return;
        };
        // A taken connection's slot went to the newcomer already.
        let Some(index) = held.iter().position(|h| h.id == self.id) else {
            return;
        };
        held.remove(index);
        if held.is_empty() {
            state.peers.remove(&self.peer);
        }
        state.total -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn a_peer_holds_at_most_its_share() {
        let slots = Slots::new(10, 3);
        let held: Vec<Slot> = (0..3).map(|_| slots.acquire(ip(2)).unwrap()).collect();
        assert_eq!(slots.acquire(ip(2)).unwrap_err(), Refused::PeerLimit);
        assert!(
            slots.acquire(ip(1)).is_ok(),
            "another peer still gets a slot"
        );
        drop(held);
        assert_eq!(slots.held(), 0);
        assert!(slots.acquire(ip(2)).is_ok(), "slots come back when closed");
    }

    #[test]
    fn a_newcomer_takes_the_oldest_idle_connection_of_the_largest_holder() {
        let slots = Slots::new(6, 4);
        let big: Vec<Slot> = (0..4).map(|_| slots.acquire(ip(2)).unwrap()).collect();
        let small: Vec<Slot> = (0..2).map(|_| slots.acquire(ip(3)).unwrap()).collect();
        // The largest holder's oldest connection is busy: the next is taken.
        big[0].activity.in_flight.send_replace(1);
        let newcomer = slots.acquire(ip(1)).unwrap();
        assert!(!big[0].activity.evicted.is_cancelled());
        assert!(big[1].activity.evicted.is_cancelled());
        assert!(small.iter().all(|s| !s.activity.evicted.is_cancelled()));
        assert_eq!(slots.held(), 6, "the taken slot is the newcomer's");
        // The taken connection closing gives back nothing twice.
        drop(big);
        assert_eq!(slots.held(), 3);
        drop((small, newcomer));
        assert_eq!(slots.held(), 0);
    }

    #[test]
    fn when_full_and_fair_newcomers_are_refused() {
        let slots = Slots::new(4, 4);
        let a: Vec<Slot> = (0..2).map(|_| slots.acquire(ip(2)).unwrap()).collect();
        let b: Vec<Slot> = (0..2).map(|_| slots.acquire(ip(3)).unwrap()).collect();
        // Holders of two against a newcomer holding none: one is taken.
        let c = slots.acquire(ip(4)).unwrap();
        assert_eq!(
            a.iter()
                .chain(&b)
                .filter(|s| s.activity.evicted.is_cancelled())
                .count(),
            1
        );
        // Now the largest holds 2 and the newcomer's peer 1: not fairer.
        assert_eq!(slots.acquire(ip(4)).unwrap_err(), Refused::Full);
        // A holder reconnecting cannot win its slot back.
        let holder = if a.iter().any(|s| s.activity.evicted.is_cancelled()) {
            ip(2)
        } else {
            ip(3)
        };
        assert_eq!(slots.acquire(holder).unwrap_err(), Refused::Full);
        drop((a, b, c));
        assert_eq!(slots.held(), 0);
    }

    #[test]
    fn busy_connections_are_never_taken() {
        let slots = Slots::new(2, 2);
        let held: Vec<Slot> = (0..2).map(|_| slots.acquire(ip(2)).unwrap()).collect();
        for slot in &held {
            slot.activity.in_flight.send_replace(1);
        }
        assert_eq!(slots.acquire(ip(1)).unwrap_err(), Refused::Full);
        held[1].activity.in_flight.send_replace(0);
        assert!(slots.acquire(ip(1)).is_ok());
        assert!(held[1].activity.evicted.is_cancelled());
    }
}
