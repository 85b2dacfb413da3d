-- The apart script: KEYS state (a trial's); args apartArgs. Notes that a
-- replica judged the limit named member apart from the trial (its name
-- once, in the field ap, and apn counting the names) and returns the
-- names, each ended by a comma.
local ap = redis.call('HGET', KEYS[1], 'ap') or ''
if not string.find(ap, args.member .. ',', 1, true) then
  ap = ap .. args.member .. ','
  redis.call('HSET', KEYS[1], 'ap', ap)
  redis.call('HINCRBY', KEYS[1], 'apn', 1)
  redis.call('PEXPIRE', KEYS[1], tonumber(args.keyttl))
end
return ap
