-- The fleet's fixed window, over the state hash (see scripts.go): each
-- function here does for the fleet what the method of limit's windows of
-- its name does in one process. windows.extra mirrors its Go function
-- rule for rule; the others are the fleet's simpler form (a window here
-- is learned only from boundaries the upstream states, with no knocks).
local windows = {}

-- windows.extra is how many more than the allowance a probing window
-- sends: one, every ${probeWindows} windows (full counts those that ended
-- in a closure); after probes that admitted all they sent (climb in a
-- row), every window, twice as many as the last.
-- Mirrors limit's shape.extra.
function windows.extra(climb, full)
  if climb > 0 then return 2 ^ math.min(climb, ${maxClimb}) end
  if full % ${probeWindows} == ${probeWindows} - 1 then return 1 end
  return 0
end

-- windows.gate holds the group when the fleet sent its fixed window's
-- allowance, every replica's dispatches counted, as one process closes
-- its window once its own count reaches it: a replica that counted only
-- its own would send until a refusal came back, and the rest of the
-- fleet's burst with it would be refused. The window, its allowance and
-- its length are learned from refusals whose stated waits end at one
-- boundary (see windows.refused); a window past its length starts the next.
-- A probing window sends more (windows.extra), to find an allowance that
-- grew.
-- sent is the group's requests sent so far. Returns when the group may
-- send again (0: now), and whether the fleet knows the window: its
-- allowance then paces the group, not a pace learned from refusals (a
-- replica that never saw a closure of its own would keep one).
-- The fleet's form of limit's windows.gate.
function windows.gate(key, now, sent)
  local f = redis.call('HMGET', key, 'wb', 'ws', 'wcap', 'wlen', 'wfull', 'wclimb')
  local wb, ws, wcap, wlen, wfull, climb = num(f[1], 0), num(f[2], 0), num(f[3], 0), num(f[4], 0), num(f[5], 0), num(f[6], 0)
  if wcap <= 0 or wb <= 0 or wlen <= 0 or sent < ws then return 0, false end
  -- A boundary read from a refusal is late by the time its learning took
  -- to reach Redis, and a length from two of them is off by as much: the
  -- next window is taken to open ${windowMargin} ms late, as sending into
  -- the window that ends loses every request sent.
  if now >= wb + wlen + ${windowMargin} then
    local k = math.floor((now - wb) / wlen)
    local pb, ps, pa = 0, sent, 0
    if k == 1 then pb, ps, pa = wb, ws, num(redis.call('HGET', key, 'wa'), 0) end
    wb, ws, wfull = wb + k * wlen, sent, wfull + 1
    redis.call('HSET', key, 'wb', wb, 'ws', ws, 'wa', 0, 'pb', pb, 'ps', ps, 'pa', pa, 'wfull', wfull)
  end
  if sent - ws >= wcap + windows.extra(climb, wfull) then
    local opens = wb + wlen + ${windowMargin}
    -- A closure past ${maxPause} ms from now is none the proxy learns (its
    -- windows are the upstream's, a minute long in practice) but one
    -- written into Redis by hand, that would hold the group for ever: the
    -- window is forgotten.
    if opens > now + ${maxPause} then
      redis.call('HDEL', key, 'wb', 'ws', 'wa', 'pb', 'ps', 'pa', 'wo', 'wp', 'wcap', 'wlen', 'wfull', 'wclimb')
      return 0, false
    end
    return opens, true
  end
  return 0, true
end
-- windows.readLength is the fleet window's length after a boundary seen
-- at b, and the boundary it is counted from (see windows.refused): wlen the length
-- known (0: none), wo the boundary it was counted from, wp the boundary
-- seen before b. A boundary is read late by the time its learning took
-- to reach Redis, so a length read between two neighbours may be short
-- by as much, and a window predicted from it would open that much early,
-- into the one ending, each window further: the length is read over
-- every window since wo instead, as long as the readings agree with it.
-- Two neighbours that saw a length shorter by more than a
-- ${lengthSlack}th (a first reading over two windows) replace it.
-- The fleet's form of limit's shape.readLength.
function windows.readLength(b, wlen, wo, wp)
  if wp <= 0 then return wlen, wo end
  local seen = b - wp
  if seen > ${minSplit} and (wlen == 0 or seen < wlen - wlen / ${lengthSlack}) then return seen, wp end
  if wlen > 0 and wo > 0 then
    local n = math.floor((2 * (b - wo) + wlen) / (2 * wlen))
    if n >= 1 and math.abs((b - wo) / n - wlen) <= wlen / ${lengthSlack} then
      return math.floor((b - wo) / n), wo
    end
  end
  return wlen, b
end
-- windows.accepted and windows.refused learn the fleet's fixed window
-- (see windows.gate) from an answer whose request went when the group had
-- sent mark requests. A request went in the window whose count of
-- requests sent at its start it passed. Each window counts the answers
-- it had admitted (wa, and pa for the window before, whose answers may
-- come late): the allowance is the count of the last window a refusal
-- ended, raised by any window that admitted more (a probe that went
-- through), as one process learns it.
-- The fleet's form of limit's windows.accepted.
function windows.accepted(key, mark)
  local f = redis.call('HMGET', key, 'ws', 'ps', 'wcap', 'wclimb')
  local ws, ps, wcap, climb = num(f[1], 0), num(f[2], 0), num(f[3], 0), num(f[4], 0)
  if mark > ws then
    local n = redis.call('HINCRBY', key, 'wa', 1)
    if wcap > 0 and n > wcap then -- a probe went through
      redis.call('HSET', key, 'wcap', n, 'wclimb', math.min(climb + 1, ${maxClimb}))
    end
  elseif mark > ps then
    local n = redis.call('HINCRBY', key, 'pa', 1)
    if n > wcap then redis.call('HSET', key, 'wcap', n) end -- an answer come late
  end
end
-- bound, on a refusal in a closure whose stated boundary the replica
-- knows to the millisecond, is the time to it (ms). A refusal late in the
-- fleet's window, or at a boundary past half the length after its start,
-- ends the window there (see windows.readLength for the length). One
-- early in the window, at a boundary sooner, says the window began later
-- than the fleet took it to: its start moves there.
-- The fleet's form of limit's windows.refused.
function windows.refused(key, now, bound, mark)
  local f = redis.call('HMGET', key, 'wb', 'ws', 'wa', 'wcap', 'wlen', 'wclimb', 'r_sent', 'wo', 'wp')
  local wb, ws, wa, wcap, wlen = num(f[1], 0), num(f[2], 0), num(f[3], 0), num(f[4], 0), num(f[5], 0)
  local climb, sent, wo, wp = num(f[6], 0), num(f[7], 0), num(f[8], 0), num(f[9], 0)
  if bound <= 0 or mark <= ws then return end
  local b, place = now + bound, mark - ws
  local d = b - wb
  if d > ${minSplit} and (wlen == 0 or 2 * d > wlen or 2 * place > wcap) then
    if wcap == 0 or wa < wcap then climb = 0 end -- a probe refused, or fewer admitted
    wlen, wo = windows.readLength(b, wlen, wo, wp)
    redis.call('HSET', key, 'pb', wb, 'ps', ws, 'pa', wa, 'wb', b, 'ws', sent, 'wa', 0, 'wcap', math.max(wa, 1),
      'wlen', wlen, 'wclimb', climb, 'wo', wo, 'wp', b)
    redis.call('HINCRBY', key, 'wfull', 1)
  elseif b > wb then
    redis.call('HSET', key, 'wb', b, 'ws', sent, 'wa', 0, 'wp', b)
  elseif b < wb and wb - b < ${minSplit} then
    -- The same boundary, read sooner: nearer it.
    redis.call('HSET', key, 'wb', b)
    if wp == wb then redis.call('HSET', key, 'wp', b) end
    if wo == wb then redis.call('HSET', key, 'wo', b) end
  end
end
