-- The learn script: KEYS state, leases, climits, raise, levels; args
-- learnArgs. An accepted answer's time to its headers (args.reply) is
-- kept, the first one, as reply (see spread). The levels hash counts
-- every replica's answers by level (a<level>, r<level>), halved past
-- levelMemory as in one process. Returns learnWire and then, per level
-- counted, a levelWire.
-- A window's size is the lowest a replica holds: a replica may lower it
-- at any time, and raise it only once nobody has held the lower figure
-- for a minute (low: when it was last affirmed), or, for a pace learned
-- from refusals, while it holds the raise lease: one replica at a time
-- probes above the shared pace. Such a pace's rate follows the same rule,
-- and it is lowered only with a refusal; a refill rate read from headers
-- is the latest a replica wrote.
-- The reply's joined is the state's jn: the name of the limit some
-- replica found this one shares (shared.PutJoined).
-- mode 1 sets what is left from an answer's remaining count (value), less
-- what was sent after the answer's dispatch (sent at dispatch: mark);
-- mode 2 caps it at value; mode 0 leaves it.

-- learn merges the budget of prefix p that the replica sent (given, a
-- budgetArgs) into the state (see the head of this file).
local function learn(p, given, now)
  local known = tonumber(given.known)
  if known ~= 1 then return end
  local b = refill(KEYS[1], p, now)
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
local now, keyttl, pause = clock(args.now), tonumber(args.keyttl), tonumber(args.pause)
local paused = math.min(num(redis.call('HGET', KEYS[1], 'paused'), 0), now + ${maxPause})
if pause > 0 then paused = math.max(paused, now + pause) end
redis.call('HSET', KEYS[1], 'paused', paused)
redis.call('HSET', KEYS[3], args.replica, args.climit .. ':' .. now .. ':' .. args.lowered)
redis.call('PEXPIRE', KEYS[3], keyttl)
learn('r_', args.req, now)
learn('t_', args.tok, now)
local kind = tonumber(args.kind or '${answerUncounted}')
local mark = tonumber(args.sent)
if mark > 0 and kind == ${answerAdmitted} then windows.accepted(KEYS[1], mark) end
if mark > 0 and kind == ${answerRefused} then windows.refused(KEYS[1], now, tonumber(args.bound), mark) end
redis.call('PEXPIRE', KEYS[1], keyttl)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local level = tonumber(args.level or '0')
if kind == ${answerAdmitted} then redis.call('HSET', KEYS[1], 'acc', now) redis.call('HINCRBY', KEYS[1], 'an', 1) end
if kind == ${answerAdmitted} and num(tonumber(args.reply), 0) > 0 then redis.call('HSETNX', KEYS[1], 'reply', args.reply) end
if kind == ${answerRefused} then redis.call('HINCRBY', KEYS[1], 'rn', 1) end
learner.answered(KEYS[5], level, kind)
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
