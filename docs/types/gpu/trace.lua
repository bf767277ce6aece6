---@meta gpu.trace
-- LuaLS annotations for `gpu.trace` (also `require "gpu.trace"`: the same
-- table).  Checked by tests/annotations.lua.  README.md, "Tracing".

---@class gpu.TraceStartOpts
---@field max_events? integer records kept, later ones counted as dropped (default 1,000,000)

---One record of `gpu.trace.events()`.  Times in microseconds from the start.
---@class gpu.TraceEvent
---@field name string the op, sync or range
---@field kind "op"|"host_op"|"collective"|"sync"|"range"
---@field cat "copy"|"compute"|"collective"|"sync"|"range"
---@field copy? "h2d"|"d2h"|"d2d"|"h2h" the direction, for copies
---@field stream? integer the stream's id (nil on the host track)
---@field ts number start
---@field dur number duration
---@field bytes integer bytes moved
---@field site string the script line that enqueued it
---@field call? string the API call of a sync, when known
---@field depth? integer nesting depth, for ranges

---A stream that work went to, in `gpu.trace.events().streams`.
---@class gpu.TraceStream
---@field id integer the stream's id
---@field name string its label ("default stream", "stream 3 (high priority)")
---@field priority "low"|"normal"|"high"
---@field nonblocking boolean
---@field default boolean whether it is the default stream

---The list `gpu.trace.events()` returns: records in order of start, and about the session.
---@class gpu.TraceEvents: { [integer]: gpu.TraceEvent }
---@field streams gpu.TraceStream[] the streams, by id
---@field dropped integer records beyond max_events
---@field duration number the session's span, microseconds
---@field backend "cuda"|"host"

---Timelines of what a run did: every op on its stream's track, syncs and ranges on the host's.
---@class gpulua.trace
local trace = {}

---Start a new session (the last one's records are dropped); raises if one is on.
---@param opts? gpu.TraceStartOpts
function trace.start(opts) end

---Stop recording new work (work enqueued before is still recorded).
function trace.stop() end

---Whether a session is recording.
---@return boolean
function trace.active() end

---The records as a list; synchronizes first (a counted sync, refused in `gpu.nosync()`).
---@return gpu.TraceEvents
function trace.events() end

---Write the timeline as Chrome trace JSON (Perfetto, chrome://tracing); synchronizes first.
---@param path string
---@return string path
function trace.json(path) end

---Write the timeline as an SVG picture; synchronizes first.
---@param path string
---@return string path
function trace.svg(path) end

---Write JSON or SVG, by the file's extension; synchronizes first.
---@param path string a `.json` or `.svg` file
---@return string path
function trace.write(path) end

return trace
