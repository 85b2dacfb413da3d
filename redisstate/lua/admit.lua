-- The admit script: KEYS state, leases, waiting, climits, gsent (the lanes'
-- group's count of dispatches, every limit of it); args admitArgs.
-- Returns admitWire: answered is 1 when a replica learned from an answer
-- in the last minute; rates are per second × replyScale; rsyn is 1 when
-- the request pace was learned from refusals; acc is when some replica
-- last had an answer the upstream accepted (0: none); rn counts the
-- refusals every replica learned from (learn.lua); lastsec is the
-- group's dispatches in the last second, all replicas (0 unless
-- admitted); apn counts the limits some replica took out of the trial
-- this state paces (apart.lua).

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
local r, t = refill(KEYS[1], 'r_', now), refill(KEYS[1], 't_', now)
local lastsec, gsent = 0, 0
local function reply(ok, at, rsent, tsent, room, paced, pausedUntil)
  local rrate, tsize, trate, rsize, rsyn = math.floor(r.rate * ${replyScale}), math.floor(t.size), math.floor(t.rate * ${replyScale}), math.floor(r.size), r.syn
  return ${admitReply}
end
if paused > now and args.knock ~= '1' then return reply(0, paused, 0, 0, 0, 0, paused) end
local opens, fleetKnown = windows.gate(KEYS[1], now, r.sent)
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
