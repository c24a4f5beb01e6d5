use super::*;

fn weights(pairs: &[(&str, i64)]) -> BTreeMap<String, ClusterPreference> {
    pairs
        .iter()
        .map(|(name, weight)| {
            (
                name.to_string(),
                ClusterPreference {
                    weight: *weight,
                    ..ClusterPreference::default()
                },
            )
        })
        .collect()
}

fn owned(pairs: &[(&str, i32)]) -> Vec<(String, i32)> {
    pairs.iter().map(|(n, r)| (n.to_string(), *r)).collect()
}

/// A UID whose hash is even (names ascending on ties) and one whose hash
/// is odd (descending).
fn uid_with_parity(odd: bool) -> String {
    (0..)
        .map(|i| format!("uid-{i}"))
        .find(|uid| names_descending(uid) == odd)
        .unwrap()
}

#[test]
fn karmadas_documented_examples() {
    // pkg/scheduler/core/assignment.go: 9 over 1:2 is 3:6, 9 over 1:3 is 2:7.
    let one_two = weights(&[("a", 1), ("b", 2)]);
    assert_eq!(
        divide(9, &one_two, "").unwrap(),
        owned(&[("a", 3), ("b", 6)])
    );
    let one_three = weights(&[("a", 1), ("b", 3)]);
    assert_eq!(
        divide(9, &one_three, "").unwrap(),
        owned(&[("a", 2), ("b", 7)])
    );
}

#[test]
fn even_weights_split_evenly_and_the_remainder_follows_the_uid() {
    let even = weights(&[("member-eu-1", 1), ("member-eu-2", 1)]);
    assert_eq!(
        divide(6, &even, "x").unwrap(),
        owned(&[("member-eu-1", 3), ("member-eu-2", 3)])
    );
    let ascending = uid_with_parity(false);
    let descending = uid_with_parity(true);
    assert_eq!(
        divide(9, &even, &ascending).unwrap(),
        owned(&[("member-eu-1", 5), ("member-eu-2", 4)])
    );
    assert_eq!(
        divide(9, &even, &descending).unwrap(),
        owned(&[("member-eu-1", 4), ("member-eu-2", 5)])
    );
}

#[test]
fn fnv1a_matches_the_reference_values() {
    // FNV-1a 32 of "" is 0x811c9dc5 (odd, but an empty UID is ascending
    // by Karmada's rule); of "a" 0xe40c292c (even); of "b" 0xe70c2de5 (odd).
    assert!(!names_descending(""));
    assert!(!names_descending("a"));
    assert!(names_descending("b"));
}

#[test]
fn fewer_replicas_than_clusters_drops_the_empty_ones() {
    let three = weights(&[("a", 1), ("b", 1), ("c", 1)]);
    let result = divide(2, &three, &uid_with_parity(false)).unwrap();
    assert_eq!(result, owned(&[("a", 1), ("b", 1)]));
    assert_eq!(divide(0, &three, "").unwrap(), vec![]);
}

#[test]
fn no_weights_at_all_counts_every_cluster_once() {
    let none = weights(&[("a", 0), ("b", 0)]);
    assert_eq!(divide(4, &none, "").unwrap(), owned(&[("a", 2), ("b", 2)]));
    // A weightless cluster beside weighted ones gets nothing.
    let some = weights(&[("a", 0), ("b", 1)]);
    assert_eq!(divide(4, &some, "").unwrap(), owned(&[("b", 4)]));
}

#[test]
fn minimums_come_first_and_maximums_cap() {
    let mut prefs = weights(&[("a", 1), ("b", 1)]);
    prefs.get_mut("a").unwrap().min_replicas = 4;
    assert_eq!(divide(6, &prefs, "").unwrap(), owned(&[("a", 4), ("b", 2)]));
    prefs.get_mut("a").unwrap().min_replicas = 0;
    prefs.get_mut("b").unwrap().max_replicas = Some(1);
    assert_eq!(divide(6, &prefs, "").unwrap(), owned(&[("a", 5), ("b", 1)]));
    // A weightless cluster still gets its minimum.
    let mut floor = weights(&[("a", 0), ("b", 1)]);
    floor.get_mut("a").unwrap().min_replicas = 1;
    assert_eq!(divide(3, &floor, "").unwrap(), owned(&[("a", 1), ("b", 2)]));
}

#[test]
fn impossible_preferences_are_named_errors() {
    let mut prefs = weights(&[("a", 1), ("b", 1)]);
    prefs.get_mut("a").unwrap().min_replicas = 5;
    prefs.get_mut("b").unwrap().min_replicas = 5;
    assert_eq!(
        divide(6, &prefs, ""),
        Err(DivisionError::MinimumsExceedReplicas {
            min: 10,
            replicas: 6
        })
    );
    let mut capped = weights(&[("a", 1), ("b", 1)]);
    capped.get_mut("a").unwrap().max_replicas = Some(1);
    capped.get_mut("b").unwrap().max_replicas = Some(2);
    assert_eq!(
        divide(6, &capped, ""),
        Err(DivisionError::MaximumsTooLow {
            placed: 3,
            replicas: 6
        })
    );
    let mut inverted = weights(&[("a", 1)]);
    inverted.get_mut("a").unwrap().min_replicas = 3;
    inverted.get_mut("a").unwrap().max_replicas = Some(2);
    assert!(matches!(
        divide(6, &inverted, ""),
        Err(DivisionError::MinAboveMax { .. })
    ));
    assert!(matches!(
        divide(6, &weights(&[("a", -1)]), ""),
        Err(DivisionError::Negative { .. })
    ));
}

/// The exact comparison agrees with Karmada's float one on large
/// weights (a least-loaded policy weights by millicores).
#[test]
fn large_weights_divide_proportionally() {
    let prefs = weights(&[("a", 62_000), ("b", 31_000), ("c", 7_000)]);
    let result = divide(100, &prefs, "").unwrap();
    assert_eq!(result, owned(&[("a", 62), ("b", 31), ("c", 7)]));
}
