-- The budget spent script: KEYS a scope's spend hash and holds set; args
-- budgetSpentArgs. Releases the scope's expired holds and returns
-- budgetSpentWire: its spent and the sum of its live holds.
sweep(KEYS[1], KEYS[2], clock(args.now))
local f = redis.call('HMGET', KEYS[1], 'spent', 'held')
local spent, held = num(f[1], 0), num(f[2], 0)
return ${budgetSpentReply}
