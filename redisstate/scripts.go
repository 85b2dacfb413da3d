package redisstate

import (
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmproxy/llmproxy/internal/bucket"
)

// The scripts keep a limit group's shared state in these keys:
//
//	state   hash: paused (ms), first (when a first request went alone),
//	        acc (the latest accepted answer, ms), reply (the first
//	        accepted answer's time to its headers, ms), last (the latest
//	        dispatch, ms), rn
//	        (refusals learned from), an (answers admitted), ms/mc/mp (dispatches this second and
//	        the last), the fleet's fixed window (see fleetWindow): wb
//	        its start (ms), ws the requests sent when it began, wa the
//	        answers of it admitted, pb/ps/pa the same of the window before,
//	        wp the latest boundary a refusal named, wo the one the length
//	        is counted from, wcap its allowance, wlen its
//	        length (ms), wfull the windows since, wclimb its probe's
//	        climb; and per budget (prefix r_ for requests, t_ for
//	        tokens) known, syn, size, rate (per second), avail, at (ms),
//	        sent, seen (the largest sent-at-dispatch an answer's remaining
//	        count covered), low (when its figures were last affirmed)
//	leases  sorted set: one member per permit out, scored by its expiry (ms)
//	waiting hash: replica -> "since:seen:cost", the arrival of the
//	        replica's oldest waiter, when it last asked (ms), and its
//	        estimated tokens
//	climits hash: replica -> "limit:seen:lowered", its concurrency limit,
//	        when it said so (ms), and 1 when refusals lowered it
//	raise   string: the replica that may raise a pace learned from
//	        refusals (one at a time), for 10 s after its last raise
//	levels  hash: a<level>, r<level>: every replica's answers admitted and
//	        refused by the number in flight they went at; n their total
//	sent    string (one per lanes' group, every limit of it): the group's
//	        dispatches, every replica's
//
// A limit's keys and its group's count share the group's hash tag, so a
// Redis Cluster keeps them in one slot.
//
// Times are milliseconds on Redis' clock (TIME): the one clock every
// replica shares, so a replica whose clock is off moves nothing but its
// own deadlines. Replicas send durations (a pause's length, a waiter's
// age) and read times back against the `now` each script returns. A
// test may stand a clock of its own in for Redis' (Config.redisClock):
// every script's args.now is then its time, and TIME is not read.

// lib holds the budget arithmetic the scripts share: the Go bucket's
// (internal/bucket) Refill, Admit and Charge, on a hash.
const lib = `
local function num(v, d) if v == false or v == nil then return d end return tonumber(v) end
-- clock is the time the script runs at (ms): Redis' own (TIME), or, when
-- positive, given (args.now), the clock a test stands in for Redis' (see
-- Config.redisClock).
local function clock(given)
  local at = tonumber(given)
  if at > 0 then return at end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function budget(key, p, now)
  local f = redis.call('HMGET', key, p..'known', p..'syn', p..'size', p..'rate', p..'avail', p..'at', p..'sent')
  local b = {known = num(f[1], 0), syn = num(f[2], 0), size = num(f[3], 0), rate = num(f[4], 0),
             avail = num(f[5], 0), at = num(f[6], now), sent = num(f[7], 0)}
  if b.known == 1 and b.rate > 0 and now > b.at then
    b.avail = math.min(b.size, b.avail + b.rate * (now - b.at) / 1000)
  end
  -- Redis' clock going back (a failover to a host behind) must not move
  -- the budget's time back: the same interval would refill twice.
  b.at = math.max(b.at, now)
  return b
end
local function charge(b, cost)
  if b.size > 0 then return math.min(cost, b.size) end
  return cost
end
-- admit: ok, and when not, the time to ask again (0: an answer must tell)
local function admit(b, now, cost)
  if b.known ~= 1 then return true, 0 end
  local need = charge(b, cost)
  if b.avail >= need then return true, 0 end
  -- One wait is at most a day, as in Go: a tiny rate asks again then.
  if b.rate > 0 then return false, now + math.max(1, math.ceil(math.min((need - b.avail) / b.rate, ${maxWaitSeconds}) * 1000)) end
  return false, 0
end
local function save(key, p, b)
  redis.call('HSET', key, p..'avail', tostring(b.avail), p..'at', b.at, p..'sent', b.sent)
end
`

// admitLib holds the admit script's steps: the concurrency limit, the
// oldest waiter first, the count of the group's dispatches.
const admitLib = `
-- The concurrency limit: the lowest any replica's refusals lowered it to
-- lately, since a replica that saw concurrency refusals is not overruled
-- by one that did not; with no such evidence, the highest any replica
-- grew to, so a fresh replica at its start does not pull the fleet down.
-- A replica silent for a minute no longer counts. Also 1 when some
-- replica said so in the last minute (it learned from an answer).
local function concurrencyLimit(key, now, default, maxc)
  local lowered, grown, answered = nil, nil, 0
  local cl = redis.call('HGETALL', key)
  for i = 1, #cl, 2 do
    local l, seen, ev = string.match(cl[i+1], '^(%d+):(%d+):?(%d*)$')
    if l == nil or now - tonumber(seen) > 60000 then
      redis.call('HDEL', key, cl[i])
    else
      answered = 1
      if ev == '1' then
        if lowered == nil or tonumber(l) < lowered then lowered = tonumber(l) end
      elseif grown == nil or tonumber(l) > grown then
        grown = tonumber(l)
      end
    end
  end
  return math.min(lowered or grown or default, maxc), answered
end
-- No replica starves: permits, requests and tokens go first to replicas
-- whose oldest waiter arrived earlier (what they wait for is kept for
-- them). Waiting replicas ask again every few tens of milliseconds; one
-- that stopped asking (its waiter left) is forgotten after 250 ms.
-- Returns how many waiters are older and their cost.
local function olderWaiters(key, replica, since, now, cost, keyttl)
  redis.call('HSET', key, replica, since .. ':' .. now .. ':' .. cost)
  local older, oldercost = 0, 0
  local w = redis.call('HGETALL', key)
  for i = 1, #w, 2 do
    if w[i] ~= replica then
      local s, seen, c = string.match(w[i+1], '^(%d+):(%d+):?(%d*)$')
      if s == nil or now - tonumber(seen) > 250 then
        redis.call('HDEL', key, w[i])
      elseif tonumber(s) < since then
        older = older + 1
        oldercost = oldercost + num(tonumber(c), 0)
      end
    end
  end
  redis.call('PEXPIRE', key, keyttl)
  return older, oldercost
end
-- spread: before any budget is known and before any replica was refused,
-- the group's dispatches go at least 1/(2 × climit) of the first accepted
-- answer's time to its headers (reply) apart, fleet-wide, as one
-- process's slow start spreads its own (startSpread): the first refusal
-- comes back before the rest of a burst has gone. One time for every
-- replica, so none waits on a gap longer than another's. on is 0 when
-- the group does not start slow (its concurrency is configured: Go's
-- limit.Limits.SlowStart decides, and admitArgs carries it). A last dispatch
-- ahead of now (Redis' clock went back) counts as now. Returns when the
-- next may go (0: now).
local function spread(key, now, on, climit, known, rn)
  if on == 0 or known or rn > 0 then return 0 end
  local f = redis.call('HMGET', key, 'reply', 'last')
  local gap = num(f[1], 0) / (${startSpread} * climit) -- under 1 ms: none on this clock
  local at = math.min(num(f[2], 0), now) + gap
  if gap >= 1 and now < at then return math.ceil(at) end
  return 0
end
-- fleetWindow holds the group when the fleet sent its fixed window's
-- allowance, every replica's dispatches counted, as one process closes
-- its window once its own count reaches it: a replica that counted only
-- its own would send until a refusal came back, and the rest of the
-- fleet's burst with it would be refused. The window, its allowance and
-- its length are learned from refusals whose stated waits end at one
-- boundary (see noteWindow); a window past its length starts the next.
-- One window in ${probeWindows} sends more, to find an allowance that grew.
-- sent is the group's requests sent so far. Returns when the group may
-- send again (0: now), and whether the fleet knows the window: its
-- allowance then paces the group, not a pace learned from refusals (a
-- replica that never saw a closure of its own would keep one).
local function fleetWindow(key, now, sent)
  local f = redis.call('HMGET', key, 'wb', 'ws', 'wcap', 'wlen', 'wfull', 'wclimb')
  local wb, ws, wcap, wlen, wfull, climb = num(f[1], 0), num(f[2], 0), num(f[3], 0), num(f[4], 0), num(f[5], 0), num(f[6], 0)
  if wcap <= 0 or wb <= 0 or wlen <= 0 or sent < ws then return 0, false end
  -- A boundary read from a refusal is late by the time its learning took
  -- to reach Redis, and a length from two of them is off by as much: the
  -- next window is taken to open ${windowMargin} ms late, as sending into
  -- the window that ends loses every request sent.
  if now >= wb + wlen + ${windowMargin} then
    local k = math.floor((now - wb) / wlen)
    local pb, ps, pa = 0, sent, 0
    if k == 1 then pb, ps, pa = wb, ws, num(redis.call('HGET', key, 'wa'), 0) end
    wb, ws, wfull = wb + k * wlen, sent, wfull + 1
    redis.call('HSET', key, 'wb', wb, 'ws', ws, 'wa', 0, 'pb', pb, 'ps', ps, 'pa', pa, 'wfull', wfull)
  end
  local extra = 0
  if climb > 0 then
    extra = 2 ^ math.min(climb, ${maxClimb})
  elseif wfull % ${probeWindows} == ${probeWindows} - 1 then
    extra = 1
  end
  if sent - ws >= wcap + extra then
    local opens = wb + wlen + ${windowMargin}
    -- A closure past ${maxPause} ms from now is none the proxy learns (its
    -- windows are the upstream's, a minute long in practice) but one
    -- written into Redis by hand, that would hold the group for ever: the
    -- window is forgotten.
    if opens > now + ${maxPause} then
      redis.call('HDEL', key, 'wb', 'ws', 'wa', 'pb', 'ps', 'pa', 'wo', 'wp', 'wcap', 'wlen', 'wfull', 'wclimb')
      return 0, false
    end
    return opens, true
  end
  return 0, true
end
-- countDispatch counts a dispatch at now (last), and returns the group's
-- dispatches in the second up to now, every replica's: what one process's
-- own count would say it is sending.
local function countDispatch(key, now)
  local m = redis.call('HMGET', key, 'ms', 'mc', 'mp')
  local sec, mc, mp = math.floor(now / 1000), num(m[2], 0), num(m[3], 0)
  if num(m[1], 0) ~= sec then
    if num(m[1], 0) == sec - 1 then mp = mc else mp = 0 end
    mc = 0
  end
  mc = mc + 1
  redis.call('HSET', key, 'ms', sec, 'mc', mc, 'mp', mp, 'last', now)
  return math.floor(mc + mp * (1 - (now % 1000) / 1000))
end
`

// admitScript: KEYS state, leases, waiting, climits, gsent (the lanes'
// group's count of dispatches, every limit of it); args admitArgs.
// Returns admitWire: answered is 1 when a replica learned from an answer
// in the last minute; rates are per second × replyScale; rsyn is 1 when
// the request pace was learned from refusals; acc is when some replica
// last had an answer the upstream accepted (0: none); rn counts the
// refusals every replica learned from (learnScript); lastsec is the
// group's dispatches in the last second, all replicas (0 unless
// admitted); apn counts the limits some replica took out of the trial
// this state paces (apartScript).
var admitScript = newScript(admitArgs{}, lib, admitLib, `
local now, cost, alone = clock(args.now), tonumber(args.cost), args.alone == '1'
local lease, ttl, replica, since, keyttl = args.lease, tonumber(args.ttl), args.replica, now - tonumber(args.age), tonumber(args.keyttl)
local f = redis.call('HMGET', KEYS[1], 'paused', 'acc', 'rn', 'an', 'apn')
local paused, acc, rn, an, apn = num(f[1], 0), num(f[2], 0), num(f[3], 0), num(f[4], 0), num(f[5], 0)
-- A pause read from the hash ends ${maxPause} ms from now at the latest,
-- and is written back so: anyone who can write to Redis could set one
-- that never ends.
if paused > now + ${maxPause} then
  paused = now + ${maxPause}
  redis.call('HSET', KEYS[1], 'paused', paused)
end
local climit, answered = concurrencyLimit(KEYS[4], now, tonumber(args.defaultClimit), tonumber(args.maxClimit))
for _, l in ipairs(args.returned) do redis.call('ZREM', KEYS[2], l) end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local out = redis.call('ZCARD', KEYS[2])
local r, t = budget(KEYS[1], 'r_', now), budget(KEYS[1], 't_', now)
local lastsec, gsent = 0, 0
local function reply(ok, at, rsent, tsent, room, paced, pausedUntil)
  local rrate, tsize, trate, rsize, rsyn = math.floor(r.rate * ${replyScale}), math.floor(t.size), math.floor(t.rate * ${replyScale}), math.floor(r.size), r.syn
  return ${admitReply}
end
if paused > now and args.knock ~= '1' then return reply(0, paused, 0, 0, 0, 0, paused) end
local opens, fleetKnown = fleetWindow(KEYS[1], now, r.sent)
if opens > 0 then return reply(0, opens, 0, 0, 0, 0, opens) end
local windowed = args.windowed == '1' or fleetKnown
-- Until some replica has learned from an answer, one replica's first
-- request goes alone, fleet-wide, for at most the first-answer window
-- (1s): N replicas starting together do not each send theirs blind.
if alone and answered == 0 and r.known ~= 1 and t.known ~= 1 then
  local first = num(redis.call('HGET', KEYS[1], 'first'), 0)
  if now - first > 60000 then
    redis.call('HSET', KEYS[1], 'first', now)
  elseif now - first < ${firstAnswerWindow} and out > 0 then
    return reply(0, 0, 0, 0, 0, 0, 0)
  end
end
local next = spread(KEYS[1], now, tonumber(args.slowStart), climit, r.known == 1 or t.known == 1, rn)
if next > 0 then return reply(0, next, 0, 0, 0, 0, 0) end
local older, oldercost = olderWaiters(KEYS[3], replica, since, now, cost, keyttl)
if out + older >= climit then return reply(0, 0, 0, 0, 0, 0, 0) end
local rok, rat = true, 0
if not windowed then rok, rat = admit(r, now, 1 + older) end
local tok, tat = admit(t, now, cost + oldercost)
if not (rok and tok) then
  -- A budget that waits for a time goes first; only when none does can a
  -- lone request go to learn what the budgets that wait for an answer hold.
  local at = math.max(rat, tat)
  if not (at == 0 and alone) then return reply(0, at, 0, 0, 0, 0, 0) end
end
local room, paced = 0, 0
if rok and tok and (r.known == 1 and r.syn == 0 or t.known == 1) then room = 1 end
if rok and tok and r.syn == 1 then paced = 1 end
if r.known == 1 and not windowed then r.avail = r.avail - charge(r, 1) end
if t.known == 1 then t.avail = t.avail - charge(t, cost) end
r.sent, t.sent = r.sent + 1, t.sent + cost
lastsec = countDispatch(KEYS[1], now)
gsent = redis.call('INCR', KEYS[5])
redis.call('PEXPIRE', KEYS[5], keyttl)
save(KEYS[1], 'r_', r)
save(KEYS[1], 't_', t)
redis.call('ZADD', KEYS[2], now + ttl, lease)
redis.call('HDEL', KEYS[3], replica)
redis.call('PEXPIRE', KEYS[1], keyttl)
redis.call('PEXPIRE', KEYS[2], math.max(keyttl, ttl))
redis.call('PEXPIRE', KEYS[4], keyttl)
return reply(1, 0, r.sent, t.sent, room, paced, 0)
`)

// learnLib holds the learn script's steps: a budget's figures from one
// replica's answer, and the counts by level.
const learnLib = `
-- learn merges the budget of prefix p that the replica sent (given, a
-- budgetArgs) into the state (see learnScript).
local function learn(p, given, now)
  local known = tonumber(given.known)
  if known ~= 1 then return end
  local b = budget(KEYS[1], p, now)
  local syn, size, rate = tonumber(given.syn), tonumber(given.size), tonumber(given.rate)
  if b.known == 1 and b.syn == syn and (size > b.size or rate > b.rate) then
    local low = num(redis.call('HGET', KEYS[1], p..'low'), 0)
    -- A pace from a replica that found the bound is a concurrency limit
    -- is loose by design (the limit holds the group): it may replace a
    -- lower guess made before the bound was known.
    local may = now - low > 60000 or syn == 1 and args.concurrencyBound == '1'
    if not may and syn == 1 then
      local holder = redis.call('GET', KEYS[4])
      if holder == args.replica then
        redis.call('PEXPIRE', KEYS[4], 10000)
        may = true
      elseif not holder then
        may = redis.call('SET', KEYS[4], args.replica, 'NX', 'PX', 10000) ~= false
      end
    end
    if not may then
      size = math.min(size, b.size)
      -- A pace learned from refusals is the lowest too; a refill read
      -- from headers is each replica's own estimate (from counts its
      -- peers move too): the latest stands.
      if syn == 1 then rate = math.min(rate, b.rate) end
    end
  end
  if b.known == 1 and b.syn == 1 and syn == 1 and args.refusal ~= '1' then
    -- A pace learned from refusals is lowered by a refusal only: a
    -- replica whose own figure is lower without one (learned before a
    -- raise, or from its share of the evidence) does not pull the fleet
    -- down.
    size, rate = math.max(size, b.size), math.max(rate, b.rate)
  end
  if b.known ~= 1 or b.syn ~= syn or size <= b.size and rate <= b.rate then
    redis.call('HSET', KEYS[1], p..'low', now)
  end
  b.known, b.syn, b.size, b.rate = 1, syn, size, rate
  local mode, value, mark = tonumber(given.mode), tonumber(given.value), tonumber(given.mark)
  if redis.call('HEXISTS', KEYS[1], p..'avail') == 0 then b.avail = b.size end
  if mode == ${leftCounted} then
    b.avail = value - math.max(0, b.sent - mark)
    -- The upstream's count now holds what every request sent up to mark
    -- really used: settling one of them must not credit it back again.
    redis.call('HSET', KEYS[1], p..'seen', tostring(math.max(num(redis.call('HGET', KEYS[1], p..'seen'), 0), mark)))
  elseif mode == ${leftCapped} then b.avail = math.min(b.avail, value) end
  b.avail = math.min(b.avail, b.size)
  redis.call('HSET', KEYS[1], p..'known', 1, p..'syn', b.syn, p..'size', tostring(b.size), p..'rate', tostring(b.rate))
  save(KEYS[1], p, b)
end
-- windowLength is the fleet window's length after a boundary seen at b,
-- and the boundary it is counted from (see noteWindow): wlen the length
-- known (0: none), wo the boundary it was counted from, wp the boundary
-- seen before b. A boundary is read late by the time its learning took
-- to reach Redis, so a length read between two neighbours may be short
-- by as much, and a window predicted from it would open that much early,
-- into the one ending, each window further: the length is read over
-- every window since wo instead, as long as the readings agree with it.
-- Two neighbours that saw a length shorter by more than a
-- ${lengthSlack}th (a first reading over two windows) replace it.
local function windowLength(b, wlen, wo, wp)
  if wp <= 0 then return wlen, wo end
  local seen = b - wp
  if seen > ${minSplit} and (wlen == 0 or seen < wlen - wlen / ${lengthSlack}) then return seen, wp end
  if wlen > 0 and wo > 0 then
    local n = math.floor((2 * (b - wo) + wlen) / (2 * wlen))
    if n >= 1 and math.abs((b - wo) / n - wlen) <= wlen / ${lengthSlack} then
      return math.floor((b - wo) / n), wo
    end
  end
  return wlen, b
end
-- noteWindow learns the fleet's fixed window (see fleetWindow) from an
-- answer of kind whose request went when the group had sent mark
-- requests; bound, on a refusal in a closure whose stated boundary the
-- replica knows to the millisecond, is the time to it (ms). A request
-- went in the window whose count of requests sent at its start it
-- passed. Each window counts the answers it had admitted (wa, and pa for
-- the window before, whose answers may come late): the allowance is the
-- count of the last window a refusal ended, raised by any window that
-- admitted more (a probe that went through), as one process learns it.
-- A refusal late in the fleet's window, or at a boundary past half the
-- length after its start, ends the window there (see windowLength for
-- the length). One early in the window, at a boundary sooner, says the
-- window began later than the fleet took it to: its start moves there.
local function noteWindow(key, now, bound, mark, kind)
  if mark <= 0 or kind == ${answerUncounted} then return end
  local f = redis.call('HMGET', key, 'wb', 'ws', 'wa', 'pb', 'ps', 'pa', 'wcap', 'wlen', 'wclimb', 'r_sent', 'wo', 'wp')
  local wb, ws, wa, pb, ps, pa = num(f[1], 0), num(f[2], 0), num(f[3], 0), num(f[4], 0), num(f[5], 0), num(f[6], 0)
  local wcap, wlen, climb, sent, wo, wp = num(f[7], 0), num(f[8], 0), num(f[9], 0), num(f[10], 0), num(f[11], 0), num(f[12], 0)
  if kind == ${answerAdmitted} then
    if mark > ws then
      local n = redis.call('HINCRBY', key, 'wa', 1)
      if wcap > 0 and n > wcap then -- a probe went through
        redis.call('HSET', key, 'wcap', n, 'wclimb', math.min(climb + 1, ${maxClimb}))
      end
    elseif mark > ps then
      local n = redis.call('HINCRBY', key, 'pa', 1)
      if n > wcap then redis.call('HSET', key, 'wcap', n) end -- an answer come late
    end
    return
  end
  if bound <= 0 or mark <= ws then return end
  local b, place = now + bound, mark - ws
  local d = b - wb
  if d > ${minSplit} and (wlen == 0 or 2 * d > wlen or 2 * place > wcap) then
    if wcap == 0 or wa < wcap then climb = 0 end -- a probe refused, or fewer admitted
    wlen, wo = windowLength(b, wlen, wo, wp)
    redis.call('HSET', key, 'pb', wb, 'ps', ws, 'pa', wa, 'wb', b, 'ws', sent, 'wa', 0, 'wcap', math.max(wa, 1),
      'wlen', wlen, 'wclimb', climb, 'wo', wo, 'wp', b)
    redis.call('HINCRBY', key, 'wfull', 1)
  elseif b > wb then
    redis.call('HSET', key, 'wb', b, 'ws', sent, 'wa', 0, 'wp', b)
  elseif b < wb and wb - b < ${minSplit} then
    -- The same boundary, read sooner: nearer it.
    redis.call('HSET', key, 'wb', b)
    if wp == wb then redis.call('HSET', key, 'wp', b) end
    if wo == wb then redis.call('HSET', key, 'wo', b) end
  end
end
-- countLevel counts an answer at level in flight (of kind refused or
-- admitted; none uncounted), halving every count past levelMemory as one
-- process does.
local function countLevel(key, level, kind)
  if level > 0 and kind ~= ${answerUncounted} then
    redis.call('HINCRBYFLOAT', key, (kind == ${answerRefused} and 'r' or 'a') .. level, 1)
    if redis.call('HINCRBY', key, 'n', 1) > ${levelMemory} then
      local all = redis.call('HGETALL', key)
      for i = 1, #all, 2 do
        if all[i] ~= 'n' then redis.call('HSET', key, all[i], tostring(tonumber(all[i+1]) / 2)) end
      end
      redis.call('HSET', key, 'n', ${levelMemory} / 2)
    end
  end
end
`

// learnScript: KEYS state, leases, climits, raise, levels; args
// learnArgs. An accepted answer's time to its headers (args.reply) is
// kept, the first one, as reply (see spread). The levels hash counts
// every replica's answers by level (a<level>, r<level>), halved past
// levelMemory as in one process. Returns learnWire and then, per level
// counted, a levelWire.
// A window's size is the lowest a replica holds: a replica may lower it
// at any time, and raise it only once nobody has held the lower figure
// for a minute (low: when it was last affirmed), or, for a pace learned
// from refusals, while it holds the raise lease: one replica at a time
// probes above the shared pace. Such a pace's rate follows the same rule,
// and it is lowered only with a refusal; a refill rate read from headers
// is the latest a replica wrote.
// The reply's joined is the state's jn: the name of the limit some
// replica found this one shares (shared.PutJoined).
// mode 1 sets what is left from an answer's remaining count (value), less
// what was sent after the answer's dispatch (sent at dispatch: mark);
// mode 2 caps it at value; mode 0 leaves it.
var learnScript = newScript(learnArgs{}, lib, learnLib, `
local now, keyttl, pause = clock(args.now), tonumber(args.keyttl), tonumber(args.pause)
local paused = math.min(num(redis.call('HGET', KEYS[1], 'paused'), 0), now + ${maxPause})
if pause > 0 then paused = math.max(paused, now + pause) end
redis.call('HSET', KEYS[1], 'paused', paused)
redis.call('HSET', KEYS[3], args.replica, args.climit .. ':' .. now .. ':' .. args.lowered)
redis.call('PEXPIRE', KEYS[3], keyttl)
learn('r_', args.req, now)
learn('t_', args.tok, now)
local kind = tonumber(args.kind or '${answerUncounted}')
noteWindow(KEYS[1], now, tonumber(args.bound), tonumber(args.sent), kind)
redis.call('PEXPIRE', KEYS[1], keyttl)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local level = tonumber(args.level or '0')
if kind == ${answerAdmitted} then redis.call('HSET', KEYS[1], 'acc', now) redis.call('HINCRBY', KEYS[1], 'an', 1) end
if kind == ${answerAdmitted} and num(tonumber(args.reply), 0) > 0 then redis.call('HSETNX', KEYS[1], 'reply', args.reply) end
if kind == ${answerRefused} then redis.call('HINCRBY', KEYS[1], 'rn', 1) end
countLevel(KEYS[5], level, kind)
redis.call('PEXPIRE', KEYS[5], keyttl)
local out, raiser = redis.call('ZCARD', KEYS[2]), redis.call('GET', KEYS[4]) == args.replica and 1 or 0
local joined = num(redis.call('HGET', KEYS[1], 'jn'), 0)
local reply = ${learnReply}
local counts = redis.call('HGETALL', KEYS[5])
for i = 1, #counts, 2 do
  local k, l = string.match(counts[i], '^([ar])(%d+)$')
  if k then
    local lvl, refused, count = tonumber(l), k == 'r' and 1 or 0, math.floor(tonumber(counts[i+1]) * ${replyScale})
    for _, v in ipairs(${levelCount}) do table.insert(reply, v) end
  end
end
return reply
`)

// giveBackScript: KEYS state; args giveBackArgs: adds back to what is
// left, never above the window, what the requests and tokens were charged
// (a refund), less the tokens used (a settle: tokens is its estimate). A
// positive mark is a settle's: the tokens' running total when its request
// was sent; when an answer's count already covered that dispatch
// (t_seen), the tokens are not given back. Returns 1, which nothing reads.
var giveBackScript = newScript(giveBackArgs{}, lib, `
local now, mark = clock(args.now), tonumber(args.mark or '0')
for _, x in ipairs({{'r_', tonumber(args.requests), 0}, {'t_', tonumber(args.tokens), tonumber(args.used or '0')}}) do
  local b = budget(KEYS[1], x[1], now)
  local counted = mark > 0 and num(redis.call('HGET', KEYS[1], x[1]..'seen'), 0) >= mark
  if b.known == 1 and (x[2] ~= 0 or x[3] ~= 0) and not counted then
    local back = x[2]
    if back > 0 then back = charge(b, back) end -- never more than was charged
    back = back - x[3]
    b.avail = math.min(b.size, b.avail + back)
    save(KEYS[1], x[1], b)
  end
end
return 1
`)

// apartScript: KEYS state (a trial's); args apartArgs. Notes that a
// replica judged the limit named member apart from the trial (its name
// once, in the field ap, and apn counting the names) and returns the
// names, each ended by a comma.
var apartScript = newScript(apartArgs{}, `
local ap = redis.call('HGET', KEYS[1], 'ap') or ''
if not string.find(ap, args.member .. ',', 1, true) then
  ap = ap .. args.member .. ','
  redis.call('HSET', KEYS[1], 'ap', ap)
  redis.call('HINCRBY', KEYS[1], 'apn', 1)
  redis.call('PEXPIRE', KEYS[1], tonumber(args.keyttl))
end
return ap
`)

// forgetScript: KEYS state, climits, raise, levels. An operator cleared
// what the group learned (shared.Forget): the budgets' figures, the
// pause, the first request's and the first answer's times and the
// refusals' count leave the state, and the replicas' concurrency limits,
// the raise lease and the counts by level go. The running totals (sent,
// seen), the dispatch counts and the leases (the permits out) stay.
// Returns 1, which nothing reads.
var forgetScript = newScript(struct{}{}, `
redis.call('HDEL', KEYS[1], 'paused', 'first', 'acc', 'reply', 'rn', 'wb', 'ws', 'wa', 'pb', 'ps', 'pa', 'wo', 'wp', 'wcap', 'wlen', 'wfull', 'wclimb')
for _, p in ipairs({'r_', 't_'}) do
  redis.call('HDEL', KEYS[1], p..'known', p..'syn', p..'size', p..'rate', p..'avail', p..'at', p..'low')
end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
return 1
`)

// heartbeatScript: KEYS replicas, busy; args heartbeatArgs. Notes the
// replica alive (and busy) now and returns heartbeatWire: how many
// replicas were alive in the last minute and how many others were busy
// within the window.
var heartbeatScript = newScript(heartbeatArgs{}, lib, `
local now = clock(args.now)
redis.call('ZADD', KEYS[1], now, args.replica)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - 60000)
redis.call('PEXPIRE', KEYS[1], 120000)
if args.busy == '1' then redis.call('ZADD', KEYS[2], now, args.replica) end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(args.window))
redis.call('PEXPIRE', KEYS[2], 120000)
local busy = redis.call('ZCARD', KEYS[2])
if redis.call('ZSCORE', KEYS[2], args.replica) then busy = busy - 1 end
local alive = redis.call('ZCARD', KEYS[1])
return ${heartbeatReply}
`)

// script is a Lua script, the text it runs and the text that was
// rendered from.
type script struct {
	*redis.Script
	text, src string
}

// newScript is the script of the parts of its source, one after the
// other, which reads its ARGV, laid out as argv lays out args, from the
// table args (see wire.go), with each ${name} rendered (see render). A
// script's text is fixed when the package starts, so its SHA is too.
func newScript(args any, parts ...string) script {
	src := strings.Join(parts, "")
	text := argsPrologue(reflect.TypeOf(args)) + render(src)
	return script{redis.NewScript(text), text, src}
}

// Numbers the scripts share with Go. A script's text names one as
// ${name} and has it from these constants (see sharedNumbers), and those
// that the in-process state has too are its constants' values (lanequeue's
// and limit's, which TestScriptsHaveGosNumbers holds both to, or the Go
// bucket's, which a constant here is made of). The numbers a script writes
// as they are are its own: units (1000 ms in a second), steps, and
// timings no Go code has (listed, each with why, in luaLocal in
// scripts_test.go).
const (
	// firstAnswerWindow: until some replica learned from an answer, the
	// group's first request goes alone, fleet-wide, for at most this
	// long, as one process's does (lanequeue's firstAnswerWindow).
	firstAnswerWindow = time.Second
	// startSpread: see spread (limit's startSpread).
	startSpread = 2
	// levelMemory: the counts by level halve once they pass it
	// (limit's levelMemory). maxLevel is the highest level a reply's
	// counts may carry (limit's maxLevel).
	levelMemory = 512
	maxLevel    = 4096
	// maxWaitSeconds bounds one pacing wait (the Go bucket's MaxWait,
	// a day): a tiny rate asks again then.
	maxWaitSeconds = int64(bucket.MaxWait / time.Second)
	// maxPause bounds a pause, or a fixed window's closure, read from
	// Redis: it ends this long after it is read at the latest. A pause
	// is written as the state's "paused" field, which whoever can write
	// to Redis can set to any time; without a bound one write would hold
	// a group on every replica for ever. The pauses the proxy takes are
	// its retry waits, at most LLMPROXY_MAX_RETRY_AFTER (2m by default),
	// lengthened when one paid nothing, and a fixed window's closure, to
	// a boundary the upstream states (a minute's window, in practice):
	// an hour is past all of them. A longer one (an operator who set
	// LLMPROXY_MAX_RETRY_AFTER above an hour) still holds the replica
	// that took it for its whole length (its own pause, not read from
	// Redis); the others ask the upstream again after the hour.
	maxPause = time.Hour
	// replyScale: a reply carries a rate, or a count by level, as an
	// integer replyScale times it.
	replyScale = 1000
	// probeWindows, maxClimb: the fleet's window probes as one
	// process's does (limit's); minSplitMs (limit's minSplit) is the shortest span
	// a boundary is told apart from another by; lengthSlack: a length
	// read more than a lengthSlack-th over the known one saw windows go
	// by unseen (limit's, see noteWindow).
	probeWindows = 4
	maxClimb     = 2
	minSplitMs   = 20
	lengthSlack  = 8
	// windowMarginMs: the fleet takes a window it predicts to open this
	// many milliseconds late (see fleetWindow).
	windowMarginMs = 5
)

// sharedNumbers are the numbers a script's text names as ${name}.
var sharedNumbers = map[string]int64{
	"firstAnswerWindow": firstAnswerWindow.Milliseconds(),
	"startSpread":       startSpread,
	"levelMemory":       levelMemory,
	"maxWaitSeconds":    maxWaitSeconds,
	"maxPause":          maxPause.Milliseconds(),
	"replyScale":        replyScale,
	"probeWindows":      probeWindows,
	"maxClimb":          maxClimb,
	"minSplit":          minSplitMs,
	"lengthSlack":       lengthSlack,
	"windowMargin":      windowMarginMs,
	"leftCounted":       int64(leftCounted),
	"leftCapped":        int64(leftCapped),
	"answerUncounted":   int64(answerUncounted),
	"answerAdmitted":    int64(answerAdmitted),
	"answerRefused":     int64(answerRefused),
}

// replyLists are the Lua lists a script's text names as ${name} for the
// replies it makes (see wire.go).
var replyLists = map[string]string{
	"admitReply":     luaList(admitWire{}),
	"learnReply":     luaList(learnWire{}),
	"levelCount":     luaList(levelWire{}),
	"heartbeatReply": luaList(heartbeatWire{}),
}

var placeholder = regexp.MustCompile(`\$\{(\w+)\}`)

// render is src with each ${name} replaced by its reply list or shared
// number; a name with neither is a mistake in this package, found when
// it starts.
func render(src string) string {
	return placeholder.ReplaceAllStringFunc(src, func(m string) string {
		name := m[2 : len(m)-1]
		if l, ok := replyLists[name]; ok {
			return l
		}
		n, ok := sharedNumbers[name]
		if !ok {
			panic("redisstate: a script names " + m + ", which has no value")
		}
		return strconv.FormatInt(n, 10)
	})
}
