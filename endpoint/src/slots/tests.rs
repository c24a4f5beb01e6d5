use super::*;

fn ip(last: u8) -> IpAddr {
    IpAddr::from([127, 0, 0, last])
}

#[test]
fn a_peer_holds_at_most_its_share() {
    let slots = Slots::new(10, 3);
    let held: Vec<Slot> = (0..3)
        .map(|_| slots.acquire(ip(2), false).unwrap())
        .collect();
    assert_eq!(slots.acquire(ip(2), false).unwrap_err(), Refused::PeerLimit);
    assert!(
        slots.acquire(ip(1), false).is_ok(),
        "another peer still gets a slot"
    );
    drop(held);
    assert_eq!(slots.held(), 0);
    assert!(
        slots.acquire(ip(2), false).is_ok(),
        "slots come back when closed"
    );
}

#[test]
fn a_newcomer_takes_the_oldest_idle_connection_of_the_largest_holder() {
    let slots = Slots::new(6, 4);
    let big: Vec<Slot> = (0..4)
        .map(|_| slots.acquire(ip(2), false).unwrap())
        .collect();
    let small: Vec<Slot> = (0..2)
        .map(|_| slots.acquire(ip(3), false).unwrap())
        .collect();
    // The largest holder's oldest connection is busy: the next is taken.
    big[0].activity.in_flight.send_replace(1);
    let newcomer = slots.acquire(ip(1), false).unwrap();
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
    let a: Vec<Slot> = (0..2)
        .map(|_| slots.acquire(ip(2), false).unwrap())
        .collect();
    let b: Vec<Slot> = (0..2)
        .map(|_| slots.acquire(ip(3), false).unwrap())
        .collect();
    // Holders of two against a newcomer holding none: one is taken.
    let c = slots.acquire(ip(4), false).unwrap();
    assert_eq!(
        a.iter()
            .chain(&b)
            .filter(|s| s.activity.evicted.is_cancelled())
            .count(),
        1
    );
    // Now the largest holds 2 and the newcomer's peer 1: not fairer.
    assert_eq!(slots.acquire(ip(4), false).unwrap_err(), Refused::Full);
    // A holder reconnecting cannot win its slot back.
    let holder = if a.iter().any(|s| s.activity.evicted.is_cancelled()) {
        ip(2)
    } else {
        ip(3)
    };
    assert_eq!(slots.acquire(holder, false).unwrap_err(), Refused::Full);
    drop((a, b, c));
    assert_eq!(slots.held(), 0);
}

#[test]
fn busy_connections_are_never_taken() {
    let slots = Slots::new(2, 2);
    let held: Vec<Slot> = (0..2)
        .map(|_| slots.acquire(ip(2), false).unwrap())
        .collect();
    for slot in &held {
        slot.activity.in_flight.send_replace(1);
    }
    assert_eq!(slots.acquire(ip(1), false).unwrap_err(), Refused::Full);
    held[1].activity.in_flight.send_replace(0);
    assert!(slots.acquire(ip(1), false).is_ok());
    assert!(held[1].activity.evicted.is_cancelled());
}

/// IPv6 addresses of one /64 are one peer; IPv4, also written as
/// IPv4-mapped IPv6, is its own address.
#[test]
fn ipv6_peers_are_counted_per_64() {
    let v6 = |s: &str| -> IpAddr { s.parse().unwrap() };
    assert_eq!(peer_key(v6("2001:db8:1:2::1")), v6("2001:db8:1:2::"));
    assert_eq!(
        peer_key(v6("2001:db8:1:2:ffff:1:2:3")),
        peer_key(v6("2001:db8:1:2::9"))
    );
    assert_ne!(
        peer_key(v6("2001:db8:1:3::1")),
        peer_key(v6("2001:db8:1:2::1"))
    );
    assert_eq!(peer_key(v6("::ffff:10.0.0.7")), v6("10.0.0.7"));
    assert_eq!(peer_key(ip(9)), ip(9));
    // Many addresses of one /64 hold one peer's share.
    let slots = Slots::new(40, 3);
    let held: Vec<Slot> = (1..=3)
        .map(|n| {
            let address = v6(&format!("2001:db8:1:2::{n}"));
            slots.acquire(peer_key(address), false).unwrap()
        })
        .collect();
    let more = peer_key(v6("2001:db8:1:2::77"));
    assert_eq!(slots.acquire(more, false).unwrap_err(), Refused::PeerLimit);
    drop(held);
}

/// A verified connection (the API server) counts toward no share: its
/// peer is never refused for its many connections, takes an idle
/// untrusted connection whenever the listener is full (of peers holding
/// one each, too), and an untrusted newcomer never takes a trusted one.
#[test]
fn trusted_connections_keep_to_no_share_and_are_never_taken() {
    let slots = Slots::new(6, 2);
    let api: Vec<Slot> = (0..4)
        .map(|_| {
            let slot = slots.acquire(ip(1), false).unwrap();
            slot.trust();
            slot
        })
        .collect();
    // Two other peers, one idle connection each: full.
    let others: Vec<Slot> = [2, 3]
        .into_iter()
        .map(|n| slots.acquire(ip(n), false).unwrap())
        .collect();
    // An untrusted newcomer holds 0, the others 1: refused; the trusted
    // connections are never its victims.
    assert_eq!(slots.acquire(ip(4), false).unwrap_err(), Refused::Full);
    assert!(api.iter().all(|s| !s.activity.evicted.is_cancelled()));
    // The API server's peer gets in, taking the oldest idle untrusted one.
    let fifth = slots.acquire(ip(1), false).unwrap();
    assert!(others[0].activity.evicted.is_cancelled());
    assert!(!others[1].activity.evicted.is_cancelled());
    // A caller trusted from the start (this host) alike.
    let local = slots.acquire(ip(9), true).unwrap();
    assert!(others[1].activity.evicted.is_cancelled());
    assert_eq!(slots.held(), 6);
    drop((api, others, fifth, local));
    assert_eq!(slots.held(), 0);
}

/// A trusted peer's newcomers, before their own handshakes are done
/// (untrusted yet), take other peers' idle connections, never their own
/// peer's.
#[test]
fn a_trusted_peers_burst_takes_from_others_not_itself() {
    let slots = Slots::new(40, 10);
    let others: Vec<Slot> = (0..30)
        .map(|n| slots.acquire(IpAddr::from([127, 0, 3, n]), false).unwrap())
        .collect();
    let first = slots.acquire(ip(1), false).unwrap();
    first.trust();
    let burst: Vec<Slot> = (0..29)
        .map(|_| slots.acquire(ip(1), false).unwrap())
        .collect();
    assert!(burst.iter().all(|s| !s.activity.evicted.is_cancelled()));
    let taken = others
        .iter()
        .filter(|s| s.activity.evicted.is_cancelled())
        .count();
    assert_eq!(taken, 20);
    assert_eq!(slots.held(), 40);
    drop((others, first, burst));
}

/// The probe reserve: a newcomer always gets in while a connection there
/// is idle, taking the oldest (its own peer's first, at its share); busy
/// ones stay.
#[test]
fn the_probe_reserve_lets_every_newcomer_in_while_one_is_idle() {
    let reserve = Slots::reserve(3, 2);
    let idle: Vec<Slot> = [2, 3, 4]
        .into_iter()
        .map(|n| reserve.acquire(ip(n), false).unwrap())
        .collect();
    let probe = reserve.acquire(ip(1), false).unwrap();
    assert!(idle[0].activity.evicted.is_cancelled(), "the oldest");
    probe.activity.in_flight.send_replace(1);
    // Everything else busy: refused.
    for slot in &idle[1..] {
        slot.activity.in_flight.send_replace(1);
    }
    assert_eq!(reserve.acquire(ip(5), false).unwrap_err(), Refused::Full);
    drop((idle, probe));
    assert_eq!(reserve.held(), 0);
    // A peer at its share takes its own oldest, not an older one of
    // another peer.
    let reserve = Slots::reserve(4, 2);
    let other = reserve.acquire(ip(2), false).unwrap();
    let own: Vec<Slot> = (0..2)
        .map(|_| reserve.acquire(ip(3), false).unwrap())
        .collect();
    let again = reserve.acquire(ip(3), false).unwrap();
    assert!(own[0].activity.evicted.is_cancelled());
    assert!(!other.activity.evicted.is_cancelled());
    drop((other, own, again));
    assert_eq!(reserve.held(), 0);
}
