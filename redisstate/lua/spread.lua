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
-- The fleet's form of limit's Memory.spread (one first answer's time
-- for the mean of them all, the fleet's refusals for its own).
local function spread(key, now, on, climit, known, rn)
  if on == 0 or known or rn > 0 then return 0 end
  local f = redis.call('HMGET', key, 'reply', 'last')
  local gap = num(f[1], 0) / (${startSpread} * climit) -- under 1 ms: none on this clock
  local at = math.min(num(f[2], 0), now) + gap
  if gap >= 1 and now < at then return math.ceil(at) end
  return 0
end
