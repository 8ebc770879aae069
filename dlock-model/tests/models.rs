//! Every model at the quick bound: the code as it is holds every property, and every negative
//! control produces its counterexample (the checker can fail).

use dlock_model::{Bound, cases};

fn judge(model: &str) {
    let cases: Vec<_> = cases().into_iter().filter(|c| c.model == model).collect();
    assert!(
        cases.iter().any(|c| c.variant.starts_with("today")),
        "{model}: no case models the code as it is"
    );
    assert!(
        cases.iter().any(|c| !c.variant.starts_with("today")),
        "{model}: no negative control"
    );
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|c| c.judge(&(c.run)(Bound::Quick)).err())
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn lease() {
    judge("lease");
}

#[test]
fn redis() {
    judge("redis");
}

#[test]
fn redlock() {
    judge("redlock");
}

#[test]
fn etcd() {
    judge("etcd");
}

#[test]
fn zk() {
    judge("zk");
}
