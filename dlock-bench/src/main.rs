//! `dlock-bench`: dlock vs the raw server floor vs peer libraries, in one run (in progress).

fn main() {}
