//! The network the models share: the messages in flight as a multiset kept sorted, so two
//! states holding the same messages are one state whatever order they were sent in; each
//! distinct message offered once to the scheduler (delivering either of two equal copies is
//! the same step); the rule that time waits for an overdue message. What a model does with a
//! delivered, lost or duplicated message stays in the model.

/// A message that knows the time it was sent (global time units).
pub trait Sent {
    /// When it was sent.
    fn sent(&self) -> u8;
}

/// The messages in flight, sorted (a multiset).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Net<M>(Vec<M>);

impl<M> Default for Net<M> {
    fn default() -> Self {
        Net(Vec::new())
    }
}

impl<M: Ord> Net<M> {
    /// Puts a message in flight.
    pub fn send(&mut self, m: M) {
        let at = self.0.partition_point(|x| *x <= m);
        self.0.insert(at, m);
    }

    /// Takes one copy of `m` out of flight (delivered or lost); `None` when none is in flight.
    pub fn take(&mut self, m: &M) -> Option<()> {
        let at = self.0.iter().position(|x| x == m)?;
        self.0.remove(at);
        Some(())
    }

    /// Every message in flight, copies included, in order.
    pub fn iter(&self) -> std::slice::Iter<'_, M> {
        self.0.iter()
    }

    /// Each distinct message once: what the scheduler may deliver, lose or duplicate next.
    pub fn distinct(&self) -> impl Iterator<Item = &M> {
        self.0
            .iter()
            .enumerate()
            .filter(|(i, m)| *i == 0 || self.0[i - 1] != **m)
            .map(|(_, m)| m)
    }

    /// Whether nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<M: Ord> FromIterator<M> for Net<M> {
    fn from_iter<I: IntoIterator<Item = M>>(iter: I) -> Self {
        let mut v: Vec<M> = iter.into_iter().collect();
        v.sort();
        Net(v)
    }
}

impl<M: Sent> Net<M> {
    /// Whether a message has waited `max_delay` units: time may not pass until it is
    /// delivered or lost.
    pub fn overdue(&self, now: u8, max_delay: u8) -> bool {
        self.0.iter().any(|m| now >= m.sent() + max_delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Sent for (u8, char) {
        fn sent(&self) -> u8 {
            self.0
        }
    }

    #[test]
    fn a_multiset_whatever_the_send_order() {
        let mut a = Net::default();
        let mut b = Net::default();
        for m in [(1, 'x'), (0, 'y'), (1, 'x')] {
            a.send(m);
        }
        for m in [(1, 'x'), (1, 'x'), (0, 'y')] {
            b.send(m);
        }
        assert_eq!(a, b);
        assert_eq!(a.distinct().count(), 2);
        assert_eq!(a.iter().count(), 3);
        assert_eq!(a.take(&(1, 'x')), Some(()));
        assert_eq!(a.iter().count(), 2);
        assert_eq!(a.take(&(2, 'z')), None);
        assert!(a.overdue(1, 1));
        assert!(!a.overdue(0, 1));
    }
}
