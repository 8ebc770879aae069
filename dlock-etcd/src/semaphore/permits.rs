//! The semaphore's requests. A permit key carries its permit count in decimal; the count of
//! the earliest live key of the semaphore (lowest create revision) is the semaphore's, and a
//! key with another count is refused when it enqueues or re-reads.

use dlock_core::Error;
use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse,
};
use tokio::time::Instant;

use crate::conn::{Etcd, get_count, get_kvs, header_revision};
use crate::enqueue::{Behind, Enqueue, Enqueued};
use crate::error;

/// What a read of a semaphore's queue found.
#[derive(Debug)]
pub(crate) enum PermitCheck {
    /// Our key is gone (lease expired or the key was deleted).
    KeyGone,
    /// `ahead` keys were created before ours; the reads were made at `header_rev`.
    Ahead { ahead: u64, header_rev: i64 },
    /// The earliest key records another permit count.
    Refused(String),
}

/// The value a permit key carries: its permit count in decimal ASCII.
pub(crate) fn count_value(permits: u32) -> Vec<u8> {
    permits.to_string().into_bytes()
}

/// The earliest key of a range, with its value.
fn earliest() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
}

/// Why `permits` is refused, given the earliest key of `range`; `None` when they agree (or
/// the range is empty).
fn disagreement(range: &str, earliest: Option<&KeyValue>, permits: u32) -> Option<String> {
    let kv = earliest?;
    let found = std::str::from_utf8(kv.value())
        .ok()
        .and_then(|s| s.parse::<u32>().ok());
    match found {
        Some(f) if f == permits => None,
        Some(f) => Some(format!(
            "{permits} differs from the {f} permits the semaphore {range} is held or awaited with"
        )),
        None => Some(format!(
            "the earliest key of {range} ({}) records no permit count",
            String::from_utf8_lossy(kv.key())
        )),
    }
}

/// Follows a permit enqueue's nested transactions (each failed guard's only result is the next
/// one) to the innermost results: whether it created our key, and its results.
fn innermost(ops: &[TxnOpResponse]) -> Option<(bool, Vec<TxnOpResponse>)> {
    let Some(TxnOpResponse::Txn(inner)) = ops.first() else {
        return None;
    };
    let ops = inner.op_responses();
    if inner.succeeded() {
        return Some((true, ops));
    }
    match ops.first() {
        Some(TxnOpResponse::Txn(_)) => innermost(&ops),
        _ => Some((false, ops)),
    }
}

/// What a semaphore waits behind, given how many keys are ahead.
fn behind(ahead: u64, permits: u32) -> Option<Behind> {
    (ahead >= u64::from(permits)).then_some(Behind::Permits(ahead))
}

impl Etcd {
    /// One transaction: create our permit key (carrying `value`, the count) under the
    /// session lease unless it exists, count the semaphore's keys and read its earliest one.
    /// Our key is the newest, so every other key counted is ahead of it.
    ///
    /// A key with a count the semaphore refuses is never created, so nobody ever sees it (it
    /// could otherwise become the earliest key before its owner deleted it, refusing correct
    /// counts and admitting more of its own): the put is guarded, in the same transaction, by
    /// "every key of the semaphore records our count, or there is none". When that guard fails
    /// but the earliest key agrees (another key disagrees: one left by a client that does not
    /// guard its put), a second transaction creates our key guarded by that earliest key's
    /// create revision and count; if the earliest key changed meanwhile, the first is tried
    /// again.
    ///
    /// # Errors
    /// As [`Etcd::enqueue`]; a count that differs from the earliest key's is
    /// [`Enqueue::Refused`], not an error (when our key existed already, the caller deletes it
    /// first). [`Error::Unavailable`] when the earliest key kept changing.
    pub(crate) async fn enqueue_permits(
        &self,
        range: &str,
        key: &str,
        lease: i64,
        deadline: Option<Instant>,
        value: &[u8],
        permits: u32,
    ) -> Result<Enqueue, Error> {
        const WHAT: &str = "permit enqueue transaction";
        /// How many times the earliest key may change under our guarded create.
        const TRIES: usize = 8;
        let reads = || {
            [
                // Without filters, etcd's count is exact (with them it is not filtered).
                TxnOp::get(
                    range,
                    Some(GetOptions::new().with_prefix().with_count_only()),
                ),
                TxnOp::get(range, Some(earliest())),
            ]
        };
        // Put, count, earliest when `when` holds; otherwise `otherwise`.
        let create_if = |when: Vec<Compare>, otherwise: Vec<TxnOp>| {
            let mut ops = vec![TxnOp::put(
                key,
                value,
                Some(PutOptions::new().with_lease(lease)),
            )];
            ops.extend(reads());
            Txn::new().when(when).and_then(ops).or_else(otherwise)
        };
        // Our key unless it exists (a retried request of ours): then read it.
        let unless_ours = |inner: Txn| {
            Txn::new()
                .when([Compare::create_revision(key, CompareOp::Equal, 0)])
                .and_then([TxnOp::txn(inner)])
                .or_else([TxnOp::get(key, None)])
        };
        let none = create_if(
            vec![Compare::version(range, CompareOp::Equal, 0).with_prefix()],
            reads().to_vec(),
        );
        let all_agree = create_if(
            vec![Compare::value(range, CompareOp::Equal, value).with_prefix()],
            vec![TxnOp::txn(none)],
        );
        let mut txn = unless_ours(all_agree);
        for _ in 0..TRIES {
            let Some(resp) = self.txn_on_lease(WHAT, txn, deadline).await? else {
                return Ok(Enqueue::SessionGone);
            };
            let header_rev =
                header_revision(&resp).ok_or_else(|| error::unexpected(WHAT, "no header"))?;
            let outer = resp.op_responses();
            if !resp.succeeded() {
                // Our key exists already (a retried request of ours): keep its place.
                let rev = get_kvs(&outer, 0)
                    .and_then(|kvs| kvs.first().map(KeyValue::create_revision))
                    .ok_or_else(|| {
                        error::unexpected(WHAT, "compare failed but our key is absent")
                    })?;
                return Ok(
                    match self
                        .recheck_permits(range, key, rev, permits, deadline)
                        .await?
                    {
                        PermitCheck::KeyGone => Enqueue::KeyGone,
                        PermitCheck::Refused(reason) => Enqueue::Refused {
                            rev: Some(rev),
                            reason,
                        },
                        PermitCheck::Ahead { ahead, header_rev } => Enqueue::Queued(Enqueued {
                            rev,
                            header_rev,
                            behind: behind(ahead, permits),
                        }),
                    },
                );
            }
            let (created, ops) = innermost(&outer)
                .ok_or_else(|| error::unexpected(WHAT, "no nested transaction result"))?;
            // Created: put, count, earliest; otherwise count, earliest.
            let at = usize::from(created);
            let first =
                get_kvs(&ops, at + 1).ok_or_else(|| error::unexpected(WHAT, "no range result"))?;
            if created {
                let total = get_count(&ops, at)
                    .ok_or_else(|| error::unexpected(WHAT, "no count result"))?;
                let ahead = u64::try_from(total.saturating_sub(1)).map_err(|_| {
                    error::unexpected(WHAT, format!("count {total} without our key"))
                })?;
                if let Some(reason) = disagreement(range, first.first(), permits) {
                    // The guards make this impossible; kept as a check (the caller deletes it).
                    return Ok(Enqueue::Refused {
                        rev: Some(header_rev),
                        reason,
                    });
                }
                return Ok(Enqueue::Queued(Enqueued {
                    rev: header_rev,
                    header_rev,
                    behind: behind(ahead, permits),
                }));
            }
            if let Some(reason) = disagreement(range, first.first(), permits) {
                return Ok(Enqueue::Refused { rev: None, reason });
            }
            // The earliest key agrees, another does not: create ours while the earliest key
            // is still the same one.
            let Some(head) = first.first() else {
                // The semaphore emptied meanwhile: the first transaction creates our key.
                txn = unless_ours(create_if(
                    vec![Compare::version(range, CompareOp::Equal, 0).with_prefix()],
                    reads().to_vec(),
                ));
                continue;
            };
            tracing::debug!(%range, earliest = %String::from_utf8_lossy(head.key()), "a later permit key records another count; creating ours guarded by the earliest key");
            txn = unless_ours(create_if(
                vec![
                    Compare::create_revision(head.key(), CompareOp::Equal, head.create_revision()),
                    Compare::value(head.key(), CompareOp::Equal, value),
                ],
                reads().to_vec(),
            ));
        }
        Err(Error::unavailable(
            format!("{WHAT}: the earliest key of {range} kept changing"),
            None,
        ))
    }

    /// One read-only transaction: does our key still exist with our revision, how many keys
    /// of the semaphore were created before it (their keys only), and the earliest key's
    /// count against ours.
    ///
    /// # Errors
    /// As [`Etcd::call`], or [`Error::Backend`] on a malformed reply.
    pub(crate) async fn recheck_permits(
        &self,
        range: &str,
        key: &str,
        rev: i64,
        permits: u32,
        deadline: Option<Instant>,
    ) -> Result<PermitCheck, Error> {
        const WHAT: &str = "permit re-check transaction";
        // etcd reads the whole range for a filtered read anyway; a limit would not help.
        let before_us = GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_max_create_revision(rev.saturating_sub(1).max(1));
        let reads = [
            TxnOp::get(range, Some(before_us)),
            TxnOp::get(range, Some(earliest())),
        ];
        let Some((header_rev, ops)) = self.read_with_ours(WHAT, key, rev, reads, deadline).await?
        else {
            return Ok(PermitCheck::KeyGone);
        };
        let ahead = get_kvs(&ops, 1).ok_or_else(|| error::unexpected(WHAT, "no range result"))?;
        // Never count our own key (a filter of revision 1 would not exclude it).
        let ahead = ahead.iter().filter(|kv| kv.create_revision() < rev).count() as u64;
        let first = get_kvs(&ops, 2).ok_or_else(|| error::unexpected(WHAT, "no range result"))?;
        if let Some(reason) = disagreement(range, first.first(), permits) {
            return Ok(PermitCheck::Refused(reason));
        }
        Ok(PermitCheck::Ahead { ahead, header_rev })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_decimal_and_only_equal_counts_agree() {
        assert_eq!(count_value(3), b"3");
        assert!(behind(2, 3).is_none());
        assert!(matches!(behind(3, 3), Some(Behind::Permits(3))));
        assert!(disagreement("r/", None, 3).is_none());
    }
}
