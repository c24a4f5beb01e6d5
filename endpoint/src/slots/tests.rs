use super::*;

/// Long enough that no connection of a test leaves its opening on its own.
const OPENING: Duration = Duration::from_secs(3600);

fn ip(last: u8) -> IpAddr {
    IpAddr::from([127, 0, 0, last])
}

#[test]
fn a_peer_holds_at_most_its_share() {
    let slots = Slots::new(10, 3, Duration::ZERO);
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
    let slots = Slots::new(6, 4, Duration::ZERO);
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
    let slots = Slots::new(4, 4, Duration::ZERO);
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
    let slots = Slots::new(2, 2, Duration::ZERO);
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

/// IPv6 addresses of one /64 are one peer by default; IPv4, also written as
/// IPv4-mapped IPv6, is its own address.
#[test]
fn ipv6_peers_are_counted_per_64() {
    let v6 = |s: &str| -> IpAddr { s.parse().unwrap() };
    let peers = Peers::default();
    assert_eq!(peers.key(v6("2001:db8:1:2::1")), v6("2001:db8:1:2::"));
    assert_eq!(
        peers.key(v6("2001:db8:1:2:ffff:1:2:3")),
        peers.key(v6("2001:db8:1:2::9"))
    );
    assert_ne!(
        peers.key(v6("2001:db8:1:3::1")),
        peers.key(v6("2001:db8:1:2::1"))
    );
    assert_eq!(peers.key(v6("::ffff:10.0.0.7")), v6("10.0.0.7"));
    assert_eq!(peers.key(ip(9)), ip(9));
    // Many addresses of one /64 hold one peer's share.
    let slots = Slots::new(40, 3, Duration::ZERO);
    let held: Vec<Slot> = (1..=3)
        .map(|n| {
            let address = v6(&format!("2001:db8:1:2::{n}"));
            slots.acquire(peers.key(address), false).unwrap()
        })
        .collect();
    let more = peers.key(v6("2001:db8:1:2::77"));
    assert_eq!(slots.acquire(more, false).unwrap_err(), Refused::PeerLimit);
    drop(held);
}

/// The IPv6 grouping is configurable (issue 39): counted per address
/// (128), the API server is no peer of the pods sharing its /64; other
/// prefixes group as many bits; IPv4 is untouched; a prefix of 0 or above
/// 128 is refused by name.
#[test]
fn the_ipv6_peer_prefix_is_configurable() {
    let v6 = |s: &str| -> IpAddr { s.parse().unwrap() };
    let apiserver = v6("fd00:10:96::1");
    let pod = v6("fd00:10:96::2a");
    assert_eq!(Peers::default().key(apiserver), Peers::default().key(pod));
    let each = Peers::new(128).unwrap();
    assert_eq!(each.key(apiserver), apiserver);
    assert_ne!(each.key(apiserver), each.key(pod));
    let wide = Peers::new(48).unwrap();
    assert_eq!(wide.key(v6("2001:db8:1:2::1")), v6("2001:db8:1::"));
    assert_eq!(wide.key(v6("2001:db8:1:ffff::1")), v6("2001:db8:1::"));
    assert_eq!(Peers::new(1).unwrap().key(v6("ffff::1")), v6("8000::"));
    assert_eq!(each.key(ip(9)), ip(9));
    assert_eq!(each.key(v6("::ffff:10.0.0.7")), v6("10.0.0.7"));
    for bad in [0, 129] {
        let error = Peers::new(bad).unwrap_err();
        assert!(error.contains("1 to 128"), "{error}");
    }
    // Pods sharing the API server's /64 hold their share; counted per
    // address, the API server's own connections are not refused for it.
    let slots = Slots::new(40, 3, Duration::ZERO);
    let pods: Vec<Slot> = (0..3)
        .map(|_| slots.acquire(each.key(pod), false).unwrap())
        .collect();
    assert!(slots.acquire(each.key(apiserver), false).is_ok());
    drop(pods);
}

/// A verified connection (the API server) counts toward no share: its
/// peer is never refused for its many connections, takes an idle
/// untrusted connection whenever the listener is full (of peers holding
/// one each, too), and an untrusted newcomer never takes a trusted one.
#[test]
fn trusted_connections_keep_to_no_share_and_are_never_taken() {
    let slots = Slots::new(6, 2, Duration::ZERO);
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
    // Trust is the connection's, not its address's: another unverified
    // connection of the API server's address is a newcomer like any other.
    assert_eq!(slots.acquire(ip(1), false).unwrap_err(), Refused::Full);
    // A verified one (its certificate shown beyond the slots) gets in,
    // taking the oldest idle untrusted one.
    let fifth = slots.acquire(ip(1), true).unwrap();
    assert!(others[0].activity.evicted.is_cancelled());
    assert!(!others[1].activity.evicted.is_cancelled());
    // A caller trusted from the start (this host) alike.
    let local = slots.acquire(ip(9), true).unwrap();
    assert!(others[1].activity.evicted.is_cancelled());
    assert_eq!(slots.held(), 6);
    drop((api, others, fifth, local));
    assert_eq!(slots.held(), 0);
}

/// A burst of the API server's connections, each verified (beyond the
/// slots, where it showed its certificate), takes other peers' idle
/// connections, never its own peer's.
#[test]
fn a_burst_of_verified_connections_takes_from_others_not_itself() {
    let slots = Slots::new(40, 10, Duration::ZERO);
    let others: Vec<Slot> = (0..30)
        .map(|n| slots.acquire(IpAddr::from([127, 0, 3, n]), false).unwrap())
        .collect();
    let first = slots.acquire(ip(1), false).unwrap();
    first.trust();
    let burst: Vec<Slot> = (0..29)
        .map(|_| slots.acquire(ip(1), true).unwrap())
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

/// Beyond the slots: a newcomer always gets in while a connection there
/// is idle, taking the oldest (its own peer's first, at its share); busy
/// ones stay.
#[test]
fn beyond_the_slots_every_newcomer_gets_in_while_one_is_idle() {
    let reserve = Slots::beyond(3, 2, Duration::ZERO);
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
    let reserve = Slots::beyond(4, 2, Duration::ZERO);
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

/// A connection just accepted (its TLS handshake, then its first request:
/// a probe's GET) is never taken by newcomers churning through the slots
/// kept beyond the others (issue 39): the kubelet's probe used to be
/// closed before its GET by a few peers reconnecting fast.
#[test]
fn a_connection_in_its_opening_is_never_taken() {
    let beyond = Slots::beyond(8, 2, OPENING);
    let churners: Vec<Slot> = (0..8)
        .map(|n| {
            beyond
                .acquire(IpAddr::from([127, 0, 4, n / 2]), false)
                .unwrap()
        })
        .collect();
    let probe = beyond.acquire(ip(1), false).unwrap();
    let newcomers: Vec<_> = (0..16)
        .map(|n| beyond.acquire(IpAddr::from([127, 0, 5, n]), false))
        .collect();
    assert!(
        !probe.activity.evicted.is_cancelled(),
        "the probe's connection was taken before its request"
    );
    drop((churners, newcomers, probe));
}

/// Beyond the slots, fresh connections of a few peers keep no newcomer
/// out: a peer holding two more than the newcomer's gives way, its oldest
/// connection serving no request; a peer holding as many does not; busy
/// ones stay; once a request came and went, a connection is idle.
#[test]
fn beyond_the_slots_fresh_connections_of_a_few_peers_make_room() {
    let beyond = Slots::beyond(4, 2, OPENING);
    let fresh: Vec<Slot> = (0..4)
        .map(|n| {
            beyond
                .acquire(IpAddr::from([127, 0, 4, n / 2]), false)
                .unwrap()
        })
        .collect();
    fresh[0].activity.in_flight.send_replace(1);
    let probe = beyond.acquire(ip(1), false).unwrap();
    assert!(!fresh[0].activity.evicted.is_cancelled(), "busy");
    assert!(
        fresh[1].activity.evicted.is_cancelled(),
        "the oldest not busy"
    );
    // Peers holding 1 and 2 now, the newcomer's 0: the holder of 2 gives way.
    let second = beyond.acquire(ip(2), false).unwrap();
    assert_eq!(
        fresh
            .iter()
            .filter(|s| s.activity.evicted.is_cancelled())
            .count(),
        2
    );
    // Every peer holds one: fresh connections stay, the newcomer is refused.
    assert_eq!(
        beyond.acquire(ip(3), false).unwrap_err(),
        Refused::Full,
        "nobody holds two more"
    );
    // A connection whose request came and went is idle: taken.
    probe.activity.request_started();
    let third = beyond.acquire(ip(3), false).unwrap();
    assert!(probe.activity.evicted.is_cancelled());
    drop((fresh, probe, second, third));
    assert_eq!(beyond.held(), 0);
}

/// In the shared slots too, a connection is idle only past its opening:
/// a fair newcomer takes no connection still opening, and takes it once a
/// request came and went.
#[test]
fn a_fair_newcomer_takes_no_connection_still_opening() {
    let slots = Slots::new(4, 4, OPENING);
    let held: Vec<Slot> = (0..4)
        .map(|_| slots.acquire(ip(2), false).unwrap())
        .collect();
    assert_eq!(slots.acquire(ip(1), false).unwrap_err(), Refused::Full);
    assert!(held.iter().all(|s| !s.activity.evicted.is_cancelled()));
    // Not even for a verified connection.
    assert_eq!(slots.acquire(ip(3), true).unwrap_err(), Refused::Full);
    held[1].activity.request_started();
    let newcomer = slots.acquire(ip(1), false).unwrap();
    assert!(held[1].activity.evicted.is_cancelled());
    drop((held, newcomer));
    // Past the window, a silent connection is idle.
    let slots = Slots::new(1, 1, Duration::from_millis(20));
    let silent = slots.acquire(ip(2), false).unwrap();
    std::thread::sleep(Duration::from_millis(30));
    let trusted = slots.acquire(ip(1), true).unwrap();
    assert!(silent.activity.evicted.is_cancelled());
    drop((silent, trusted));
}

/// Trust belongs to a connection, never to its address (issue 39): an
/// unverified connection from an address that holds a verified one keeps
/// to its peer's share.
#[test]
fn an_unverified_connection_inherits_no_trust_from_its_address() {
    let slots = Slots::new(40, 3, Duration::ZERO);
    let verified = slots.acquire(ip(1), false).unwrap();
    verified.trust();
    let unverified: Vec<Slot> = (0..3)
        .map(|_| slots.acquire(ip(1), false).unwrap())
        .collect();
    assert_eq!(
        slots.acquire(ip(1), false).unwrap_err(),
        Refused::PeerLimit,
        "a fourth unverified connection of the peer, beside a verified one"
    );
    drop((verified, unverified));
}
