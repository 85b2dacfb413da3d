-- The spend ledger's functions (budget_reserve.lua, budget_settle.lua,
-- budget_spent.lua; see budget.go). A scope (an account) is two keys:
-- its spend hash s (spent: what it spent; held: the sum of its live
-- holds; '#'..id: each live hold's amount) and its holds set e (hold id,
-- scored by its expiry, ms on the script's clock). Amounts are integers
-- (nano-dollars) sent as decimal strings: HINCRBY adds them exactly;
-- comparisons read them as Lua numbers, exact to 2^53.

-- negated is the decimal string a with its sign turned.
local function negated(a)
  if string.sub(a, 1, 1) == '-' then return string.sub(a, 2) end
  return '-'..a
end
-- release takes the hold id's amount off the scope's held.
local function release(s, id)
  local a = redis.call('HGET', s, '#'..id)
  if a then
    redis.call('HDEL', s, '#'..id)
    if a ~= '0' then redis.call('HINCRBY', s, 'held', negated(a)) end
  end
end
-- sweep releases the scope's holds expired at now: their replica never
-- settled them (it died, or lost Redis).
local function sweep(s, e, now)
  local gone = redis.call('ZRANGEBYSCORE', e, '-inf', now)
  if #gone == 0 then return end
  for _, id in ipairs(gone) do release(s, id) end
  redis.call('ZREMRANGEBYSCORE', e, '-inf', now)
end
-- keep has the scope's keys live for ttl ms (and at least until its
-- latest hold expires); ttl 0: for ever.
local function keep(s, e, ttl, now)
  if ttl <= 0 then
    redis.call('PERSIST', s)
    redis.call('PERSIST', e)
    return
  end
  local last = redis.call('ZRANGE', e, -1, -1, 'WITHSCORES')
  if last[2] then ttl = math.max(ttl, tonumber(last[2]) - now) end
  redis.call('PEXPIRE', s, ttl)
  redis.call('PEXPIRE', e, ttl)
end
