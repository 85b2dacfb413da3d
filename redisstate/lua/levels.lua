-- The fleet's counts of answers by the number in flight they went at,
-- kept as one process keeps its own: the function here mirrors the method
-- of limit's learner of its name, over the levels hash (see scripts.go).
local learner = {}

-- learner.answered counts an answer at level in flight (of kind refused
-- or admitted; none uncounted), halving every count past levelMemory as
-- one process does.
-- Mirrors limit's learner.answered.
function learner.answered(key, level, kind)
  if level > 0 and kind ~= ${answerUncounted} then
    redis.call('HINCRBYFLOAT', key, (kind == ${answerRefused} and 'r' or 'a') .. level, 1)
    if redis.call('HINCRBY', key, 'n', 1) > ${levelMemory} then
      local all = redis.call('HGETALL', key)
      for i = 1, #all, 2 do
        if all[i] ~= 'n' then redis.call('HSET', key, all[i], tostring(tonumber(all[i+1]) / 2)) end
      end
      redis.call('HSET', key, 'n', ${levelMemory} / 2)
    end
  end
end
