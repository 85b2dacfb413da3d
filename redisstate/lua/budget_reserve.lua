-- The budget reserve script: KEYS holds (every hold taken, scored by when
-- its Settle is no longer awaited), then each scope's spend hash and
-- holds set; args budgetReserveArgs (scopes: each scope's cap and TTL,
-- ms). Takes the hold under every scope if each capped scope's spent,
-- held and the amount stay within its cap. Returns budgetReserveWire:
-- ${reserveExhausted} and the first scope (1-based) whose spent and the
-- amount pass its cap, with its spent; else ${reserveFull} when the holds
-- under way leave no room now; else ${reserveTaken}, the hold taken under
-- every scope (or already held: a TryReserve retried takes it once).
local now, id, amount = clock(args.now), args.id, args.amount
local amt = tonumber(amount)
local n = #args.scopes / 2
local outcome, scope, spent = ${reserveTaken}, 0, 0
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if n == 0 then return ${budgetReserveReply} end
sweep(KEYS[2], KEYS[3], now)
if redis.call('ZSCORE', KEYS[3], id) then return ${budgetReserveReply} end
for i = 1, n do
  local s, e, cap = KEYS[2 * i], KEYS[2 * i + 1], tonumber(args.scopes[2 * i - 1])
  sweep(s, e, now)
  if cap > 0 then
    local f = redis.call('HMGET', s, 'spent', 'held')
    local sp, held = num(f[1], 0), num(f[2], 0)
    if sp + amt > cap then
      outcome, scope, spent = ${reserveExhausted}, i, sp
      return ${budgetReserveReply}
    end
    if sp + held + amt > cap then outcome = ${reserveFull} end
  end
end
if outcome == ${reserveFull} then return ${budgetReserveReply} end
local expires = now + tonumber(args.life)
for i = 1, n do
  local s, e = KEYS[2 * i], KEYS[2 * i + 1]
  redis.call('HSET', s, '#'..id, amount)
  redis.call('HINCRBY', s, 'held', amount)
  redis.call('ZADD', e, expires, id)
  keep(s, e, tonumber(args.scopes[2 * i]), now)
end
redis.call('ZADD', KEYS[1], expires + tonumber(args.late), id)
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIRE', KEYS[1], tonumber(last[2]) - now)
return ${budgetReserveReply}
