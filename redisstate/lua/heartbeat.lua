-- The heartbeat script: KEYS replicas, busy; args heartbeatArgs. Notes the
-- replica alive (and busy) now and returns heartbeatWire: how many
-- replicas were alive in the last minute and how many others were busy
-- within the window.
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
