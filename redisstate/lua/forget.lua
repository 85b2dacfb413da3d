-- The forget script: KEYS state, climits, raise, levels. An operator cleared
-- what the group learned (shared.Forget): the budgets' figures, the
-- pause, the first request's and the first answer's times and the
-- refusals' count leave the state, and the replicas' concurrency limits,
-- the raise lease and the counts by level go. The running totals (sent,
-- seen), the dispatch counts and the leases (the permits out) stay.
-- Returns 1, which nothing reads.
redis.call('HDEL', KEYS[1], 'paused', 'first', 'acc', 'reply', 'rn', 'wb', 'ws', 'wa', 'pb', 'ps', 'pa', 'wo', 'wp', 'wcap', 'wlen', 'wfull', 'wclimb')
for _, p in ipairs({'r_', 't_'}) do
  redis.call('HDEL', KEYS[1], p..'known', p..'syn', p..'size', p..'rate', p..'avail', p..'at', p..'low')
end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
return 1
