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
-- ARGV[9]  the server's eviction policy: '0' not asked for; '1' report it;
--          '2' report it, and decide nothing when the server evicts keys
-- ARGV[10] passes wanted, n or more (optional, default n): a lease. When n
--          fit, up to this many are granted and recorded at once, cut to
--          the room left under the limit, to limit / (span * ARGV[13]),
--          and to what ARGV[11] arrivals per ARGV[14] µs bring in the time
--          left in the bucket less ARGV[12] µs; at least n.
-- ARGV[11] the caller's arrivals for the key per ARGV[14] µs
-- ARGV[12] µs at the end of the bucket in which a lease cannot be spent
-- ARGV[13] the lease share: a lease is at most limit / (span * share)
-- ARGV[14] the rate tick in µs
-- ARGV[15] of the passes wanted, those for requests already waiting: not
--          cut to the rate nor to the lease cap, only to the room left
--          (and to n when the bucket ends within ARGV[12] µs)
--
-- Further windows (the layer's `limit_per`): KEYS[3], KEYS[4], ... are
-- their buckets, same form as KEYS[1], each with ARGV[10] to ARGV[15]
-- present (ARGV[10] = n: no lease) and, for the further window of KEYS[2 + j],
-- ARGV[13 + 3j] its limit, ARGV[14 + 3j] its bucket length in ms and
-- ARGV[15 + 3j] the expiry of its buckets in ms (same sample_count and
-- strictness as the first). All windows are decided at once: the n passes
-- are recorded in every window if each has room for them, else in none,
-- and a refusal's wait is the longest among the windows. A further window's
-- key that is not a hash is an error as the first's (outcome 2, nothing
-- written). The reply then has a sixth element: the further windows'
-- passes in their windows, in order (after the pass when it passed).
--
-- Returns {outcome, passes in the window, ms until n could pass (0 when
-- passed, -1 when never), the limit applied, the eviction policy ('' when
-- not asked for or not readable)}, where outcome is 1 passed, 0 refused,
-- 2 nothing decided: KEYS[1] holds a value that is not a hash, or
-- 3 nothing decided: the server evicts keys (ARGV[9] = '2').
-- A call that wants more than n and passes gets three more: {..., passes
-- granted, the bucket's start (ms), µs from now to the bucket's end}.
--
-- Only counts this script could have written are read: digits, at most
-- 2^53. Anything else (negative, fractional, 'nan', 'inf', '1e400', text)
-- is deleted as it is met, never counted: one key's bad data costs that key
-- its bad buckets, and no other key anything.

local MAX = 9007199254740992

-- A whole number from 0 to 2^53 written in digits, else nil.
local function whole(value)
  if type(value) ~= 'string' or #value > 16 or not string.match(value, '^%d+$') then
    return nil
  end
  local number = tonumber(value)
  if number > MAX then
    return nil
  end
  return number
end

local policy = ''
if ARGV[9] ~= '0' then
  local info = redis.pcall('INFO', 'memory')
  if type(info) == 'string' then
    policy = string.match(info, 'maxmemory_policy:([%w%-]+)') or ''
  end
  if ARGV[9] == '2' and policy ~= '' and policy ~= 'noeviction' then
    return { 3, 0, -1, 0, policy }
  end
end

local limit = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local bucket = tonumber(ARGV[3])
local samples = tonumber(ARGV[4])
local span = samples + tonumber(ARGV[5])

local want = tonumber(ARGV[10] or ARGV[2])

-- now in ms; now_us in µs (the server's microseconds, or now * 1000).
local now, now_us
if ARGV[6] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[6])
  now_us = now * 1000
end

-- A limit of the wrong type, or not a whole number, is ignored.
local shared = redis.pcall('GET', KEYS[2])
if type(shared) == 'string' then
  local value = whole(shared)
  if value then
    limit = value
  end
  redis.call('PEXPIRE', KEYS[2], ARGV[8])
end

-- Reads the buckets of the window in `key` (bucket length `length` ms):
-- the passes admission counts, those the window reports, and each live
-- bucket's {start, passes}; nil when the key holds something that is not
-- a hash. Buckets out of the window, or not written by this script, are
-- deleted.
local function read(key, length)
  local fields = redis.pcall('HGETALL', key)
  if fields.err then
    return nil
  end
  local at_start = now - now % length
  -- The oldest bucket admission counts, and the oldest the window reports.
  local oldest = at_start - (span - 1) * length
  local first = at_start - (samples - 1) * length
  local counted, in_window = 0, 0
  local live = {}
  for i = 1, #fields, 2 do
    local at = whole(fields[i])
    local passes = whole(fields[i + 1])
    if at == nil or passes == nil or at < oldest then
      -- Out of the window, or not written by this script: dropped.
      redis.call('HDEL', key, fields[i])
    else
      counted = counted + passes
      if at >= first then
        in_window = in_window + passes
      end
      live[#live + 1] = { at, passes }
    end
  end
  return { counted = counted, in_window = in_window, live = live, start = at_start }
end

-- The wait until `n` passes fit in a window read by `read` at `cap`, with
-- buckets of `length` ms: 0 when they fit, -1 when they never can.
local function wait_for(window, cap, length)
  if window.counted + n <= cap then
    return 0
  end
  if n > cap then
    return -1
  end
  table.sort(window.live, function(a, b) return a[1] < b[1] end)
  local need = window.counted + n - cap
  local freed = 0
  for _, b in ipairs(window.live) do
    freed = freed + b[2]
    if freed >= need then
      return b[1] + span * length - now
    end
  end
  return -1
end

local main = read(KEYS[1], bucket)
if main == nil then
  -- Not a hash: this key's error, reported as such; nothing is written.
  return { 2, 0, -1, limit, policy }
end
local start = main.start
local counted, in_window = main.counted, main.in_window

-- The further windows, read in full before anything is recorded.
local further = {}
for j = 1, #KEYS - 2 do
  local base = 13 + 3 * j
  local window = read(KEYS[2 + j], tonumber(ARGV[base + 1]))
  if window == nil then
    return { 2, 0, -1, limit, policy }
  end
  window.limit = tonumber(ARGV[base])
  window.length = tonumber(ARGV[base + 1])
  window.ttl = ARGV[base + 2]
  further[j] = window
end

if #further > 0 then
  local wait = wait_for(main, limit, bucket)
  for _, window in ipairs(further) do
    local w = wait_for(window, window.limit, window.length)
    if wait ~= -1 and (w == -1 or w > wait) then
      wait = w
    end
  end
  local passes = {}
  if wait == 0 then
    redis.call('HINCRBY', KEYS[1], start, n)
    redis.call('PEXPIRE', KEYS[1], ARGV[7])
    for j, window in ipairs(further) do
      redis.call('HINCRBY', KEYS[2 + j], window.start, n)
      redis.call('PEXPIRE', KEYS[2 + j], window.ttl)
      passes[j] = window.in_window + n
    end
    return { 1, in_window + n, 0, limit, policy, passes }
  end
  for j, window in ipairs(further) do
    passes[j] = window.in_window
  end
  return { 0, in_window, wait, limit, policy, passes }
end
local live = main.live

if counted + n <= limit then
  if want > n then
    local ends_us = (start + bucket) * 1000 - now_us
    local cap = math.floor(limit / (span * tonumber(ARGV[13])))
    local spendable = math.max(0, ends_us - tonumber(ARGV[12]))
    local by_time = math.floor(tonumber(ARGV[11]) * spendable / tonumber(ARGV[14]))
    local batch = tonumber(ARGV[15] or '0')
    if spendable <= 0 then
      batch = n
    end
    local granted = math.max(n, math.min(want, limit - counted, math.max(math.min(cap, by_time), batch)))
    redis.call('HINCRBY', KEYS[1], start, granted)
    redis.call('PEXPIRE', KEYS[1], ARGV[7])
    return { 1, in_window + granted, 0, limit, policy, granted, start, ends_us }
  end
  redis.call('HINCRBY', KEYS[1], start, n)
  redis.call('PEXPIRE', KEYS[1], ARGV[7])
  return { 1, in_window + n, 0, limit, policy }
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
return { 0, in_window, wait, limit, policy }
