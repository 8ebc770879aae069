//! The Lua scripts. Each is loaded once per server and then called by SHA1 (`EVALSHA`);
//! `redis::Script` loads it again when the server answers `NOSCRIPT` (after a restart or a
//! `SCRIPT FLUSH`).
//!
//! Every script touches only the keys of ONE lock name (they share a hash tag, so one Redis
//! Cluster slot), declared in `KEYS`, except the batched renewals ([`RENEW`] here, the family's
//! in `family_scripts`), which take the keys of many leases: on one server all of a locker's,
//! on a cluster those of one slot per call (see `renew.rs`).

use std::sync::LazyLock;

use redis::Script;

/// Helpers of every queue's scripts, the mutex's fair queue and the read-write lock's and
/// semaphore's (`family_scripts`): server time in milliseconds, an expiry that is only ever
/// extended, and the notification of a queue entry's locker.
///
/// A queue entry starts with `<locker id>.`; its locker listens on the channel
/// `<channel prefix><locker id>`. The queue keys' expiry is only ever extended, never
/// shortened, so a locker with a short TTL cannot cut the queue's life under the entries of
/// lockers with longer ones.
pub(crate) const QUEUE_PRELUDE: &str = r#"
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- Sets a key's expiry to `ms` unless it already lives longer (never shortens).
local function extend(key, ms)
  local left = redis.call('PTTL', key)
  if left == -1 or left < tonumber(ms) then redis.call('PEXPIRE', key, ms) end
end
-- Tells the locker of queue entry `e` (only it) to look again.
local function publish(e, chan_prefix)
  local locker = string.match(e, '^([^.]+)')
  if locker then redis.call('PUBLISH', chan_prefix .. locker, e) end
end
"#;

/// The rule that says whether a queue entry is live, shared by the fair scripts (through
/// [`FAIR_PRELUDE`]) and [`INSPECT_BODY`]: an entry is live while its deadline (server
/// milliseconds, in the deadlines hash) is ahead of `now`; one without a deadline is dead.
const LIVE_PRELUDE: &str = r#"
-- The deadline of queue entry `e` when it is live at `now`; nil when it is dead.
local function live_until(qt, e, now)
  local dl = tonumber(redis.call('HGET', qt, e))
  if dl and dl > now then return dl end
  return nil
end
"#;

/// The queue purge and the baton pass, shared by the fair scripts (placed after their fast
/// paths with [`QUEUE_PRELUDE`] and [`LIVE_PRELUDE`], so these closures are only created when
/// needed; [`TOKEN_PRELUDE`] must come before).
///
/// A queue entry is `<locker id>.<sequence>`. A lock released while waiters are queued is not
/// freed, so that nobody can barge in with a plain `SET NX`: it is GRANTED to the live head
/// when the head left its grant details (every waiter of this version does: its owner value,
/// TTL and attempt number), in the release script itself, with the next token, and the head
/// is sent `<entry> <token> <owner> <attempt>` (one hop fewer than the head asking for it);
/// otherwise it is RESERVED for the head (value `r:<entry>`) and the head is sent `<entry>`.
/// Either lasts no longer than the head's entry (nor than the head's TTL), and a reservation
/// whose entry is no longer live counts as free: a crashed head stalls the queue for at most
/// its entry's lifetime (a few seconds). The head's lease counts its deadline from the send of
/// the queued attempt the announcement names (the last refresh of its entry before the
/// release), with the TTL capped at the entry lifetime, and only when that attempt is the
/// last one the head saw answered: see `acquire::direct`.
const FAIR_PRELUDE: &str = r#"
-- Forgets queue entry `e` (its deadline and its grant details).
local function forget(qt, e)
  redis.call('HDEL', qt, e, 'g:' .. e)
end
-- Drops queue heads whose deadline passed (crashed or vanished waiters); returns the live head.
local function live_head(q, qt, now)
  while true do
    local head = redis.call('LINDEX', q, 0)
    if not head then return nil end
    local dl = live_until(qt, head, now)
    if dl then return head, dl end
    redis.call('LPOP', q)
    forget(qt, head)
  end
end
-- Tells the live head waiter (only it) to look again.
local function notify_head(q, qt, chan_prefix)
  local head = live_head(q, qt, now_ms())
  if head then publish(head, chan_prefix) end
end
-- Hands the lock to the live head, or frees it. A head that left its grant details
-- (`g:<entry>` = `<ttl ms>:<owner>:<attempt>`) is granted at once: the key holds its owner
-- value for its TTL, but never past its entry's deadline (so a crashed head stalls the queue
-- no longer than a reservation would), with the next token, and the head is told the token,
-- the owner value and the number of its attempt that left the details (so it can tell this
-- grant from one that came before its later attempts). Otherwise the
-- lock is RESERVED for the head (value `r:<entry>`, no longer than its entry nor `ttl`) and
-- only the head is told to take it.
local function pass_on(lock, q, qt, chan_prefix, ttl, fence, life)
  local now = now_ms()
  local head, dl = live_head(q, qt, now)
  if not head then
    redis.call('DEL', lock)
    return
  end
  local g = redis.call('HGET', qt, 'g:' .. head)
  local gttl, gowner
  local gattempt
  if g then gttl, gowner, gattempt = string.match(g, '^(%d+):(%x+):(%d+)$') end
  local px = math.min(tonumber(gttl or ttl), dl - now)
  if px < 1 then px = 1 end
  local locker = string.match(head, '^([^.]+)')
  if gowner and locker then
    -- Publish first: if it is refused (ACL), the script stops before granting.
    local token = next_token(fence, life)
    redis.call('PUBLISH', chan_prefix .. locker,
      head .. ' ' .. string.format('%.0f', token) .. ' ' .. gowner .. ' ' .. gattempt)
    redis.call('SET', lock, gowner, 'PX', string.format('%.0f', px))
    redis.call('LPOP', q)
    forget(qt, head)
    return
  end
  -- Publish first: if it is refused (ACL), the script stops before reserving, so a
  -- reservation never exists without its notification.
  publish(head, chan_prefix)
  redis.call('SET', lock, 'r:' .. head, 'PX', string.format('%.0f', px))
end
"#;

/// The fencing counter, shared by every granting script (placed first: it is small).
///
/// A grant's token is the counter plus one, raised to at least the server's clock in
/// microseconds (`TIME`). So a counter that was lost (a restart without persistence, a failover
/// to a replica that missed the latest grants, an evicted fence key) starts again ABOVE every
/// token issued before, as long as the server clock does not step back: tokens never repeat or
/// go back. The counter key lives for [`FENCE_LIFETIME`] after the last grant (not forever).
/// Lua numbers are doubles, exact for integers below 2^53 (about 285 years of microseconds);
/// the value is written with `%.0f`, never in exponent notation.
///
/// With a lifetime of `0` (Redlock), the token is the plain counter + 1 and the key never
/// expires: Redlock's nodes must agree on their counters (each node's clock would differ and
/// cost a fence write-back round per grant), and its majority-max rule keeps tokens increasing
/// when a minority of nodes loses its counters.
pub(crate) const TOKEN_PRELUDE: &str = r#"
local function next_token(fence, life)
  local tok = tonumber(redis.call('GET', fence) or '0') + 1
  if tonumber(life) > 0 then
    local t = redis.call('TIME')
    local floor = tonumber(t[1]) * 1000000 + tonumber(t[2])
    if tok < floor then tok = floor end
    redis.call('SET', fence, string.format('%.0f', tok), 'PX', life)
  else
    redis.call('SET', fence, string.format('%.0f', tok))
  end
  return tok
end
"#;

/// How long a fence key lives after its last grant. Once it expired, the next token is the
/// server's clock in microseconds, still above every earlier token (see [`TOKEN_PRELUDE`]); the
/// counter only keeps tokens increasing across server clock steps back shorter than this gap.
pub(crate) const FENCE_LIFETIME: std::time::Duration =
    std::time::Duration::from_secs(7 * 24 * 3600);

/// The first attempt of every acquire, in one round trip: `SET lock owner NX PX ttl`; when it
/// granted, the next token ([`TOKEN_PRELUDE`]); otherwise the holder's `PTTL`. A failed attempt
/// writes nothing (no counter bump per poll).
///
/// KEYS: lock, fence. ARGV: owner, ttl ms, fence lifetime ms (`0`: a plain counter, see
/// [`TOKEN_PRELUDE`]). Returns `{1, token}` or `{0, pttl}`.
///
/// A key already holding OUR owner value is our own grant: a request sent again after it ran
/// (Redis Cluster's client re-sends after a dropped connection) or an earlier attempt of the
/// same acquire whose reply was lost. It is granted again: the TTL is re-armed (the caller
/// counts the deadline from THIS attempt's send, so the key must not expire earlier) and the
/// token is a new one, above every earlier token (the one the lost reply carried was never
/// handed out). Answering "held" left a key nobody held for a whole TTL.
///
/// A release never frees a lock that has queued waiters (it is reserved for the head), so this
/// cannot bypass a fair queue; only when a holder's key EXPIRED (a crash) may a newcomer get the
/// lock before the queued head, which costs fairness once, never safety.
const FAST_ACQUIRE_BODY: &str = r#"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, next_token(KEYS[2], ARGV[3])}
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, next_token(KEYS[2], ARGV[3])}
end
return {0, redis.call('PTTL', KEYS[1])}
"#;

/// Fair acquire (the queued path; the uncontended first attempt is [`FAST_ACQUIRE_BODY`]).
///
/// KEYS: lock, fence, queue, deadlines. ARGV: owner, ttl ms, entry, entry lifetime ms, fence
/// lifetime ms, channel prefix, the attempt's number (the waiter's queued attempts count from
/// 1; a release that grants the entry directly announces the number of the last one that ran
/// before it).
///
/// Grants when the lock is reserved for `entry`, or free with no other live head. A waiter it
/// queues (or refreshes) also leaves its grant details (`g:<entry>` in the deadlines hash: its
/// TTL, owner value and attempt number), so that a release can grant it directly (see `pass_on` in
/// [`FAIR_PRELUDE`]). Returns
/// `{1, token}` when granted; `{0, pttl, is_head}` when held (or reserved) by someone else;
/// `{0, -3, 0, head_ms_left}` when free but another waiter's turn.
///
/// "Our own earlier grant" (an attempt whose reply was lost or late set the key with our owner
/// value) re-arms the key's TTL: the caller counts the lease's deadline from THIS attempt, so
/// the key must not expire earlier.
const ACQUIRE_FAIR_HEAD: &str = r#"
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  -- The fence only grew since (nobody else was granted); a lost fence key gets a new token.
  local tok = tonumber(redis.call('GET', KEYS[2]) or '0')
  if tok < 1 then tok = next_token(KEYS[2], ARGV[5]) end
  return {1, tok}
end
"#;

/// The rest of the fair acquire, after [`QUEUE_PRELUDE`] and [`FAIR_PRELUDE`].
const ACQUIRE_FAIR_TAIL: &str = r#"
local now = now_ms()
local entry = ARGV[3]
local head, head_dl = live_head(KEYS[3], KEYS[4], now)
if holder and string.sub(holder, 1, 2) == 'r:' then
  -- A reservation for an entry that is no longer live (a crashed head) counts as free.
  if not live_until(KEYS[4], string.sub(holder, 3), now) then
    redis.call('DEL', KEYS[1])
    holder = false
  end
end
if holder == 'r:' .. entry or (not holder and (not head or head == entry)) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  local token = next_token(KEYS[2], ARGV[5])
  redis.call('LREM', KEYS[3], 1, entry)
  forget(KEYS[4], entry)
  return {1, token}
end
if redis.call('HSET', KEYS[4], entry, now + tonumber(ARGV[4])) == 1 then
  redis.call('RPUSH', KEYS[3], entry)
end
-- What a release needs to grant us at once (see `pass_on`).
redis.call('HSET', KEYS[4], 'g:' .. entry, ARGV[2] .. ':' .. ARGV[1] .. ':' .. ARGV[7])
extend(KEYS[3], ARGV[4])
extend(KEYS[4], ARGV[4])
if holder then
  local is_head = 0
  if redis.call('LINDEX', KEYS[3], 0) == entry then is_head = 1 end
  return {0, redis.call('PTTL', KEYS[1]), is_head}
end
-- Free, but the head's turn: tell the head (it may have missed its message).
publish(head, ARGV[6])
return {0, -3, 0, head_dl - now}
"#;

/// Fair release: compare-and-delete, or, when waiters are queued, grant the lock to the live
/// head (or reserve it for the head) and notify only it (`pass_on` in [`FAIR_PRELUDE`]).
///
/// KEYS: lock, queue, deadlines, fence. ARGV: owner, channel prefix, ttl ms, fence lifetime ms.
/// Returns 1 when it was ours.
const RELEASE_FAIR_HEAD: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if not redis.call('LINDEX', KEYS[2], 0) then
  redis.call('DEL', KEYS[1])
  return 1
end
"#;

/// The rest of the fair release: someone is queued.
const RELEASE_FAIR_TAIL: &str = r#"
pass_on(KEYS[1], KEYS[2], KEYS[3], ARGV[2], ARGV[3], KEYS[4], ARGV[4])
return 1
"#;

/// Withdraws a waiter (cancel or timeout): removes its queue entry; if the lock is ours (an
/// unseen grant) or reserved for us, passes it on; if we were the head, tells the new head.
///
/// KEYS: lock, queue, deadlines, fence. ARGV: owner, entry, channel prefix, ttl ms, fence
/// lifetime ms.
const WITHDRAW_BODY: &str = r#"
local was_head = redis.call('LINDEX', KEYS[2], 0) == ARGV[2]
redis.call('LREM', KEYS[2], 1, ARGV[2])
forget(KEYS[3], ARGV[2])
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] or holder == 'r:' .. ARGV[2] then
  pass_on(KEYS[1], KEYS[2], KEYS[3], ARGV[3], ARGV[4], KEYS[4], ARGV[5])
  return 1
end
if was_head then notify_head(KEYS[2], KEYS[3], ARGV[3]) end
return 0
"#;

/// Inspect: reads one name's lock and, when asked, counts its queue, writing nothing (after
/// [`QUEUE_PRELUDE`] for the clock and [`LIVE_PRELUDE`]; it calls neither helper that writes).
///
/// KEYS: lock, fence, queue, deadlines. ARGV: `1` to count the queue, `0` not to (spin mode,
/// Redlock). Returns `{holder's owner value or nil, lock PTTL, fence value or nil, live
/// entries}`; a reservation (`r:<entry>`, see [`FAIR_PRELUDE`]) is the head's turn, not a
/// holder, so it reads as nil like a free lock.
///
/// The queue is walked with `LINDEX` (the command the grant logic reads it with, in the mutex's
/// ACL list) and counts only the entries [`LIVE_PRELUDE`] calls live: an expired entry the
/// grant logic would drop when it reaches the head is not a waiter.
const INSPECT_BODY: &str = r#"
local holder = redis.call('GET', KEYS[1])
if holder and string.sub(holder, 1, 2) == 'r:' then holder = false end
local pttl = redis.call('PTTL', KEYS[1])
local fence = redis.call('GET', KEYS[2])
local waiting = 0
if ARGV[1] == '1' then
  local now = now_ms()
  local i = 0
  while true do
    local e = redis.call('LINDEX', KEYS[3], i)
    if not e then break end
    if live_until(KEYS[4], e, now) then waiting = waiting + 1 end
    i = i + 1
  end
end
return {holder, pttl, fence, waiting}
"#;

/// Plain release: compare-and-delete. KEYS: lock. ARGV: owner. Returns 1 when deleted.
const RELEASE_PLAIN_SRC: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"#;

/// Batched renewal: compare-and-PEXPIRE of every listed lock. Never re-creates a key.
///
/// KEYS: the locks. ARGV: ttl ms, then one owner per key. Returns one 1/0 per key.
const RENEW_SRC: &str = r#"
local out = {}
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[i + 1] then
    out[i] = redis.call('PEXPIRE', KEYS[i], ARGV[1])
  else
    out[i] = 0
  end
end
return out
"#;

/// Redlock fence write-back: raises the counter (a plain one, never expiring) to at least
/// ARGV[1]. KEYS: fence. Returns 1.
const RAISE_FENCE_SRC: &str = r#"
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
if cur < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) end
return 1
"#;

/// All scripts, built once per process.
pub(crate) struct Scripts {
    pub(crate) fast_acquire: Script,
    pub(crate) acquire_fair: Script,
    pub(crate) release_fair: Script,
    pub(crate) withdraw: Script,
    pub(crate) release_plain: Script,
    pub(crate) renew: Script,
    pub(crate) raise_fence: Script,
    pub(crate) inspect: Script,
}

static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    fast_acquire: Script::new(&format!("{TOKEN_PRELUDE}{FAST_ACQUIRE_BODY}")),
    acquire_fair: Script::new(&format!(
        "{TOKEN_PRELUDE}{ACQUIRE_FAIR_HEAD}{QUEUE_PRELUDE}{LIVE_PRELUDE}{FAIR_PRELUDE}{ACQUIRE_FAIR_TAIL}"
    )),
    release_fair: Script::new(&format!(
        "{RELEASE_FAIR_HEAD}{TOKEN_PRELUDE}{QUEUE_PRELUDE}{LIVE_PRELUDE}{FAIR_PRELUDE}{RELEASE_FAIR_TAIL}"
    )),
    withdraw: Script::new(&format!(
        "{TOKEN_PRELUDE}{QUEUE_PRELUDE}{LIVE_PRELUDE}{FAIR_PRELUDE}{WITHDRAW_BODY}"
    )),
    release_plain: Script::new(RELEASE_PLAIN_SRC),
    renew: Script::new(RENEW_SRC),
    raise_fence: Script::new(RAISE_FENCE_SRC),
    inspect: Script::new(&format!("{QUEUE_PRELUDE}{LIVE_PRELUDE}{INSPECT_BODY}")),
});

/// The process-wide scripts.
pub(crate) fn scripts() -> &'static Scripts {
    &SCRIPTS
}

/// The first attempt of every acquire ([`FAST_ACQUIRE_BODY`]) as an invocation; `clock_floor`
/// picks tokens raised to the server clock (single node) or a plain counter (Redlock).
pub(crate) fn fast_acquire(
    lock: &str,
    fence: &str,
    owner: &str,
    ttl_ms: u64,
    clock_floor: bool,
) -> redis::ScriptInvocation<'static> {
    let mut inv = scripts().fast_acquire.prepare_invoke();
    inv.key(lock)
        .key(fence)
        .arg(owner)
        .arg(ttl_ms)
        .arg(if clock_floor { fence_lifetime_ms() } else { 0 });
    inv
}

/// [`FENCE_LIFETIME`] in milliseconds, for the scripts.
pub(crate) fn fence_lifetime_ms() -> u64 {
    u64::try_from(FENCE_LIFETIME.as_millis()).unwrap_or(u64::MAX)
}

/// The most keys one renewal script call takes; larger batches become several calls in ONE
/// pipeline (one round trip), so the server can serve other clients between them.
pub(crate) const RENEW_CHUNK: usize = 1000;

/// One round trip renewing every `(lock key, owner)` pair: `SCRIPT LOAD` (a cheap no-op when
/// the script is cached; it makes `NOSCRIPT` impossible inside the pipeline), then one
/// [`RENEW`](RENEW_SRC) call per chunk of [`RENEW_CHUNK`] keys. The reply is one
/// `Vec<i64>` per chunk; [`flatten_renewals`] joins them.
pub(crate) fn renew_pipeline<'a>(
    ttl_ms: u64,
    entries: impl ExactSizeIterator<Item = (&'a str, &'a str)>,
) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    let entries: Vec<(&str, &str)> = entries.collect();
    add_chunked(&mut pipe, &scripts().renew, ttl_ms, &entries);
    pipe
}

/// Adds to `pipe` a batched renewal script's calls over `(key, value)` pairs: `SCRIPT LOAD`
/// (its reply ignored), then one call per chunk of [`RENEW_CHUNK`] pairs, with the chunk's
/// keys as KEYS and `ttl_ms`, then the chunk's values, as ARGV. Returns how many calls
/// (replies) it added.
pub(crate) fn add_chunked(
    pipe: &mut redis::Pipeline,
    script: &Script,
    ttl_ms: u64,
    entries: &[(&str, &str)],
) -> usize {
    pipe.load_script(script).ignore();
    let mut chunks = 0;
    for chunk in entries.chunks(RENEW_CHUNK) {
        let mut inv = script.prepare_invoke();
        inv.arg(ttl_ms);
        for (key, _) in chunk {
            inv.key(*key);
        }
        for (_, value) in chunk {
            inv.arg(*value);
        }
        pipe.invoke_script(&inv);
        chunks += 1;
    }
    chunks
}

/// Joins the per-chunk replies of [`renew_pipeline`]; `None` when their total length is not
/// `expected`.
pub(crate) fn flatten_renewals(chunks: Vec<Vec<i64>>, expected: usize) -> Option<Vec<i64>> {
    let out: Vec<i64> = chunks.into_iter().flatten().collect();
    (out.len() == expected).then_some(out)
}
