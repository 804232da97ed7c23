-- One admission on a key's bucketed window, decided and recorded at once.
--
-- KEYS[1]  the key's buckets: a hash from bucket start (ms) to passes
-- KEYS[2]  the key's shared limit, when one was set (a string holding a number)
-- ARGV[1]  the caller's limit, used when KEYS[2] holds none
-- ARGV[2]  passes asked for (n)
-- ARGV[3]  bucket length in ms (interval / sample_count)
-- ARGV[4]  sample_count
-- ARGV[5]  1 when strict (count the bucket that has just left the window), else 0
-- ARGV[6]  the time in ms, or '' to read the server's clock (TIME)
-- ARGV[7]  expiry of KEYS[1] in ms
-- ARGV[8]  expiry of KEYS[2] in ms, renewed when it is read
--
-- Returns {passed (1 or 0), passes in the window, ms until n could pass
-- (0 when passed, -1 when never), the limit applied}.

local limit = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local bucket = tonumber(ARGV[3])
local samples = tonumber(ARGV[4])
local span = samples + tonumber(ARGV[5])

local now
if ARGV[6] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[6])
end

local shared = redis.call('GET', KEYS[2])
if shared then
  local value = tonumber(shared)
  if value and value >= 0 then
    limit = math.floor(value)
  end
  redis.call('PEXPIRE', KEYS[2], ARGV[8])
end

local start = now - now % bucket
-- The oldest bucket admission counts, and the oldest the window reports.
local oldest = start - (span - 1) * bucket
local first = start - (samples - 1) * bucket

local counted, in_window = 0, 0
local live = {}
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields, 2 do
  local at = tonumber(fields[i])
  local passes = tonumber(fields[i + 1])
  if at == nil or passes == nil or at < oldest then
    -- Out of the window, or not written by this script: dropped.
    redis.call('HDEL', KEYS[1], fields[i])
  else
    counted = counted + passes
    if at >= first then
      in_window = in_window + passes
    end
    live[#live + 1] = { at, passes }
  end
end

if counted + n <= limit then
  redis.call('HINCRBY', KEYS[1], start, n)
  redis.call('PEXPIRE', KEYS[1], ARGV[7])
  return { 1, in_window + n, 0, limit }
end

-- Blocked: the wait until enough passes have left the counted buckets.
local wait = -1
if n <= limit then
  table.sort(live, function(a, b) return a[1] < b[1] end)
  local need = counted + n - limit
  local freed = 0
  for _, b in ipairs(live) do
    freed = freed + b[2]
    if freed >= need then
      wait = b[1] + span * bucket - now
      break
    end
  end
end
return { 0, in_window, wait, limit }
