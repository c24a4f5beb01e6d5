//! Connection slots shared fairly between peers. A peer (an IPv4 address, or
//! an IPv6 prefix, a /64 by default: [`Peers`]) holds at most its share;
//! when every slot is taken, a newcomer from a peer that holds at least two
//! fewer connections than the largest holder takes one of that holder's idle
//! connections (the oldest), which closes. So one peer, or several, holding
//! every slot they can leaves any other peer (the API server comes from few
//! addresses) a way in, and the holder cannot win its slots back by
//! reconnecting.
//!
//! A connection is idle, and may be taken, only once it is open: past its
//! TLS handshake and its first request, or past its opening window (real
//! clients, the kubelet's probes and the API server, send their first
//! request at once; a connection still silent after the window is not
//! theirs), and with no request in progress.
//!
//! Trusted connections (a client certificate the TLS layer verified, or a
//! caller from this host on a listener that trusts it) are the API server's
//! or the pod's own: they count toward no peer's share, take an idle
//! untrusted connection whenever every slot is taken, and no untrusted
//! newcomer ever takes theirs. Trust belongs to a connection, never to its
//! address: a connection is trusted once its own certificate verified.
//!
//! Beyond the slots, a few more are kept ([`Slots::beyond`]) for connections
//! that found no slot: there they complete their TLS handshake (after which
//! a verified one takes a slot as trusted, so the API server is recognised
//! by its certificate whatever its peer holds) and are answered one probe
//! request. A newcomer there takes the oldest idle connection (its own
//! peer's, at its share), or else, when a peer holds at least two more than
//! its own, that peer's oldest connection not serving a request, so that
//! neither idle connections nor fresh ones of a few peers keep the kubelet
//! out, and churn never takes a probe's connection before its request.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How connections are grouped into peers: an IPv4 address (also when
/// written as IPv4-mapped IPv6) is a peer of its own; an IPv6 address counts
/// for its prefix of `ipv6_prefix` bits (a /64 by default: one host gets a
/// /64 and picks addresses in it at will, so per-address counting would let
/// it count as many peers; rate limiters count IPv6 per /64 alike). Where
/// the cluster's pods share the API server's /64, count per address (128):
/// the API server is then no peer of theirs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peers {
    ipv6_prefix: u8,
}

impl Peers {
    /// The default IPv6 prefix of a peer.
    pub const DEFAULT_IPV6_PREFIX: u8 = 64;

    /// Peers of IPv6 prefix length `ipv6_prefix` (1 to 128; 128: each
    /// address apart).
    pub fn new(ipv6_prefix: u8) -> Result<Peers, String> {
        if !(1..=128).contains(&ipv6_prefix) {
            return Err(format!(
                "an IPv6 peer prefix is 1 to 128 bits long (128: each address apart), not {ipv6_prefix}"
            ));
        }
        Ok(Peers { ipv6_prefix })
    }

    /// The peer a connection from `ip` counts for.
    pub fn key(self, ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V4(_) => ip,
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => {
                    let host_bits = 128 - u32::from(self.ipv6_prefix);
                    let mask = u128::MAX.checked_shl(host_bits).unwrap_or(0);
                    IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
                }
            },
        }
    }

    /// The IPv6 prefix length of a peer.
    pub fn ipv6_prefix(self) -> u8 {
        self.ipv6_prefix
    }
}

impl Default for Peers {
    fn default() -> Self {
        Peers {
            ipv6_prefix: Peers::DEFAULT_IPV6_PREFIX,
        }
    }
}

/// What a connection shares with the slots: whether a request is in
/// progress (only idle connections are taken), whether one came yet, and
/// the signal that it was taken.
#[derive(Debug)]
pub(crate) struct Activity {
    pub(crate) in_flight: watch::Sender<usize>,
    pub(crate) evicted: CancellationToken,
    opened: Instant,
    requested: AtomicBool,
}

impl Activity {
    fn new() -> Arc<Activity> {
        Arc::new(Activity {
            in_flight: watch::Sender::new(0),
            evicted: CancellationToken::new(),
            opened: Instant::now(),
            requested: AtomicBool::new(false),
        })
    }

    /// A request started on the connection: its opening is over.
    pub(crate) fn request_started(&self) {
        self.requested.store(true, Ordering::Relaxed);
    }

    /// Still opening: no request yet, within `window` of its accept.
    fn opening(&self, window: Duration) -> bool {
        !self.requested.load(Ordering::Relaxed) && self.opened.elapsed() < window
    }

    fn busy(&self) -> bool {
        *self.in_flight.borrow() > 0
    }

    /// Open (past its opening) with no request in progress.
    fn idle(&self, window: Duration) -> bool {
        !self.busy() && !self.opening(window)
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
    /// Kept beyond the others, for handshakes and probes: a newcomer takes
    /// the oldest idle connection, or one of a peer holding two more.
    Beyond,
}

#[derive(Debug)]
pub(crate) struct Slots {
    max_total: usize,
    max_per_peer: usize,
    /// A connection's opening: from its accept to its first request, at most
    /// this long.
    opening: Duration,
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

    /// The oldest untrusted connection that `takeable` accepts among the
    /// peers `pick` accepts (by their untrusted count): its peer and id.
    fn oldest(
        &self,
        pick: impl Fn(&IpAddr, usize) -> bool,
        takeable: impl Fn(&Activity) -> bool,
    ) -> Option<(IpAddr, u64)> {
        self.peers
            .iter()
            .filter(|(peer, held)| pick(peer, held.iter().filter(|h| !h.trusted).count()))
            .flat_map(|(peer, held)| {
                held.iter()
                    .filter(|h| !h.trusted && takeable(&h.activity))
                    .map(move |h| (*peer, h.id))
            })
            .min_by_key(|(_, id)| *id)
    }

    /// The most untrusted connections any peer but `peer` holds.
    fn largest_other(&self, peer: &IpAddr) -> usize {
        self.peers
            .keys()
            .filter(|p| *p != peer)
            .map(|p| self.untrusted(p))
            .max()
            .unwrap_or(0)
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
    /// `max_total` slots shared fairly, at most `max_per_peer` untrusted ones
    /// of one peer; a connection is never taken within `opening` of its
    /// accept before its first request.
    pub(crate) fn new(max_total: usize, max_per_peer: usize, opening: Duration) -> Arc<Slots> {
        Slots::shared(max_total, max_per_peer, opening, Sharing::Fair)
    }

    /// `capacity` slots kept beyond the others (handshakes, then probes), at
    /// most `per_peer` of one peer.
    pub(crate) fn beyond(capacity: usize, per_peer: usize, opening: Duration) -> Arc<Slots> {
        Slots::shared(capacity, per_peer, opening, Sharing::Beyond)
    }

    fn shared(
        max_total: usize,
        max_per_peer: usize,
        opening: Duration,
        sharing: Sharing,
    ) -> Arc<Slots> {
        Arc::new(Slots {
            max_total: max_total.max(1),
            max_per_peer: max_per_peer.clamp(1, max_total.max(1)),
            opening,
            sharing,
            state: Mutex::new(State::default()),
        })
    }

    /// A slot for a new connection from `peer` ([`Peers::key`]'s), `trusted`
    /// already (its certificate verified, or a caller from this host on a
    /// listener that trusts it), taking an idle connection of another peer
    /// when every slot is taken and that is fairer.
    pub(crate) fn acquire(self: &Arc<Self>, peer: IpAddr, trusted: bool) -> Result<Slot, Refused> {
        let mut state = self.state.lock();
        match self.sharing {
            Sharing::Fair => self.make_room_fairly(&mut state, peer, trusted)?,
            Sharing::Beyond => self.make_room_beyond(&mut state, peer)?,
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
        let mine = state.untrusted(&peer);
        if !trusted && mine >= self.max_per_peer {
            return Err(Refused::PeerLimit);
        }
        if state.total < self.max_total {
            return Ok(());
        }
        // The largest untrusted holder among the other peers gives way (to
        // a trusted newcomer, whatever it holds), its oldest idle connection.
        let largest = state.largest_other(&peer);
        let floor = if trusted { 1 } else { mine + 2 };
        if largest < floor {
            return Err(Refused::Full);
        }
        let other = |p: &IpAddr| *p != peer;
        let idle = |a: &Activity| a.idle(self.opening);
        let victim = state
            .oldest(|p, untrusted| other(p) && untrusted == largest, idle)
            .or_else(|| {
                // The largest holder has nothing idle: the next largest that
                // still qualifies.
                state.oldest(|p, untrusted| other(p) && untrusted >= floor, idle)
            });
        let Some((holder, id)) = victim else {
            return Err(Refused::Full);
        };
        state.take(holder, id);
        Ok(())
    }

    fn make_room_beyond(&self, state: &mut State, peer: IpAddr) -> Result<(), Refused> {
        let idle = |a: &Activity| a.idle(self.opening);
        let mine = state.untrusted(&peer);
        let victim = if mine >= self.max_per_peer {
            // Its own oldest idle one, or none.
            state
                .oldest(|p, _| *p == peer, idle)
                .ok_or(Refused::PeerLimit)?
        } else if state.total >= self.max_total {
            // The oldest idle one; else, from a peer holding at least two
            // more, its oldest serving no request (opening, for all we know,
            // as many of its own are).
            let largest = state.largest_other(&peer);
            state
                .oldest(|_, _| true, idle)
                .or_else(|| {
                    (largest >= mine + 2)
                        .then(|| {
                            state.oldest(
                                |p, untrusted| *p != peer && untrusted == largest,
                                |a| !a.busy(),
                            )
                        })
                        .flatten()
                })
                .ok_or(Refused::Full)?
        } else {
            return Ok(());
        };
        state.take(victim.0, victim.1);
        Ok(())
    }

    /// Slots held.
    pub(crate) fn held(&self) -> usize {
        self.state.lock().total
    }
}

impl Slot {
    /// The connection turned out trusted (its client certificate verified):
    /// it no longer counts toward its peer's share, and is never taken.
    pub(crate) fn trust(&self) {
        let mut state = self.slots.state.lock();
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
        let mut state = self.slots.state.lock();
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
