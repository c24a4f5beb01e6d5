//! Connection slots shared fairly between peers. A peer (an IPv4 address, or
//! an IPv6 /64: [`peer_key`]) holds at most its share; when every slot is
//! taken, a newcomer from a peer that holds at least two fewer connections
//! than the largest holder takes one of that holder's idle connections (the
//! oldest), which closes. So one peer, or several, holding every slot they
//! can leaves any other peer (the API server comes from few addresses) a way
//! in, and the holder cannot win its slots back by reconnecting.
//!
//! Trusted connections (a client certificate the TLS layer verified, or a
//! caller from this host on a listener that trusts it) are the API server's
//! or the pod's own: they count toward no peer's share, a peer that holds one
//! takes an idle untrusted connection whenever every slot is taken, and no
//! untrusted newcomer ever takes theirs.
//!
//! Beyond the slots, a few are kept for probes ([`Slots::reserve`]): a
//! connection that finds every slot taken may still take one of them, to be
//! answered one probe request; a newcomer there takes the oldest idle one
//! (its own peer's first), so that idle connections never keep the kubelet
//! out.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The peer a connection from `ip` counts for: the address itself (IPv4,
/// also when written as IPv4-mapped IPv6), or its /64 (IPv6: one host gets a
/// /64 and picks addresses in it at will, so per-address counting would let
/// it count as many peers; rate limiters count IPv6 per /64 alike).
pub fn peer_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(Ipv6Addr::from(prefix))
            }
        },
    }
}

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

/// How a pool of slots is shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sharing {
    /// Fairly between peers (the module documentation).
    Fair,
    /// Kept for probes: a newcomer takes the oldest idle connection.
    Probes,
}

#[derive(Debug)]
pub(crate) struct Slots {
    max_total: usize,
    max_per_peer: usize,
    sharing: Sharing,
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
    /// Increasing: the lower, the older.
    id: u64,
    trusted: bool,
    activity: Arc<Activity>,
}

impl State {
    /// Connections of `peer` that count toward its share.
    fn untrusted(&self, peer: &IpAddr) -> usize {
        self.peers
            .get(peer)
            .map_or(0, |held| held.iter().filter(|h| !h.trusted).count())
    }

    fn trusts(&self, peer: &IpAddr) -> bool {
        self.peers
            .get(peer)
            .is_some_and(|held| held.iter().any(|h| h.trusted))
    }

    /// Take (close) the connection `id` of `peer`.
    fn take(&mut self, peer: IpAddr, id: u64) {
        let Some(held) = self.peers.get_mut(&peer) else {
            return;
        };
        let Some(index) = held.iter().position(|h| h.id == id) else {
            return;
        };
        let taken = held.remove(index);
        if held.is_empty() {
            self.peers.remove(&peer);
        }
        self.total -= 1;
        taken.activity.evicted.cancel();
    }

    /// The oldest idle untrusted connection among `peers` (that `pick`
    /// accepts, by their untrusted count): its peer and id.
    fn oldest_idle(&self, pick: impl Fn(&IpAddr, usize) -> bool) -> Option<(IpAddr, u64)> {
        self.peers
            .iter()
            .filter(|(peer, held)| pick(peer, held.iter().filter(|h| !h.trusted).count()))
            .flat_map(|(peer, held)| {
                held.iter()
                    .filter(|h| !h.trusted && h.activity.idle())
                    .map(move |h| (*peer, h.id))
            })
            .min_by_key(|(_, id)| *id)
    }
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
        Slots::shared(max_total, max_per_peer, Sharing::Fair)
    }

    /// `capacity` slots kept for probes, at most `per_peer` of one peer.
    pub(crate) fn reserve(capacity: usize, per_peer: usize) -> Arc<Slots> {
        Slots::shared(capacity, per_peer, Sharing::Probes)
    }

    fn shared(max_total: usize, max_per_peer: usize, sharing: Sharing) -> Arc<Slots> {
        Arc::new(Slots {
            max_total: max_total.max(1),
            max_per_peer: max_per_peer.clamp(1, max_total.max(1)),
            sharing,
            state: Mutex::new(State::default()),
        })
    }

    /// A slot for a new connection from `peer` ([`peer_key`]'s), `trusted`
    /// already (a caller from this host on a listener that trusts it), taking
    /// an idle connection of another peer when every slot is taken and that
    /// is fairer.
    pub(crate) fn acquire(self: &Arc<Self>, peer: IpAddr, trusted: bool) -> Result<Slot, Refused> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match self.sharing {
            Sharing::Fair => self.make_room_fairly(&mut state, peer, trusted)?,
            Sharing::Probes => self.make_room_for_a_probe(&mut state, peer)?,
        }
        state.total += 1;
        state.next_id += 1;
        let id = state.next_id;
        let activity = Activity::new();
        state.peers.entry(peer).or_default().push(Held {
            id,
            trusted,
            activity: Arc::clone(&activity),
        });
        Ok(Slot {
            slots: Arc::clone(self),
            peer,
            id,
            activity,
        })
    }

    fn make_room_fairly(
        &self,
        state: &mut State,
        peer: IpAddr,
        trusted: bool,
    ) -> Result<(), Refused> {
        let trusted = trusted || state.trusts(&peer);
        let mine = state.untrusted(&peer);
        if !trusted && mine >= self.max_per_peer {
            return Err(Refused::PeerLimit);
        }
        if state.total < self.max_total {
            return Ok(());
        }
        // The largest untrusted holder among the other peers gives way (to
        // a trusted newcomer, whatever it holds), its oldest idle connection.
        let largest = state
            .peers
            .keys()
            .filter(|p| **p != peer)
            .map(|p| state.untrusted(p))
            .max()
            .unwrap_or(0);
        let floor = if trusted { 1 } else { mine + 2 };
        if largest < floor {
            return Err(Refused::Full);
        }
        let other = |p: &IpAddr| *p != peer;
        let victim = state
            .oldest_idle(|p, untrusted| other(p) && untrusted == largest)
            .or_else(|| {
                // The largest holder has nothing idle: the next largest that
                // still qualifies.
                state.oldest_idle(|p, untrusted| other(p) && untrusted >= floor)
            });
        let Some((holder, id)) = victim else {
            return Err(Refused::Full);
        };
        state.take(holder, id);
        Ok(())
    }

    fn make_room_for_a_probe(&self, state: &mut State, peer: IpAddr) -> Result<(), Refused> {
        let victim = if state.untrusted(&peer) >= self.max_per_peer {
            state.oldest_idle(|p, _| *p == peer)
        } else if state.total >= self.max_total {
            state.oldest_idle(|_, _| true)
        } else {
            return Ok(());
        };
        let Some((holder, id)) = victim else {
            return Err(Refused::Full);
        };
        state.take(holder, id);
        Ok(())
    }

    /// Slots held.
    pub(crate) fn held(&self) -> usize {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).total
    }
}

impl Slot {
    /// The connection turned out trusted (its client certificate verified):
    /// it no longer counts toward its peer's share, and is never taken.
    pub(crate) fn trust(&self) {
        let mut state = self.slots.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(held) = state
            .peers
            .get_mut(&self.peer)
            .and_then(|held| held.iter_mut().find(|h| h.id == self.id))
        {
            held.trusted = true;
        }
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
mod tests;
