-- The give-back script: KEYS state; args giveBackArgs: adds back to what is
-- left, never above the window, what the requests and tokens were charged
-- (a refund), less the tokens used (a settle: tokens is its estimate). A
-- positive mark is a settle's: the tokens' running total when its request
-- was sent; when an answer's count already covered that dispatch
-- (t_seen), the tokens are not given back. Returns 1, which nothing reads.
local now, mark = clock(args.now), tonumber(args.mark or '0')
for _, x in ipairs({{'r_', tonumber(args.requests), 0}, {'t_', tonumber(args.tokens), tonumber(args.used or '0')}}) do
  local b = refill(KEYS[1], x[1], now)
  local counted = mark > 0 and num(redis.call('HGET', KEYS[1], x[1]..'seen'), 0) >= mark
  if b.known == 1 and (x[2] ~= 0 or x[3] ~= 0) and not counted then
    local back = x[2]
    if back > 0 then back = charge(b, back) end -- never more than was charged
    back = back - x[3]
    b.avail = math.min(b.size, b.avail + back)
    save(KEYS[1], x[1], b)
  end
end
return 1
