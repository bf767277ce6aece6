---@meta gpu.pipeline
-- LuaLS annotations for `require "gpu.pipeline"`.  Checked by
-- tests/annotations.lua.  README.md, "Pipelines"; stdlib/gpu/pipeline.lua.

---One batch's buffer: `input` or `output` of a pipeline.
---@class gpu.PipelineBufferSpec
---@field shape integer[]|integer sizes of one batch (positive)
---@field dtype? "f32"|"f64"|"f16"|"bf16"|"i8"|"u8"|"i32"|"i64"|"bool" element type (default "f32"; short names only)
---@field device? "pinned"|"host" memory of `load`'s and `sink`'s buffer (default "pinned")

---What `pipeline.run` runs: load (host) -> H2D -> compute -> D2H -> sink (host), `depth` batches in flight.
---@class gpu.PipelineSpec
---@field batches? integer batches to run (without it, `load` returns false at the end)
---@field depth? integer batches in flight (default 2)
---@field input? gpu.PipelineBufferSpec one batch's input (with `load`)
---@field inputs? gpu.Tensor[] pinned or pageable inputs filled beforehand, instead of `input` and `load`
---@field output? gpu.PipelineBufferSpec one batch's result (needs `sink`)
---@field load? fun(i: integer, pinned_in: gpu.Tensor): boolean? fill batch i's host buffer
---@field compute fun(i: integer, dev_in: gpu.Tensor, dev_out: gpu.Tensor?): any enqueue batch i's work on the current stream
---@field sink? fun(i: integer, pinned_out: gpu.Tensor?, result: any) consume batch i on the host, in order
---@field progress? boolean a progress line on stderr (default: when stderr is a terminal)
---@field timing? boolean time every stage with events (stats gain the *_ms fields and timeline)
---@field name? string label of the progress line (default "pipeline")
---@field graph? boolean capture each slot's compute once with gpu.graph and replay it

---When a batch's stages ran, in ms since the start (`stats.timeline[i]`).
---@class gpu.PipelineTimeline
---@field h2d? number[] `{t0, t1}` of the H2D copy
---@field compute? number[] `{t0, t1}` of the compute
---@field d2h? number[] `{t0, t1}` of the D2H copy

---What `pipeline.run` returns.
---@class gpu.PipelineStats
---@field batches integer batches run
---@field depth integer batches in flight
---@field seconds number host wall time of the batches (setup excluded)
---@field setup_seconds number making streams, events and buffers
---@field bytes integer H2D + D2H bytes
---@field h2d_bytes integer
---@field d2h_bytes integer
---@field gbps number bytes / seconds / 1e9
---@field load_seconds number host time in `load`
---@field sink_seconds number host time in `sink`
---@field waits integer times the host blocked on the device
---@field wait_seconds number how long it blocked
---@field device_ms? number first H2D to the last stage (with timing)
---@field h2d_ms? number sum of the H2D copies (with timing)
---@field compute_ms? number sum of the computes (with timing)
---@field d2h_ms? number sum of the D2H copies (with timing)
---@field timeline? gpu.PipelineTimeline[] per batch (with timing)

---A declarative multi-stage pipeline: streams, events and buffers made, reused and closed for you.
---@class gpulua.pipeline
local pipeline = {}

---Run the batches; returns when the last is sunk.  A bad field raises naming it.
---@param spec gpu.PipelineSpec
---@return gpu.PipelineStats
function pipeline.run(spec) end

return pipeline
