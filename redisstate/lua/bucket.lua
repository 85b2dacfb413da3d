-- A budget's arithmetic, the Go bucket's (internal/bucket) on the state
-- hash: each function here that mirrors one of the Go bucket's says so,
-- and the Go function names it back; the token-bucket cases
-- (limit/testdata/bucket_cases.json) run both.
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
-- refill is the budget of prefix p (r_ requests, t_ tokens) brought up
-- to now: what its rate added since at, never above its size.
-- Mirrors internal/bucket's Bucket.Refill.
local function refill(key, p, now)
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
-- charge is what a cost takes from the budget: all of it, but never more
-- than its size when the size is stated.
-- Mirrors internal/bucket's Bucket.charge.
local function charge(b, cost)
  if b.size > 0 then return math.min(cost, b.size) end
  return cost
end
-- admit: ok, and when not, the time to ask again (0: an answer must tell).
-- Mirrors internal/bucket's Bucket.Admit.
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
