//! One node's read-only view of a lock (the inspect script, `INSPECT_BODY` in `scripts`),
//! shared by the single-node locker and Redlock.

use std::time::Duration;

use dlock_core::backend::Counters;
use dlock_core::{Error, FencingToken};
use redis::Value;

use crate::conn::Node;
use crate::keys::Keys;
use crate::scripts::scripts;

/// What one node holds for one name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeView {
    /// The holder's owner value; `None` when the lock is free or only reserved for the queue's
    /// head (a reservation is not a grant).
    pub(crate) holder: Option<Vec<u8>>,
    /// The lock key's remaining TTL; `None` when the key has no expiry.
    pub(crate) pttl: Option<Duration>,
    /// The fence counter; `None` when the key is absent or does not hold a positive integer.
    pub(crate) fence: Option<FencingToken>,
    /// Live queue entries (0 unless asked to count).
    pub(crate) waiting: usize,
}

/// Reads `keys` on `node` with the inspect script (one round trip, no writes) within `budget`;
/// `count_queue` walks the fair queue's live entries.
pub(crate) async fn read(
    node: &Node,
    keys: &Keys,
    count_queue: bool,
    budget: Duration,
    counters: &Counters,
) -> Result<NodeView, Error> {
    let mut inv = scripts().inspect.prepare_invoke();
    inv.key(&keys.lock)
        .key(&keys.fence)
        .key(&keys.queue)
        .key(&keys.deadlines)
        .arg(if count_queue { "1" } else { "0" });
    let reply: Value = node.invoke("inspect", &inv, budget, counters).await?;
    parse(&reply).ok_or_else(|| {
        Error::backend(
            format!(
                "unexpected reply to inspect from {}: {reply:?}",
                node.display
            ),
            None,
        )
    })
}

/// The script's reply `{holder or nil, pttl, fence or nil, waiting}`; `None` for any other
/// shape. A fence that is not a positive integer reads as no token, not as an error: the
/// holder is still worth showing.
fn parse(reply: &Value) -> Option<NodeView> {
    let Value::Array(parts) = reply else {
        return None;
    };
    let [holder, pttl, fence, waiting] = parts.as_slice() else {
        return None;
    };
    let bytes = |v: &Value| match v {
        Value::BulkString(b) => Some(Some(b.clone())),
        Value::Nil => Some(None),
        _ => None,
    };
    let int = |v: &Value| match v {
        Value::Int(i) => Some(*i),
        _ => None,
    };
    let holder = bytes(holder)?;
    let pttl = int(pttl)?;
    let fence = bytes(fence)?
        .and_then(|f| String::from_utf8(f).ok())
        .and_then(|f| f.parse::<u64>().ok())
        .filter(|t| *t > 0)
        .map(FencingToken);
    Some(NodeView {
        // PTTL: -1 no expiry (a key set by another client without PX), -2 no key.
        pttl: u64::try_from(pttl).ok().map(Duration::from_millis),
        holder,
        fence,
        waiting: usize::try_from(int(waiting)?).ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn a_held_lock_with_waiters() {
        let reply = Value::Array(vec![
            bulk("owner"),
            Value::Int(1500),
            bulk("17"),
            Value::Int(2),
        ]);
        assert_eq!(
            parse(&reply),
            Some(NodeView {
                holder: Some(b"owner".to_vec()),
                pttl: Some(Duration::from_millis(1500)),
                fence: Some(FencingToken(17)),
                waiting: 2,
            })
        );
    }

    #[test]
    fn bad_data_is_no_token_or_no_view_never_a_panic() {
        let garbage_fence = Value::Array(vec![
            bulk("owner"),
            Value::Int(-1),
            bulk("1e9x"),
            Value::Int(0),
        ]);
        let view = parse(&garbage_fence).expect("a view");
        assert_eq!((view.fence, view.pttl), (None, None));
        assert_eq!(parse(&Value::Int(3)), None);
        assert_eq!(parse(&Value::Array(vec![Value::Nil])), None);
        let negative = Value::Array(vec![Value::Nil, Value::Int(-2), Value::Nil, Value::Int(-1)]);
        assert_eq!(parse(&negative), None);
    }
}
