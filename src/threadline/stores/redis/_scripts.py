"""The Redis layout of ``RedisStore`` and the Lua scripts that make each call one
atomic step.

For a key prefix ``P`` and a conversation id ``I``, schema version 1::

    P schema        the schema version (a string)
    P index         sorted set: conversation id -> write order (the listing)
    P touched       counter: the write order
    P c:I           hash: version, generation, header, metadata, format,
                    count, max_turn, seq, last_write, created_at, updated_at, touched
    P e:I           list: the events in order; an answered event is its JSON,
                    a pending one "p<seq>\\t<marker>\\t<JSON>"
    P p:I           hash: each pending item of P e:I -> "<marker>\\t<turn id>"

A write script compares the version (and generation), checks the turn ids,
drops pending items and appends, in one atomic step: Redis runs a script
with no other command in between. ``last_write`` holds the id of the write
that made the current version, so a write retried after a lost connection is
recognised as applied. The scripts name keys they build from the prefix, so
the store needs one Redis server (with replicas if wanted), not Redis Cluster.
"""

from __future__ import annotations

from typing import Final

__all__ = ["DELETE", "LIST_PAGE", "LOAD", "OPEN", "REMOVE_PENDING", "SCHEMA_VERSION", "WRITE"]

SCHEMA_VERSION: Final = 1

# KEYS: schema. ARGV: this code's schema version. Returns the stored version.
OPEN: Final = """
local stored = redis.call('GET', KEYS[1])
if not stored then
    redis.call('SET', KEYS[1], ARGV[1])
    return tonumber(ARGV[1])
end
return tonumber(stored) or -1
"""

# KEYS: c, e, p, index, touched.
# ARGV: id; the write's fields "expected\tgeneration\twrite_id\treplace\tdrop_all\t
#       drop_marker\tformat\tnext_turn_id\tttl_ms" (generation and drop_marker '' for none,
#       replace and drop_all 1/0, ttl_ms 0 for none); header; metadata; each record's
#       "<turn_id>\t<pending 1/0>\t<marker>\n" (marker '' for none), concatenated; then
#       each record's event JSON. The fields travel packed, as few arguments as possible,
#       because the client's cost of a call grows with its argument count; none of them
#       can hold a tab or a newline (numbers, hex ids, markers).
# Returns the new version (an integer) when the write is applied, else
# "<status>\t<version>\t<detail>"; status 'damaged' has detail "<field>=<stored value>".
WRITE: Final = """
local COUNTERS = {1, 5, 6, 7}
local COUNTER_NAMES = {[1] = 'version', [5] = 'max_turn', [6] = 'count', [7] = 'seq'}
local c, e, p, index, touched = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local fields = {}
for field in string.gmatch(ARGV[2] .. '\\t', '([^\\t]*)\\t') do
    fields[#fields + 1] = field
end
local expected, generation, write_id = tonumber(fields[1]), fields[2], fields[3]
local replace, drop_all, drop_marker = fields[4] == '1', fields[5] == '1', fields[6]
local format, next_turn, ttl = fields[7], tonumber(fields[8]), tonumber(fields[9])
local heads = {}
for turn, pending, marker in string.gmatch(ARGV[5], '([^\\t]*)\\t([^\\t]*)\\t([^\\n]*)\\n') do
    heads[#heads + 1] = {turn, pending == '1', marker}
end
local n = #heads

local state = redis.call('HMGET', c, 'version', 'generation', 'last_write', 'format',
    'max_turn', 'count', 'seq')
local exists = state[1] ~= false
if exists then
    -- Damaged counters would fail below, or worse, compare: refuse, naming one.
    for _, i in ipairs(COUNTERS) do
        if not tonumber(state[i]) then
            return 'damaged\\t-1\\t' .. COUNTER_NAMES[i] .. '=' .. tostring(state[i])
        end
    end
end
local version = tonumber(state[1]) or 0
if exists and version == expected + 1 and state[3] == write_id then
    return version
end
if version ~= expected then
    return 'conflict\\t' .. (exists and version or -1) .. '\\t'
end
local committed_max, count, seq = -1, 0, 0
if exists then
    if generation ~= '' and state[2] ~= generation then
        return 'generation\\t' .. version .. '\\t' .. state[2]
    end
    if not replace and state[4] ~= format then
        return 'format\\t' .. version .. '\\t' .. state[4]
    end
    generation = state[2]
    seq = tonumber(state[7])
    if not replace then
        committed_max, count = tonumber(state[5]), tonumber(state[6])
    end
end

local dropping = {}
local kept_max = committed_max
if exists and not replace then
    local flat = redis.call('HGETALL', p)
    for i = 1, #flat, 2 do
        local value = flat[i + 1]
        local tab = string.find(value, '\\t', 1, true)
        local own = string.sub(value, 1, tab - 1)
        if drop_all or (drop_marker ~= '' and own == drop_marker) then
            dropping[#dropping + 1] = flat[i]
        else
            kept_max = math.max(kept_max, tonumber(string.sub(value, tab + 1)))
        end
    end
end
if kept_max >= next_turn then
    return 'turn\\t' .. version .. '\\t' .. kept_max
end

-- Every check has passed: write. (A new conversation clears what an expired one may have
-- left behind.)
if replace or not exists then
    redis.call('DEL', e, p)
end
for _, item in ipairs(dropping) do
    redis.call('LREM', e, -1, item)
    redis.call('HDEL', p, item)
end
count = count - #dropping
local items = {}
for i = 1, n do
    local turn, pending, marker = heads[i][1], heads[i][2], heads[i][3]
    local text = ARGV[5 + i]
    if pending then
        seq = seq + 1
        local item = 'p' .. seq .. '\\t' .. marker .. '\\t' .. text
        redis.call('HSET', p, item, marker .. '\\t' .. turn)
        items[#items + 1] = item
    else
        committed_max = math.max(committed_max, tonumber(turn))
        items[#items + 1] = text
    end
    if #items == 1000 then
        redis.call('RPUSH', e, unpack(items))
        items = {}
    end
end
if #items > 0 then
    redis.call('RPUSH', e, unpack(items))
end

local now = redis.call('TIME')
local stamp = now[1] .. '.' .. string.format('%06d', tonumber(now[2]))
local order = redis.call('INCR', touched)
redis.call('HSET', c, 'version', version + 1, 'header', ARGV[3], 'metadata', ARGV[4],
    'count', count + n, 'max_turn', committed_max, 'seq', seq, 'last_write', write_id,
    'updated_at', stamp, 'touched', order)
if not exists then
    redis.call('HSET', c, 'generation', generation, 'format', format, 'created_at', stamp)
elseif replace then
    redis.call('HSET', c, 'format', format)
end
redis.call('ZADD', index, order, ARGV[1])
if ttl > 0 then
    redis.call('PEXPIRE', c, ttl)
    redis.call('PEXPIRE', e, ttl)
    redis.call('PEXPIRE', p, ttl)
end
return version + 1
"""

# KEYS: c, e. Returns {version, generation, header, items} or nil.
LOAD: Final = """
local state = redis.call('HMGET', KEYS[1], 'version', 'generation', 'header')
if not state[1] then
    return false
end
return {state[1], state[2], state[3], redis.call('LRANGE', KEYS[2], 0, -1)}
"""

# KEYS: index. ARGV: prefix, after ('+inf' for the first page), limit.
# Returns rows {id, version, count, updated_at, metadata, generation, touched}; an index
# entry whose conversation expired is removed and skipped.
LIST_PAGE: Final = """
local index, prefix, after, limit = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])
local rows = {}
local bound = after == '+inf' and '+inf' or ('(' .. after)
while #rows < limit do
    local found = redis.call('ZREVRANGEBYSCORE', index, bound, '-inf', 'WITHSCORES',
        'LIMIT', 0, limit - #rows)
    if #found == 0 then
        break
    end
    for i = 1, #found, 2 do
        local id, order = found[i], found[i + 1]
        local state = redis.call('HMGET', prefix .. 'c:' .. id, 'version', 'count',
            'updated_at', 'metadata', 'generation')
        if state[1] then
            rows[#rows + 1] = {id, state[1], state[2], state[3], state[4], state[5], order}
        else
            redis.call('ZREM', index, id)
        end
        bound = '(' .. order
    end
end
return rows
"""

# KEYS: c, e, p. ARGV: marker. Returns how many pending items went.
REMOVE_PENDING: Final = """
if redis.call('EXISTS', KEYS[1]) == 0 then
    return 0
end
local flat = redis.call('HGETALL', KEYS[3])
local removed = 0
for i = 1, #flat, 2 do
    local value = flat[i + 1]
    if string.sub(value, 1, string.find(value, '\\t', 1, true) - 1) == ARGV[1] then
        redis.call('LREM', KEYS[2], -1, flat[i])
        redis.call('HDEL', KEYS[3], flat[i])
        removed = removed + 1
    end
end
if removed > 0 then
    redis.call('HINCRBY', KEYS[1], 'count', -removed)
end
return removed
"""

# KEYS: c, e, p, index. ARGV: id, expected version ('' none), generation ('' none).
# Returns {status, version, generation}: status 1 deleted, 0 none, -1 not deleted
# (the version or generation differs, or the stored version is not a number, so a
# delete that checks it cannot tell). The version goes back as stored, as text.
DELETE: Final = """
local state = redis.call('HMGET', KEYS[1], 'version', 'generation')
if not state[1] then
    return {0, '0', ''}
end
local generation = state[2] or ''
local stale = ARGV[2] ~= '' and tonumber(ARGV[2]) ~= tonumber(state[1])
if stale or (ARGV[3] ~= '' and ARGV[3] ~= generation) then
    return {-1, state[1], generation}
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
redis.call('ZREM', KEYS[4], ARGV[1])
return {1, state[1], generation}
"""
