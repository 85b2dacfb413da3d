-- The budget settle script: KEYS holds (every hold taken, scored by when
-- its Settle is no longer awaited), then each scope's spend hash and
-- holds set; args budgetSettleArgs (scopes: each scope's TTL, ms). Ends
-- the hold: releases it under each scope where it is still held (not
-- expired), and adds actual to each scope's spent. A hold settled
-- already, never taken, or expired more than args.late ms ago, is not
-- in holds: nothing of it is written. Returns budgetSettleWire.
local now, id = clock(args.now), args.id
local settled = 0
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZREM', KEYS[1], id) == 0 then return ${budgetSettleReply} end
settled = 1
for i = 1, #args.scopes do
  local s, e = KEYS[2 * i], KEYS[2 * i + 1]
  sweep(s, e, now)
  if redis.call('ZREM', e, id) == 1 then release(s, id) end
  redis.call('HINCRBY', s, 'spent', args.actual)
  keep(s, e, tonumber(args.scopes[i]), now)
end
return ${budgetSettleReply}
