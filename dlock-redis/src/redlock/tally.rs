//! Counting the nodes' answers to one Redlock renewal round, so that the round ends as soon as
//! every lease is settled instead of waiting for the slowest (or a dead) node.

/// What one round says about one lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// A majority of nodes extended it.
    Extended,
    /// A majority of nodes answered that they no longer hold it (with how many still do).
    Gone(usize),
    /// Neither (nodes failed or did not answer); with how many nodes extended it.
    Open(usize),
}

/// The answers of one round so far.
#[derive(Debug)]
pub(crate) struct Tally {
    nodes: usize,
    quorum: usize,
    /// Nodes that answered (whatever they answered).
    answered: usize,
    /// Nodes whose request failed.
    failed: usize,
    /// Per lease: how many nodes extended it.
    extended: Vec<usize>,
}

impl Tally {
    pub(crate) fn new(nodes: usize, quorum: usize, leases: usize) -> Self {
        Self {
            nodes,
            quorum,
            answered: 0,
            failed: 0,
            extended: vec![0; leases],
        }
    }

    /// One node answered: `1` extended a lease, anything else means it does not hold it.
    pub(crate) fn answered(&mut self, replies: &[i64]) {
        self.answered += 1;
        for (count, reply) in self.extended.iter_mut().zip(replies) {
            if *reply == 1 {
                *count += 1;
            }
        }
    }

    /// One node's request failed.
    pub(crate) fn failed(&mut self) {
        self.failed += 1;
    }

    fn outstanding(&self) -> usize {
        self.nodes.saturating_sub(self.answered + self.failed)
    }

    fn verdict(&self, extended: usize) -> Option<Verdict> {
        let refused = self.answered.saturating_sub(extended);
        if extended >= self.quorum {
            Some(Verdict::Extended)
        } else if refused + self.quorum > self.nodes {
            // A majority no longer holds it: no later answer can save it.
            Some(Verdict::Gone(extended))
        } else if extended + self.outstanding() < self.quorum {
            // Too many nodes failed for this round to extend it.
            Some(Verdict::Open(extended))
        } else {
            None
        }
    }

    /// Whether no answer still to come can change any lease's verdict.
    pub(crate) fn settled(&self) -> bool {
        self.extended.iter().all(|c| self.verdict(*c).is_some())
    }

    /// Every lease's verdict; a lease still waiting for answers is `Open`.
    pub(crate) fn verdicts(&self) -> impl Iterator<Item = Verdict> + '_ {
        self.extended
            .iter()
            .map(|c| self.verdict(*c).unwrap_or(Verdict::Open(*c)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_majority_settles_without_waiting_for_the_rest() {
        let mut t = Tally::new(5, 3, 2);
        t.answered(&[1, 1]);
        t.answered(&[1, 1]);
        assert!(!t.settled());
        t.answered(&[1, 1]);
        assert!(t.settled());
        assert_eq!(
            t.verdicts().collect::<Vec<_>>(),
            [Verdict::Extended, Verdict::Extended]
        );
    }

    #[test]
    fn dead_nodes_do_not_hold_up_the_live_majority() {
        let mut t = Tally::new(5, 3, 1);
        t.failed();
        t.failed();
        t.answered(&[1]);
        t.answered(&[1]);
        assert!(!t.settled());
        t.answered(&[1]);
        assert!(t.settled());
        assert_eq!(t.verdicts().collect::<Vec<_>>(), [Verdict::Extended]);
    }

    #[test]
    fn a_lease_a_majority_dropped_is_gone_and_one_that_cannot_win_is_open() {
        let mut t = Tally::new(5, 3, 2);
        t.answered(&[0, 1]);
        t.answered(&[0, 1]);
        t.answered(&[0, 0]);
        assert!(!t.settled(), "the second lease may still reach a majority");
        t.failed();
        t.failed();
        assert!(t.settled());
        assert_eq!(
            t.verdicts().collect::<Vec<_>>(),
            [Verdict::Gone(0), Verdict::Open(2)]
        );
    }

    #[test]
    fn too_many_failures_settle_the_round_as_open_at_once() {
        let mut t = Tally::new(5, 3, 1);
        t.failed();
        t.failed();
        assert!(!t.settled());
        t.failed();
        assert!(t.settled());
        assert_eq!(t.verdicts().collect::<Vec<_>>(), [Verdict::Open(0)]);
    }

    #[test]
    fn a_round_cut_short_leaves_undecided_leases_open() {
        let mut t = Tally::new(3, 2, 1);
        t.answered(&[1]);
        assert!(!t.settled());
        assert_eq!(t.verdicts().collect::<Vec<_>>(), [Verdict::Open(1)]);
    }
}
