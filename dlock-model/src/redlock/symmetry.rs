//! Symmetry reduction of the Redlock model: the nodes other than node 0 are interchangeable
//! (the same scripts, no clock movement, no restart; node 0 is the one those faults hit, which
//! names the faulty node without losing generality), and every property is blind to node
//! indexes. So two states that differ only by a permutation of nodes `1..N` are explored as
//! one: after each step the model renames those nodes into a canonical order — sorted by
//! everything that tells a node apart (its key, counter, clock, downtime; each client's reply
//! or raise bit for it; the messages in flight to it) — renaming them alike in the messages,
//! the replies and the raise masks. Nodes that compare equal are identical, so the order is a
//! true representative of the state's class: no behaviour of the unreduced model is lost, and
//! none is added.
//!
//! A fan-out reaches the nodes in index order (the partial-order reduction of the module docs:
//! any fixed order shared by every fan-out in flight is as good as another). So the renaming
//! happens only when no fan-out is part-way: every fan-out then in flight is either not
//! started (it follows the new order, as every later one will) or down to its last node.
//!
//! A counterexample's steps name nodes as the canonical state before each step does: a node's
//! index may change from one step to the next.

use super::{Client, MAX_NODES, Msg, Node, State};

/// What a client records about node `k`: its acquire reply, or its raise bits.
fn client_view(c: &Client, k: usize) -> (u8, u8) {
    match *c {
        Client::Acquiring { replies, .. } => (1, replies[k]),
        Client::Raising {
            at_token, pending, ..
        } => (2, (at_token >> k & 1) | (pending >> k & 1) << 1),
        _ => (0, 0),
    }
}

/// Everything that tells node `k` apart, its index left out (a fan-out not started names
/// every node alike).
fn signature(s: &State, k: usize) -> (Node, [(u8, u8); 2], Vec<Msg>) {
    let msgs = s
        .net
        .iter()
        .filter(|m| m.node as usize == k)
        .map(|m| Msg {
            node: 0,
            last: 0,
            ..*m
        })
        .collect();
    (
        s.nodes[k],
        [client_view(&s.clients[0], k), client_view(&s.clients[1], k)],
        msgs,
    )
}

/// Moves bit `old[j]` of `mask` to bit `j`.
fn permute_mask(mask: u8, old: &[usize; MAX_NODES]) -> u8 {
    (0..MAX_NODES).fold(0, |acc, j| acc | (mask >> old[j] & 1) << j)
}

/// The representative of `s`'s class: nodes `1..nodes` in canonical order.
pub(super) fn canonical(nodes: usize, mut s: State) -> State {
    if s.net.iter().any(|m| 0 < m.node && m.node < m.last) {
        // A fan-out is part-way through the nodes in index order: renaming now would break
        // that order (see the module docs).
        return s;
    }
    let mut order: Vec<usize> = (1..nodes).collect();
    let sigs: Vec<_> = (0..nodes).map(|k| signature(&s, k)).collect();
    order.sort_by(|a, b| sigs[*a].cmp(&sigs[*b]));
    if order.iter().enumerate().all(|(j, k)| *k == j + 1) {
        return s;
    }
    // `old[j]`: the node that becomes node `j`; `new[k]`: where node `k` goes.
    let mut old = [0usize; MAX_NODES];
    let mut new = [0usize; MAX_NODES];
    for j in 0..MAX_NODES {
        old[j] = j;
        new[j] = j;
    }
    for (j, &k) in order.iter().enumerate() {
        old[j + 1] = k;
        new[k] = j + 1;
    }
    let before = s.nodes;
    for j in 0..nodes {
        s.nodes[j] = before[old[j]];
    }
    for c in &mut s.clients {
        match c {
            Client::Acquiring { replies, .. } => {
                let before = *replies;
                for j in 0..nodes {
                    replies[j] = before[old[j]];
                }
            }
            Client::Raising {
                at_token, pending, ..
            } => {
                *at_token = permute_mask(*at_token, &old);
                *pending = permute_mask(*pending, &old);
            }
            _ => {}
        }
    }
    s.net = s
        .net
        .iter()
        .map(|m| {
            if m.node < m.last {
                // A fan-out not started: it will visit the renamed nodes in their new order.
                *m
            } else {
                let k = new[m.node as usize] as u8;
                Msg {
                    node: k,
                    last: k,
                    ..*m
                }
            }
        })
        .collect();
    s
}

#[cfg(test)]
mod tests {
    use stateright::Model;

    use super::super::{Body, Fencing, RedlockModel};
    use super::*;

    fn model() -> RedlockModel {
        RedlockModel {
            nodes: 5,
            ttl: 4,
            drift: 1,
            max_skew: 1,
            jump: 0,
            max_delay: 0,
            horizon: 1,
            attempts: 1,
            faults_budget: 0,
            faults: true,
            pauses: true,
            restart_down: None,
            crash: false,
            fencing: Fencing::Today,
        }
    }

    /// Node `k` holds client 0's key and a raise to it is in flight.
    fn held_at(k: usize) -> State {
        let mut s = model().init_states().remove(0);
        s.nodes[k].key = Some((1, 4));
        s.nodes[k].counter = 1;
        s.net.send(Msg {
            sent: 0,
            client: 0,
            node: k as u8,
            last: k as u8,
            body: Body::BackgroundRaise { token: 1 },
        });
        s
    }

    #[test]
    fn renamed_states_share_one_representative() {
        let a = canonical(5, held_at(2));
        let b = canonical(5, held_at(4));
        assert_eq!(a, b);
        assert_eq!(canonical(5, a.clone()), a);
        // Node 0 is the faulty one: it is never renamed.
        assert_ne!(canonical(5, held_at(0)), a);
        // The key and the message to its node move together.
        let k = a.net.iter().next().map(|m| m.node as usize);
        assert_eq!(k.map(|k| a.nodes[k].counter), Some(1));
    }

    #[test]
    fn no_renaming_while_a_fan_out_is_part_way() {
        let mut s = held_at(4);
        s.net.send(Msg {
            sent: 0,
            client: 1,
            node: 2,
            last: 4,
            body: Body::Release { owner: 0x11 },
        });
        assert_eq!(canonical(5, s.clone()), s);
    }
}
