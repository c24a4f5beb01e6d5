use super::*;

#[test]
fn without_a_limit_the_fixed_defaults_hold() {
    let sizing = MemorySizing::new(None, Requested::default());
    assert_eq!(sizing.memory_budget, 256 * 1024 * 1024);
    assert_eq!(sizing.max_request_memory, 64 * 1024 * 1024);
    assert_eq!(sizing.engine_memory_limit, 1024 * 1024 * 1024);
    assert_eq!(sizing.max_connections, None);
}

#[test]
fn a_256_mib_container_gets_limits_that_fit_it() {
    let limit = 256 * MIB;
    let sizing = MemorySizing::new(Some(limit), Requested::default());
    assert_eq!(sizing.memory_budget as u64, 96 * MIB);
    assert_eq!(sizing.max_request_memory as u64, 64 * MIB);
    assert_eq!(sizing.engine_memory_limit as u64, 224 * MIB);
    assert_eq!(sizing.max_connections, Some(341));
    // Baseline, budget and the connections' worst case stay under it.
    let connections = sizing.max_connections.unwrap() as u64 * PER_CONNECTION;
    assert!(BASELINE + sizing.memory_budget as u64 + connections < limit);
    assert!((sizing.engine_memory_limit as u64) < limit);
}

#[test]
fn a_small_container_gets_a_smaller_largest_review() {
    let sizing = MemorySizing::new(Some(128 * MIB), Requested::default());
    assert_eq!(sizing.memory_budget as u64, 32 * MIB);
    assert_eq!(sizing.max_request_memory as u64, 24 * MIB);
}

#[test]
fn flags_given_win() {
    let sizing = MemorySizing::new(
        Some(256 * MIB),
        Requested {
            memory_budget: Some(10),
            max_request_memory: Some(5),
            engine_memory_limit: Some(0),
        },
    );
    assert_eq!(
        (
            sizing.memory_budget,
            sizing.max_request_memory,
            sizing.engine_memory_limit
        ),
        (10, 5, 0)
    );
}

#[test]
fn cgroup_files_are_read() {
    assert_eq!(v2_limit("268435456\n"), Some(268435456));
    assert_eq!(v2_limit("max\n"), None);
    let stat = "cache 0\nhierarchical_memory_limit 268435456\nhierarchical_memsw_limit 9223372036854771712\n";
    assert_eq!(v1_limit(stat), Some(268435456));
    assert_eq!(
        v1_limit("hierarchical_memory_limit 9223372036854771712\n"),
        None
    );
}
