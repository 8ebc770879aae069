//! The Lua scripts of the read-write lock and the semaphore (single node).
//!
//! Per name, in the name's hash tag, next to the mutex's keys (which they never touch, except
//! the shared fence counter):
//! - `<lock>:holders`, a sorted set: member `<mode>:<owner>`, score = the holder's expiry in
//!   server milliseconds. `<mode>` is `r` (reader), `w` (writer) or `p<N>` (one of N permits).
//!   Expired members are dropped by the next acquire; the key itself expires with its last
//!   holder. Holders of one name are all of one kind (a writer alone, readers, or permits of
//!   one N): the grant rule keeps it so.
//! - `<lock>:holders:q` / `<lock>:holders:qt`: the FIFO queue of waiting requests and their
//!   entry deadlines, as the mutex's fair queue (an entry is `<locker id>.<seq>.<mode>`).
//! - `<lock>:fence`: the mutex's fencing counter ([`TOKEN_PRELUDE`](crate::scripts)).
//!
//! The grant rule is the memory reference's (`Backend::may_grant`), over the LIVE entries
//! ahead of the request: a writer when nobody holds and nobody waits ahead; a reader when no
//! writer holds and only readers wait ahead; a permit when `held + waiting ahead < N`.

use std::sync::LazyLock;

use redis::Script;

use crate::scripts::{QUEUE_PRELUDE, TOKEN_PRELUDE, add_chunked};

/// The family's helpers, after [`QUEUE_PRELUDE`] (placed after each script's `TOKEN_PRELUDE`
/// when it has one).
const FAMILY_PRELUDE: &str = r#"
-- A mode (`r`, `w`, `p<N>`, or a holder member starting with one): kind and permit count.
local function mode_of(m)
  return string.sub(m, 1, 1), tonumber(string.match(m, '^p(%d+)')) or 0
end
-- A queue entry's mode: the part after its last dot.
local function entry_mode(e)
  return mode_of(string.match(e, '%.([^.]*)$') or '')
end
-- The key of the holders expires with its last holder.
local function fit_expiry(h)
  local last = redis.call('ZRANGE', h, -1, -1, 'WITHSCORES')
  if last[2] then redis.call('PEXPIREAT', h, string.format('%.0f', tonumber(last[2]))) end
end
-- Drops expired holders; returns the holders' kind (nil: none), count and permit count.
local function holders(h, now)
  redis.call('ZREMRANGEBYSCORE', h, '-inf', now)
  local first = redis.call('ZRANGE', h, 0, 0)[1]
  if not first then return nil, 0, 0 end
  local kind, n = mode_of(first)
  return kind, redis.call('ZCARD', h), n
end
-- Whether a request of `kind` (`n` permits) may be granted, with `ahead` live requests
-- queued before it (`readers`: all of them readers).
local function may(kind, n, hk, hc, ahead, readers)
  if kind == 'w' then return hc == 0 and ahead == 0 end
  if kind == 'r' then return (hk == nil or hk == 'r') and readers end
  if kind == 'p' then return (hk == nil or hk == 'p') and hc + ahead < n end
  return false
end
local function drop(q, qt, e)
  redis.call('LREM', q, 1, e)
  redis.call('HDEL', qt, e)
end
-- Notifies the queued requests that may be granted now, from the head on, and stops at the
-- first that may not: only those that can go are told. Drops dead entries on the way.
local function wake(h, q, qt, now, chan)
  local hk, hc = holders(h, now)
  local ahead, readers = 0, true
  for _, e in ipairs(redis.call('LRANGE', q, 0, -1)) do
    local dl = tonumber(redis.call('HGET', qt, e))
    if dl and dl > now then
      local kind, n = entry_mode(e)
      if not may(kind, n, hk, hc, ahead, readers) then return end
      publish(e, chan)
      ahead = ahead + 1
      if kind ~= 'r' then readers = false end
    else
      drop(q, qt, e)
    end
  end
end
"#;

/// Acquire (every attempt, the first included).
///
/// KEYS: holders, fence, queue, deadlines. ARGV: member, ttl ms, entry, entry lifetime ms,
/// fence lifetime ms, channel prefix.
///
/// Returns `{1, token}` when granted; `{-1, n}` when the name's permits (held or awaited) are
/// `n`, not this request's; `{0, ms}` when queued (`ms`: until the first holder's expiry, -1
/// when nobody holds). A member that still holds (an attempt whose reply was lost) is granted
/// again: its expiry re-armed, with a new token (the caller counts its deadline from THIS
/// attempt).
const ACQUIRE_BODY: &str = r#"
local now = now_ms()
local h, member, ttl, entry = KEYS[1], ARGV[1], tonumber(ARGV[2]), ARGV[3]
local kind, n = mode_of(member)
local function hold()
  redis.call('ZADD', h, string.format('%.0f', now + ttl), member)
  extend(h, ttl)
  drop(KEYS[3], KEYS[4], entry)
  local token = next_token(KEYS[2], ARGV[5])
  -- Readers or permits right behind may go too.
  wake(h, KEYS[3], KEYS[4], now, ARGV[6])
  return {1, token}
end
local mine = tonumber(redis.call('ZSCORE', h, member))
if mine and mine > now then return hold() end
local hk, hc, hn = holders(h, now)
local ahead, readers, pn, queued = 0, true, 0, false
for _, e in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
  if e == entry then
    queued = true
    break
  end
  local dl = tonumber(redis.call('HGET', KEYS[4], e))
  if dl and dl > now then
    local k, en = entry_mode(e)
    ahead = ahead + 1
    if k ~= 'r' then readers = false end
    if k == 'p' then pn = en end
  else
    drop(KEYS[3], KEYS[4], e)
  end
end
if kind == 'p' then
  local agreed = 0
  if hk == 'p' then agreed = hn elseif pn > 0 then agreed = pn end
  if agreed > 0 and agreed ~= n then return {-1, agreed} end
end
if may(kind, n, hk, hc, ahead, readers) then return hold() end
redis.call('HSET', KEYS[4], entry, string.format('%.0f', now + tonumber(ARGV[4])))
if not queued then redis.call('RPUSH', KEYS[3], entry) end
extend(KEYS[3], ARGV[4])
extend(KEYS[4], ARGV[4])
-- Those ahead that may go now (a holder expired, a message was lost) are told.
wake(h, KEYS[3], KEYS[4], now, ARGV[6])
local first = redis.call('ZRANGE', h, 0, 0, 'WITHSCORES')
if first[2] then return {0, tonumber(first[2]) - now} end
return {0, -1}
"#;

/// Guarded release: removes only `member`, then tells the queued requests that may go now.
///
/// KEYS: holders, queue, deadlines. ARGV: member, channel prefix. Returns 1 when it held.
const RELEASE_BODY: &str = r#"
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return 0 end
fit_expiry(KEYS[1])
wake(KEYS[1], KEYS[2], KEYS[3], now_ms(), ARGV[2])
return 1
"#;

/// Withdraws a request (cancel, timeout, a grant given back): removes its queue entry and
/// its member (a grant whose reply was not seen), then tells the queued requests that may go
/// now (a withdrawn writer may have held back the readers behind it).
///
/// KEYS: holders, queue, deadlines. ARGV: member, entry, channel prefix. Returns 1 when the
/// member held.
const WITHDRAW_BODY: &str = r#"
drop(KEYS[2], KEYS[3], ARGV[2])
local held = redis.call('ZREM', KEYS[1], ARGV[1])
if held == 1 then fit_expiry(KEYS[1]) end
wake(KEYS[1], KEYS[2], KEYS[3], now_ms(), ARGV[3])
return held
"#;

/// Batched renewal of holders: each member that is still live gets the full TTL from now.
/// Never re-adds a member.
///
/// KEYS: the holders keys. ARGV: ttl ms, then one member per key. Returns one 1/0 per key.
const RENEW_BODY: &str = r#"
local now = now_ms()
local ttl = tonumber(ARGV[1])
local out = {}
for i = 1, #KEYS do
  local s = tonumber(redis.call('ZSCORE', KEYS[i], ARGV[i + 1]))
  if s and s > now then
    redis.call('ZADD', KEYS[i], 'XX', string.format('%.0f', now + ttl), ARGV[i + 1])
    extend(KEYS[i], ttl)
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
"#;

/// The family's scripts, built once per process.
pub(crate) struct FamilyScripts {
    pub(crate) acquire: Script,
    pub(crate) release: Script,
    pub(crate) withdraw: Script,
    pub(crate) renew: Script,
}

static SCRIPTS: LazyLock<FamilyScripts> = LazyLock::new(|| FamilyScripts {
    acquire: Script::new(&format!(
        "{TOKEN_PRELUDE}{QUEUE_PRELUDE}{FAMILY_PRELUDE}{ACQUIRE_BODY}"
    )),
    release: Script::new(&format!("{QUEUE_PRELUDE}{FAMILY_PRELUDE}{RELEASE_BODY}")),
    withdraw: Script::new(&format!("{QUEUE_PRELUDE}{FAMILY_PRELUDE}{WITHDRAW_BODY}")),
    renew: Script::new(&format!("{QUEUE_PRELUDE}{FAMILY_PRELUDE}{RENEW_BODY}")),
});

/// The process-wide family scripts.
pub(crate) fn family_scripts() -> &'static FamilyScripts {
    &SCRIPTS
}

/// Adds to `pipe` the renewal of every `(holders key, member)` pair: `SCRIPT LOAD` (ignored),
/// then one [`RENEW_BODY`] call per chunk of [`RENEW_CHUNK`](crate::scripts::RENEW_CHUNK)
/// keys. Returns how many replies (chunks) it added.
pub(crate) fn add_renewals(
    pipe: &mut redis::Pipeline,
    ttl_ms: u64,
    entries: &[(&str, &str)],
) -> usize {
    add_chunked(pipe, &family_scripts().renew, ttl_ms, entries)
}
