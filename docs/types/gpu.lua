---@meta gpu
-- LuaLS annotations for gpulua's `gpu` module (`local gpu = require "gpu"`).
-- Definitions only: this file is never run.  tests/annotations.lua checks it
-- against what the module really exports, so a name added to or removed from
-- the bindings fails the suite until it is annotated here too.
-- Reference: README.md, "Lua API".  Indices and dims are 1-based (negative
-- dims count from the end); device indices are 0-based, as in CUDA.

-- ---- names -----------------------------------------------------------------

---@alias gpu.dtype
---| "f32"      # 32-bit float (the default)
---| "f64"      # 64-bit float
---| "f16"      # 16-bit IEEE half, computed in f32
---| "bf16"     # bfloat16, computed in f32
---| "i8"       # signed 8-bit integer
---| "u8"       # unsigned 8-bit integer
---| "i32"      # signed 32-bit integer
---| "i64"      # signed 64-bit integer
---| "bool"     # true/false, one byte
---| "float32"  # synonym of f32
---| "float"    # synonym of f32
---| "float64"  # synonym of f64
---| "double"   # synonym of f64
---| "float16"  # synonym of f16
---| "half"     # synonym of f16
---| "bfloat16" # synonym of bf16
---| "int8"     # synonym of i8
---| "uint8"    # synonym of u8
---| "int32"    # synonym of i32
---| "int"      # synonym of i32
---| "int64"    # synonym of i64
---| "long"     # synonym of i64

---@alias gpu.device
---| "device"   # the active backend's device memory (the default)
---| "pinned"   # page-locked host memory: truly asynchronous copies
---| "host"     # pageable host memory
---| "cuda"     # synonym of "device", on both backends
---| "cpu"      # synonym of "host"
---| string     # "cuda:N": device memory of GPU N

---@alias gpu.memory "device"|"pinned"|"host"

---@alias gpu.priority "low"|"normal"|"high"|-1|0|1

---@alias gpu.sync_mode
---| "off"      # syncs are allowed silently
---| "warn"     # each distinct sync warns once (Lua warnings)
---| "error"    # a sync raises

---@alias gpu.reduce_op "sum"|"prod"|"max"|"min"|"avg"

---@alias gpu.task_state "new"|"ready"|"running"|"waiting for the device"|"waiting for a task"|"done"|"failed"

---A shape: a list of non-negative sizes, or one size.
---@alias gpu.shape integer[]|integer

---A launch size: a number, or `{x, y, z}` (missing entries are 1).
---@alias gpu.dim3 integer|integer[]

---A value stored in a tensor: a number, or a boolean for a `bool` tensor.
---@alias gpu.scalar number|boolean

-- ---- tables that functions return -------------------------------------------

---`gpu.device_info(i)`.
---@class gpu.DeviceInfo
---@field name string the device's name
---@field backend "cuda"|"host" the backend that drives it
---@field index integer its 0-based index
---@field total_memory integer bytes of memory
---@field multiprocessors integer SMs (cuda) or CPUs (host)
---@field compute_capability? string "9.0" and the like (cuda only)

---`gpu.memory()`: bytes.
---@class gpu.MemoryInfo
---@field allocated integer device memory held by live tensors
---@field reserved integer device memory held by the caching allocator
---@field peak integer largest `allocated` since the start or `gpu.reset_peak_memory()`
---@field pinned integer pinned host memory held by live tensors
---@field pinned_reserved integer pinned memory held by the allocator
---@field pinned_peak integer largest `pinned`
---@field host integer pageable host memory held by live tensors
---@field host_reserved integer pageable memory held by the allocator
---@field host_peak integer largest `host`
---@field gc_floor integer slack of the collector's memory limit (device memory / 32, 1 to 256 MiB)

---`gpu.stats()`: counters since the start.
---@class gpu.Stats
---@field syncs integer host-device syncs (counted syncs)
---@field launches integer ops other than copies enqueued (built-in and run-time kernels)
---@field copies integer copies enqueued
---@field h2d_bytes integer bytes copied host to device
---@field d2h_bytes integer bytes copied device to host
---@field d2d_bytes integer bytes copied device to device
---@field h2h_bytes integer bytes copied host to host
---@field streams integer live user streams (the default stream excluded)
---@field events integer live events
---@field buffers integer live allocations of every kind
---@field max_concurrent integer most ops seen running at once (host backend)
---@field replays integer graph replays

---One parameter of a kernel's signature (`k.params[i]`).
---@class gpu.KernelParam
---@field name string the parameter's name
---@field type string its C type, as written

-- ---- options ---------------------------------------------------------------
-- Options are checked: a key not listed raises.

---@class gpu.TensorOpts
---@field dtype? gpu.dtype element type (default "f32")
---@field device? gpu.device where the data lives (default "device")
---@field stream? gpu.Stream stream of the fill (default: the current one)

---@class gpu.PinnedOpts
---@field dtype? gpu.dtype element type (default "f32")

---@class gpu.RandOpts: gpu.TensorOpts
---@field low? number lower bound, inclusive (default 0)
---@field high? number upper bound, exclusive (default 1; 2^31 for integers)
---@field seed? integer seed of this draw (default: the generator's, see `gpu.seed`)

---@class gpu.RandnOpts: gpu.TensorOpts
---@field mean? number mean (default 0)
---@field std? number standard deviation (default 1)
---@field seed? integer seed of this draw

---@class gpu.RandintOpts: gpu.TensorOpts
---@field seed? integer seed of this draw

---@class gpu.StreamOpts
---@field stream? gpu.Stream stream the op goes on (default: the current one)

---@class gpu.OutOpts
---@field out? gpu.Tensor write the result here instead of a new tensor
---@field stream? gpu.Stream stream the op goes on (default: the current one)

---@class gpu.WhereOpts: gpu.OutOpts
---@field dtype? gpu.dtype result dtype when `a` and `b` are both numbers (default "f32")

---@class gpu.IsCloseOpts: gpu.StreamOpts
---@field rtol? number relative tolerance, of `|b|` (default 1e-5)
---@field atol? number absolute tolerance (default 1e-8)
---@field equal_nan? boolean NaN is close to NaN (default false)

---@class gpu.NanToNumOpts: gpu.StreamOpts
---@field nan? number what NaN becomes (default 0)
---@field posinf? number what inf becomes (default the dtype's largest finite value)
---@field neginf? number what -inf becomes (default the dtype's smallest finite value)

---@class gpu.ReduceOpts: gpu.OutOpts
---@field dim? integer the dim to reduce (default: every dim)
---@field keepdim? boolean keep the reduced dim with size 1

---@class gpu.AmaxOpts
---@field keepdim? boolean keep the reduced dims with size 1

---@class gpu.VarOpts: gpu.ReduceOpts
---@field unbiased? boolean divide by n - 1 (default true)

---@class gpu.NormOpts: gpu.ReduceOpts
---@field p? number the norm's order, > 0 (default 2; math.huge for the largest magnitude)

---@class gpu.SoftmaxOpts: gpu.OutOpts
---@field dim? integer the dim (required when the options are the first argument)

---@class gpu.SortOpts: gpu.StreamOpts
---@field dim? integer the dim to sort along (default: the last)
---@field descending? boolean largest first (NaN first); default false (NaN last)
---@field stable? boolean accepted; every sort is stable (equal values keep their order)

---@class gpu.TopkOpts: gpu.StreamOpts
---@field dim? integer the dim to select along (default: the last)
---@field largest? boolean the k largest (default true), else the k smallest
---@field sorted? boolean accepted; the result is always in order

---@class gpu.ToOpts
---@field device? gpu.device memory of the result
---@field dtype? gpu.dtype dtype of the result
---@field stream? gpu.Stream stream of the copy

---@class gpu.LoadOpts
---@field device? gpu.device memory of the tensor (default "device")
---@field stream? gpu.Stream stream of the upload
---@field map? boolean map the file for a device load, the call returning before it is read (default true)

---@class gpu.LoadNpzOpts
---@field names? string[] only these arrays (default all)
---@field device? gpu.device memory of the tensors (default "device")
---@field stream? gpu.Stream stream of the uploads
---@field map? boolean map stored members for a device load, not CRC-checked (default true)

---@class gpu.SaveNpzOpts
---@field compress? boolean deflate the members, as numpy.savez_compressed (default false)
---@field stream? gpu.Stream stream of the read-back

---@class gpu.LoadSafetensorsOpts
---@field names? string[] only these tensors (default all)
---@field device? gpu.device memory of the tensors (default "device")
---@field stream? gpu.Stream stream of the uploads
---@field map? boolean map the file for a device load, the call returning before it is read (default true)

---@class gpu.SaveSafetensorsOpts
---@field metadata? table<string, string> saved as the header's __metadata__
---@field stream? gpu.Stream stream of the read-back

---@class gpu.NewStreamOpts
---@field priority? gpu.priority scheduling priority (default "normal")
---@field nonblocking? boolean not ordered with the default stream (default false)

---@class gpu.EventOpts
---@field timing? boolean record times, for `elapsed` (default true)

---@class gpu.GraphOpts
---@field name? string the graph's name, in traces and messages

---@class gpu.CompileOpts
---@field options? string[] compiler options ("--use_fast_math", "-DN=4", ...)
---@field name? string program name, in messages and the cache key (default "kernel.cu")
---@field cache? boolean use the on-disk kernel cache (default true)

---@class gpu.LoadModuleOpts
---@field declare? string CUDA C prototypes of the kernels, for full parameter types

---@class gpu.LaunchOpts
---@field grid gpu.dim3 blocks (required)
---@field block gpu.dim3 threads a block (required)
---@field shared? integer bytes of dynamic shared memory (default 0)
---@field stream? gpu.Stream stream of the launches (default: the current one at each call)

---@class gpu.InitCommOpts
---@field timeout? number seconds a collective may take (default 300, `GPULUA_COMM_TIMEOUT`)
---@field check? boolean compare every collective across the ranks first

---@class gpu.AllReduceOpts: gpu.OutOpts
---@field op? gpu.reduce_op the reduction (default "sum")
---@field group? gpu.Group the process group (default: the world)

---@class gpu.BroadcastOpts: gpu.OutOpts
---@field root? integer the rank whose tensor is sent (default 0; a group rank with `group`)
---@field group? gpu.Group the process group (default: the world)

---@class gpu.ReduceCollOpts: gpu.OutOpts
---@field op? gpu.reduce_op the reduction (default "sum")
---@field root? integer the rank that gets the result (default 0; a group rank with `group`)
---@field group? gpu.Group the process group (default: the world)

---@class gpu.ReduceScatterOpts
---@field op? gpu.reduce_op the reduction (default "sum")
---@field stream? gpu.Stream stream of the collective
---@field group? gpu.Group the process group (default: the world)

---@class gpu.CollOpts
---@field stream? gpu.Stream stream of the collective (default: the current one)
---@field group? gpu.Group the process group (default: the world; peers are its ranks)

---@class gpu.BarrierOpts
---@field group? gpu.Group the process group whose ranks meet (default: the world)

---@class gpu.GroupOpts
---@field name? string what messages call the group (default: its ranks, "group {0,2}")

-- ---- the module ------------------------------------------------------------

---The `gpu` module: devices, streams, events, tensors, run-time kernels,
---graphs, tasks and collectives.  Preloaded in `gpulua`; `gpu.so` for a
---stock Lua 5.4.
---@class gpulua.gpu
---@field backend "cuda"|"host" the backend this interpreter runs on
---@field rank integer this process's rank in the job (0 alone)
---@field world_size integer ranks in the job (1 alone)
---@field local_rank integer rank on this node
---@field local_world_size integer ranks on this node
---@field trace gpulua.trace timelines (also `require "gpu.trace"`)
local gpu = {}

-- runtime

---Number of devices of the backend.
---@return integer
function gpu.device_count() end

---What device `i` is.
---@param i? integer device index (default: the current device)
---@return gpu.DeviceInfo
function gpu.device_info(i) end

---Make device `i` current for what comes next.
---@param i integer device index
function gpu.set_device(i) end

---Wait for all work on every stream; raises queued errors.  A counted sync.
function gpu.synchronize() end

---Memory held, in bytes.
---@return gpu.MemoryInfo
function gpu.memory() end

---Return cached memory to the system.
function gpu.empty_cache() end

---Start the `peak` counters of `gpu.memory()` again.
function gpu.reset_peak_memory() end

---Counters: syncs, launches, copies, live objects.
---@return gpu.Stats
function gpu.stats() end

---Seed the counter-based generator (resets its offset).
---@param n integer the seed
function gpu.seed(n) end

---Enqueue an op that holds the stream for `ms` milliseconds.
---@param ms number milliseconds, 0 to 1e7
---@param opts? gpu.StreamOpts
function gpu.sleep(ms, opts) end

---Seconds on the host's monotonic clock.
---@return number
function gpu.clock() end

---Whether a standard stream is a terminal.
---@param name "stdin"|"stdout"|"stderr"
---@return boolean
function gpu.isatty(name) end

---Turn the stream race checker on or off; without an argument, only ask.
---@param on? boolean
---@return boolean was_on whether it was on before
function gpu.check_races(on) end

---Set what a host-device sync does; without an argument, only ask.
---@param mode? gpu.sync_mode
---@return gpu.sync_mode before the mode in force before
function gpu.sync_debug(mode) end

---A to-be-closed scope in which syncs raise (or warn): `local _ <close> = gpu.nosync()`.
---@param mode? gpu.sync_mode (default "error")
---@return gpu.NoSync
function gpu.nosync(mode) end

---A named span on the trace's host track (an NVTX range on cuda): `local _ <close> = gpu.range("load")`.
---@param name string
---@return gpu.Range
function gpu.range(name) end

-- streams and events

---A new stream.
---@param opts? gpu.NewStreamOpts
---@return gpu.Stream
function gpu.stream(opts) end

---Make `s` the current stream of this coroutine until the guard is closed: `local _ <close> = gpu.using(s)`.
---@param s gpu.Stream
---@return gpu.Using
function gpu.using(s) end

---The default stream (ordered with every blocking stream).
---@return gpu.Stream
function gpu.default_stream() end

---The current stream of this coroutine (the default stream when none is set).
---@return gpu.Stream
function gpu.current_stream() end

---A new event.
---@param opts? gpu.EventOpts
---@return gpu.Event
function gpu.event(opts) end

-- tensors

---An uninitialised tensor.
---@param shape gpu.shape a table, or the sizes as numbers: (3, 4 [, opts])
---@param opts? gpu.TensorOpts
---@return gpu.Tensor
---@overload fun(n1: integer, ...: integer|gpu.TensorOpts): gpu.Tensor
function gpu.empty(shape, opts) end

---A tensor of zeros.
---@param shape gpu.shape a table, or the sizes as numbers: (3, 4 [, opts])
---@param opts? gpu.TensorOpts
---@return gpu.Tensor
---@overload fun(n1: integer, ...: integer|gpu.TensorOpts): gpu.Tensor
function gpu.zeros(shape, opts) end

---A tensor of ones.
---@param shape gpu.shape a table, or the sizes as numbers: (3, 4 [, opts])
---@param opts? gpu.TensorOpts
---@return gpu.Tensor
---@overload fun(n1: integer, ...: integer|gpu.TensorOpts): gpu.Tensor
function gpu.ones(shape, opts) end

---A tensor filled with `v`.
---@param shape gpu.shape
---@param v gpu.scalar the value
---@param opts? gpu.TensorOpts
---@return gpu.Tensor
function gpu.full(shape, v, opts) end

---`start, start + step, ...` below `stop` (1-D); i64 for integer arguments, else f32.
---@param start number first value (or `stop`, alone, counting from 0)
---@param stop? number end, exclusive
---@param step? number step, not 0 (default 1)
---@param opts? gpu.TensorOpts
---@return gpu.Tensor
---@overload fun(stop: number, opts?: gpu.TensorOpts): gpu.Tensor
---@overload fun(start: number, stop: number, opts?: gpu.TensorOpts): gpu.Tensor
function gpu.arange(start, stop, step, opts) end

---Uniform random values in `[low, high)`.
---@param shape gpu.shape a table, or the sizes as numbers: (3, 4 [, opts])
---@param opts? gpu.RandOpts
---@return gpu.Tensor
---@overload fun(n1: integer, ...: integer|gpu.RandOpts): gpu.Tensor
function gpu.rand(shape, opts) end

---Normal random values.
---@param shape gpu.shape a table, or the sizes as numbers: (3, 4 [, opts])
---@param opts? gpu.RandnOpts
---@return gpu.Tensor
---@overload fun(n1: integer, ...: integer|gpu.RandnOpts): gpu.Tensor
function gpu.randn(shape, opts) end

---Random integers in `[lo, hi)` (`hi` exclusive).
---@param lo integer
---@param hi integer
---@param shape gpu.shape
---@param opts? gpu.RandintOpts dtype "i64" by default
---@return gpu.Tensor
function gpu.randint(lo, hi, shape, opts) end

---A tensor from Lua values: nested tables, or a number (0-dim).
---@param values table|number|boolean
---@param opts? gpu.TensorOpts
---@return gpu.Tensor
function gpu.tensor(values, opts) end

---An uninitialised tensor in pinned host memory.
---@param shape gpu.shape a table, or the sizes as numbers: (3, 4 [, opts])
---@param opts? gpu.PinnedOpts
---@return gpu.Tensor
---@overload fun(n1: integer, ...: integer|gpu.PinnedOpts): gpu.Tensor
function gpu.pinned(shape, opts) end

---`n` values from `a` to `b`, the last exactly `b`.
---@param a number
---@param b number
---@param n integer
---@param opts? gpu.TensorOpts
---@return gpu.Tensor
function gpu.linspace(a, b, n, opts) end

---An `n` x `m` tensor with ones on the diagonal.
---@param n integer rows
---@param m? integer columns (default n)
---@param opts? gpu.TensorOpts
---@return gpu.Tensor
---@overload fun(n: integer, opts?: gpu.TensorOpts): gpu.Tensor
function gpu.eye(n, m, opts) end

---Uninitialised, with `t`'s shape, dtype and memory.
---@param t gpu.Tensor
---@param opts? gpu.TensorOpts dtype and device override t's
---@return gpu.Tensor
function gpu.empty_like(t, opts) end

---Zeros, with `t`'s shape, dtype and memory.
---@param t gpu.Tensor
---@param opts? gpu.TensorOpts
---@return gpu.Tensor
function gpu.zeros_like(t, opts) end

---Ones, with `t`'s shape, dtype and memory.
---@param t gpu.Tensor
---@param opts? gpu.TensorOpts
---@return gpu.Tensor
function gpu.ones_like(t, opts) end

---`v` everywhere, with `t`'s shape, dtype and memory.
---@param t gpu.Tensor
---@param v gpu.scalar
---@param opts? gpu.TensorOpts
---@return gpu.Tensor
function gpu.full_like(t, v, opts) end

---The tensors of `list` joined along an existing dim.
---@param list gpu.Tensor[]
---@param dim? integer (default 1)
---@param opts? gpu.OutOpts
---@return gpu.Tensor
---@overload fun(list: gpu.Tensor[], opts: gpu.OutOpts): gpu.Tensor
function gpu.cat(list, dim, opts) end

---The tensors of `list` (equal shapes) joined along a new dim.
---@param list gpu.Tensor[]
---@param dim? integer (default 1)
---@param opts? gpu.OutOpts
---@return gpu.Tensor
---@overload fun(list: gpu.Tensor[], opts: gpu.OutOpts): gpu.Tensor
function gpu.stack(list, dim, opts) end

---Matrix product: 2-D, or batched 3-D `{batch, m, k} @ {batch, k, n}`.
---@param a gpu.Tensor
---@param b gpu.Tensor
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function gpu.matmul(a, b, opts) end

---Batched matrix product `{B, n, k} @ {B, k, m}`, no broadcast (torch.bmm).
---@param a gpu.Tensor
---@param b gpu.Tensor
---@return gpu.Tensor
function gpu.bmm(a, b) end

---Outer product of two 1-D tensors: `r[i][j] = a[i] * b[j]`.
---@param a gpu.Tensor
---@param b gpu.Tensor
---@return gpu.Tensor
function gpu.outer(a, b) end

---Dot product of two 1-D tensors of one size: a 0-dim tensor.
---@param a gpu.Tensor
---@param b gpu.Tensor
---@return gpu.Tensor
function gpu.dot(a, b) end

---Einstein summation, as `numpy.einsum`: `gpu.einsum("bij,bjk->bik", a, b)`;
---without `->` the output is `...` then the indices that appear once, sorted.
---A repeated index in one operand is its diagonal (`"ii->i"`); `...` broadcasts.
---@param spec string
---@param ... gpu.Tensor
---@return gpu.Tensor
function gpu.einsum(spec, ...) end

---`cond ? a : b` elementwise, all broadcast together.
---@param cond gpu.Tensor a bool tensor
---@param a gpu.Tensor|gpu.scalar
---@param b gpu.Tensor|gpu.scalar
---@param opts? gpu.WhereOpts
---@return gpu.Tensor
function gpu.where(cond, a, b, opts) end

---NumPy's `|a - b| <= atol + rtol * |b|` (or `a == b`), elementwise: a bool tensor.
---@param a gpu.Tensor
---@param b gpu.Tensor|number
---@param opts? gpu.IsCloseOpts
---@return gpu.Tensor
function gpu.isclose(a, b, opts) end

---Whether every element of `a` is close to `b` (as `gpu.isclose`); a sync.
---@param a gpu.Tensor
---@param b gpu.Tensor|number
---@param opts? gpu.IsCloseOpts
---@return boolean
function gpu.allclose(a, b, opts) end

---Read a NumPy `.npy` file into a new tensor.
---@param path string
---@param opts? gpu.LoadOpts
---@return gpu.Tensor
function gpu.load(path, opts) end

---Read a NumPy .npz file: the tensors by name.
---@param path string
---@param opts? gpu.LoadNpzOpts
---@return table<string, gpu.Tensor>
function gpu.load_npz(path, opts) end

---Write a table of tensors (by name) as a NumPy .npz file.
---@param path string
---@param tensors table<string, gpu.Tensor>
---@param opts? gpu.SaveNpzOpts
function gpu.save_npz(path, tensors, opts) end

---Read a safetensors file: the tensors by name, and the header's metadata.
---@param path string
---@param opts? gpu.LoadSafetensorsOpts
---@return table<string, gpu.Tensor> tensors
---@return table<string, string> metadata
function gpu.load_safetensors(path, opts) end

---Write a table of tensors (by name) as a safetensors file.
---@param path string
---@param tensors table<string, gpu.Tensor>
---@param opts? gpu.SaveSafetensorsOpts
function gpu.save_safetensors(path, tensors, opts) end

---The tensor over a DLPack capsule an application handed to the script (imported once).
---@param capsule gpu.DLPack
---@return gpu.Tensor
function gpu.from_dlpack(capsule) end

-- run-time kernels

---Compile CUDA C source (NVRTC on cuda, the system C++ compiler on host); its `__global__` kernels by name.
---@param src string CUDA C source
---@param opts? gpu.CompileOpts
---@return gpu.Module
function gpu.compile(src, opts) end

---Load PTX, a cubin or a fatbin (cuda only), given as a string or a path.
---@param image string the image, or a file path
---@param opts? gpu.LoadModuleOpts
---@return gpu.Module
function gpu.load_module(image, opts) end

---A fused function (gpu.fuse): call it with tensors and numbers, then
---optionally `{out =, stream =}`; one op per result.
---@class gpu.Fused
---@overload fun(...: gpu.Tensor|number|gpu.FusedCallOpts): ...: gpu.Tensor
local Fused = {}

---@class gpu.FusedCallOpts
---@field out? gpu.Tensor|gpu.Tensor[] the tensor to write (a list: one per result)
---@field stream? gpu.Stream

---@class gpu.FuseOpts
---@field name? string the op's name in traces and messages

---How many times the function was traced, and how many calls ran.
---@return {traces: integer, calls: integer}
function Fused:stats() end

---The elementwise ops of `fn` as one op per result (see docs/lua-api.md, Fusion).
---@param fn fun(...: gpu.Tensor|number): ...: gpu.Tensor
---@param opts? gpu.FuseOpts
---@return gpu.Fused
function gpu.fuse(fn, opts) end

-- graphs

---Capture `fn(s)` once as a graph; returns the graph and what `fn` returned.
---@param fn fun(s: gpu.Stream): ...
---@param opts? gpu.GraphOpts
---@return gpu.Graph graph
---@return any ... fn's results (tensors made inside belong to the graph)
function gpu.graph(fn, opts) end

-- tasks

---Start `fn(...)` as a task on the interpreter thread.
---@param fn function
---@param ... any its arguments
---@return gpu.Task
function gpu.task(fn, ...) end

---Wait for an event, a stream or a task (only this task waits, inside a task); a task's results.
---@param x gpu.Event|gpu.Stream|gpu.Task
---@return any ... the task's results (nothing for an event or a stream)
function gpu.await(x) end

---Run tasks until all are done, or for at most `timeout_s` seconds.
---@param timeout_s? number
---@return integer left tasks left unfinished (0 without a timeout)
function gpu.run(timeout_s) end

-- ranks and collectives

---Join the job's communicator now rather than at the first collective.
---@param opts? gpu.InitCommOpts
function gpu.init_comm(opts) end

---Reduce `t` across the ranks, in place (or into `opts.out`).
---@param t gpu.Tensor
---@param opts? gpu.AllReduceOpts
---@return gpu.Tensor result t, or opts.out
function gpu.all_reduce(t, opts) end

---The root's `t` to every rank's `t` (or `opts.out`).
---@param t gpu.Tensor
---@param opts? gpu.BroadcastOpts
---@return gpu.Tensor result t, or opts.out
function gpu.broadcast(t, opts) end

---Reduce `t` across the ranks; the result on the root only.
---@param t gpu.Tensor
---@param opts? gpu.ReduceCollOpts
---@return gpu.Tensor result t, or opts.out
function gpu.reduce(t, opts) end

---Every rank's `t`, in rank order, into `out` (world_size x numel(t)).
---@param out gpu.Tensor
---@param t gpu.Tensor
---@param opts? gpu.CollOpts
---@return gpu.Tensor out
function gpu.all_gather(out, t, opts) end

---Block `rank` of the reduction of every rank's `t` into `out`.
---@param out gpu.Tensor
---@param t gpu.Tensor world_size x numel(out)
---@param opts? gpu.ReduceScatterOpts
---@return gpu.Tensor out
function gpu.reduce_scatter(out, t, opts) end

---Send `t` to rank `peer`.
---@param t gpu.Tensor
---@param peer integer
---@param opts? gpu.CollOpts
---@return gpu.Tensor t
function gpu.send(t, peer, opts) end

---Receive into `t` from rank `peer`.
---@param t gpu.Tensor
---@param peer integer
---@param opts? gpu.CollOpts
---@return gpu.Tensor t
function gpu.recv(t, peer, opts) end

---Run the sends and receives `fn` makes as one group (a ring cannot deadlock).
---@param fn fun()
function gpu.group(fn) end

---Every rank's host (of the group, with `opts.group`) meets here (a counted sync).
---@param opts? gpu.BarrierOpts
function gpu.barrier(opts) end

---A process group of these ranks of the world (nil: all), numbered in list order.
---Collective: every rank calls it with the same list; a rank not in it gets a
---group whose `rank` is nil.
---@param ranks? integer[]
---@param opts? gpu.GroupOpts
---@return gpu.Group
function gpu.new_group(ranks, opts) end

---Split the world: the ranks with the same `color` (nil: none) form a group, numbered
---by `key` (default: the world rank), ties in world-rank order.  Collective.
---@param color? integer
---@param key? integer
---@param opts? gpu.GroupOpts
---@return gpu.Group
function gpu.split_group(color, key, opts) end

-- ---- gpu.Tensor ------------------------------------------------------------

---A tensor: metadata on the host, data where `device` says.  Ops enqueue and
---return at once; `item`, `get`, `totable` sync.  Fields are read-only.
---@class gpu.Tensor
---@field shape integer[] sizes of the dims (a new table)
---@field dtype gpu.dtype element type (the short name: "f32", ...)
---@field device gpu.memory where the data lives
---@field device_index integer 0-based GPU index
---@field ndim integer number of dims
---@field closed boolean whether the tensor has been closed
---@operator add(gpu.Tensor|number): gpu.Tensor
---@operator sub(gpu.Tensor|number): gpu.Tensor
---@operator mul(gpu.Tensor|number): gpu.Tensor
---@operator div(gpu.Tensor|number): gpu.Tensor
---@operator mod(gpu.Tensor|number): gpu.Tensor
---@operator idiv(gpu.Tensor|number): gpu.Tensor
---@operator pow(gpu.Tensor|number): gpu.Tensor
---@operator unm: gpu.Tensor
---@operator len: integer
local Tensor = {}

-- size and values

---Number of elements.
---@return integer
function Tensor:numel() end

---Bytes of the elements.
---@return integer
function Tensor:nbytes() end

---Whether the elements are in C order without gaps.
---@return boolean
function Tensor:is_contiguous() end

---The shape as a new table, or the size of one dim.
---@overload fun(self: gpu.Tensor): integer[]
---@param dim integer 1-based; negative from the end
---@return integer
function Tensor:size(dim) end

---The strides in elements as a table, or the stride of one dim.
---@overload fun(self: gpu.Tensor): integer[]
---@param dim integer 1-based; negative from the end
---@return integer
function Tensor:stride(dim) end

---The number of dims.
---@return integer
function Tensor:dim() end

---The value of a one-element tensor (a sync).
---@param opts? gpu.StreamOpts
---@return number|boolean
function Tensor:item(opts) end

---Element `(i, j, ...)`, 1-based (a sync).
---@param ... integer one index per dim
---@return number|boolean
function Tensor:get(...) end

---Set element `(i, j, ...)` to the last argument (async on device tensors).
---@param ... integer|gpu.scalar one index per dim, then the value
---@return gpu.Tensor self
function Tensor:set(...) end

---The values as nested tables (a sync).
---@param opts? gpu.StreamOpts
---@return table
function Tensor:totable(opts) end

---Write the tensor to a NumPy `.npy` file.
---@param path string
---@param opts? gpu.StreamOpts
---@return gpu.Tensor self
function Tensor:save(path, opts) end

---Release the memory now (also `<close>` and `__gc`).
function Tensor:close() end

-- copies

---Copy `src` (same numel and dtype, any memory) into this tensor; async.
---@param src gpu.Tensor
---@param opts? gpu.StreamOpts
---@return gpu.Tensor self
function Tensor:copy(src, opts) end

---A new tensor in another memory and/or dtype.
---@param x gpu.dtype|gpu.device|gpu.ToOpts
---@param opts? gpu.StreamOpts
---@return gpu.Tensor
function Tensor:to(x, opts) end

---A contiguous copy.
---@param opts? gpu.StreamOpts
---@return gpu.Tensor
function Tensor:clone(opts) end

---This tensor if contiguous, else a contiguous copy.
---@param opts? gpu.StreamOpts
---@return gpu.Tensor
function Tensor:contiguous(opts) end

---Set every element to `v`, in place.
---@param v gpu.scalar
---@param opts? gpu.StreamOpts
---@return gpu.Tensor self
function Tensor:fill(v, opts) end

---Set every element to 0, in place.
---@param opts? gpu.StreamOpts
---@return gpu.Tensor self
function Tensor:zero_(opts) end

-- views (share storage)

---`len` elements of `dim` from `start`.
---@param dim integer
---@param start integer 1-based
---@param len integer
---@return gpu.Tensor
function Tensor:narrow(dim, start, len) end

---The same elements with another shape (contiguous tensors; one -1 inferred).
---@param shape integer[]|integer a table, or the sizes as arguments
---@param ... integer
---@return gpu.Tensor
function Tensor:view(shape, ...) end

---Dims start..end (default 1, -1) merged into one, as reshape (a view when it can be).
---@param start? integer
---@param end_? integer
---@return gpu.Tensor
function Tensor:flatten(start, end_) end

---t repeated reps[k] times along dim k, as torch.tile (a new tensor).
---@param reps integer[]|integer a table, or the counts as arguments
---@param ... integer
---@return gpu.Tensor
function Tensor:tile(reps, ...) end

---A 1-D t on diagonal k of a square matrix of zeros, or a 2-D t's diagonal k (a copy).
---@param k? integer above the main diagonal when > 0 (default 0)
---@return gpu.Tensor
function Tensor:diag(k) end

---A view when the strides allow it, else a contiguous copy; one -1 inferred.
---@param shape integer[]|integer a table, or the sizes as arguments
---@param ... integer
---@return gpu.Tensor
function Tensor:reshape(shape, ...) end

---Dims `d1` and `d2` swapped.
---@param d1 integer
---@param d2 integer
---@return gpu.Tensor
function Tensor:transpose(d1, d2) end

---A 2-D tensor transposed (a 0-D or 1-D one as it is).
---@return gpu.Tensor
function Tensor:t() end

---Dims reordered: dim k of the result is dim `dims[k]`.
---@param dims integer[]|integer a table, or the dims as arguments
---@param ... integer
---@return gpu.Tensor
function Tensor:permute(dims, ...) end

---A dim of size 1 inserted at `d` (1..ndim+1, -1 last).
---@param d integer
---@return gpu.Tensor
function Tensor:unsqueeze(d) end

---Dims of size 1 removed (all, or `d` if its size is 1).
---@param d? integer
---@return gpu.Tensor
function Tensor:squeeze(d) end

---The diagonal along dims `d1` and `d2` (1, 2), dropped, as a new last dim: a view, as `torch.diagonal`.
---@param offset? integer > 0 above the main diagonal (default 0)
---@param d1? integer (default 1)
---@param d2? integer (default 2)
---@return gpu.Tensor
function Tensor:diagonal(offset, d1, d2) end

---Dims of size 1 repeated (stride 0; read-only as an output).
---@param shape integer[]|integer a table, or the sizes as arguments (-1 keeps a size)
---@param ... integer
---@return gpu.Tensor
function Tensor:expand(shape, ...) end

---Index `i` of `dim`, the dim dropped.
---@param dim integer
---@param i integer 1-based, negative from the end
---@return gpu.Tensor
function Tensor:select(dim, i) end

---Elements `i..j` (inclusive) of `dim`, every `step`-th; as `string.sub` takes them.
---@param dim integer
---@param i integer
---@param j? integer (default -1)
---@param step? integer > 0 (default 1)
---@return gpu.Tensor
function Tensor:slice(dim, i, j, step) end

---A table of views along `dim`: pieces of `size`, or of the sizes listed.
---@param size integer|integer[]
---@param dim? integer (default 1)
---@return gpu.Tensor[]
function Tensor:split(size, dim) end

---A table of at most `n` views along `dim`, of `ceil(size/n)` each.
---@param n integer
---@param dim? integer (default 1)
---@return gpu.Tensor[]
function Tensor:chunk(n, dim) end

-- elementwise, one operand: a new tensor (or opts.out); `name_` in place

---`-t`.
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:neg(opts) end
---`-t`, in place.
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:neg_(opts) end

---`|t|`.
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:abs(opts) end
---`|t|`, in place.
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:abs_(opts) end

---`e^t` (float dtypes).
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:exp(opts) end
---`e^t`, in place.
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:exp_(opts) end

---Natural logarithm (float dtypes).
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:log(opts) end
---Natural logarithm, in place.
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:log_(opts) end

---Square root (float dtypes).
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:sqrt(opts) end
---Square root, in place.
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:sqrt_(opts) end

---`1/sqrt(t)` (float dtypes).
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:rsqrt(opts) end
---`1/sqrt(t)`, in place.
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:rsqrt_(opts) end

---`max(t, 0)`.
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:relu(opts) end
---`max(t, 0)`, in place.
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:relu_(opts) end

---`1/(1+e^-t)` (float dtypes).
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:sigmoid(opts) end
---`1/(1+e^-t)`, in place.
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:sigmoid_(opts) end

---Hyperbolic tangent (float dtypes).
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:tanh(opts) end
---Hyperbolic tangent, in place.
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:tanh_(opts) end

---Sine (float dtypes).
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:sin(opts) end
---Sine, in place.
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:sin_(opts) end

---Cosine (float dtypes).
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:cos(opts) end
---Cosine, in place.
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:cos_(opts) end

---Round down (the identity on integers).
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:floor(opts) end
---Round down, in place.
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:floor_(opts) end

---Round up (the identity on integers).
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:ceil(opts) end
---Round up, in place.
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:ceil_(opts) end

---Round half to even (the identity on integers).
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:round(opts) end
---Round half to even, in place.
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:round_(opts) end

---Round toward zero (the identity on integers).
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:trunc(opts) end
---Round toward zero, in place.
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:trunc_(opts) end

---Sign: -1, 0 or 1.
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:sign(opts) end
---Sign: -1, 0 or 1, in place.
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:sign_(opts) end

---`t * t`.
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:square(opts) end
---`t * t`, in place.
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:square_(opts) end

---`not t` as a bool tensor (nonzero is true).
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:logical_not(opts) end

-- elementwise, two operands: x a tensor (same dtype, broadcast) or a number

---`t + x`.
---@param x gpu.Tensor|gpu.scalar
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:add(x, opts) end
---`t + x`, in place.
---@param x gpu.Tensor|gpu.scalar
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:add_(x, opts) end

---`t - x`.
---@param x gpu.Tensor|gpu.scalar
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:sub(x, opts) end
---`t - x`, in place.
---@param x gpu.Tensor|gpu.scalar
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:sub_(x, opts) end

---`t * x`.
---@param x gpu.Tensor|gpu.scalar
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:mul(x, opts) end
---`t * x`, in place.
---@param x gpu.Tensor|gpu.scalar
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:mul_(x, opts) end

---`t / x` (integers floor; integer division by zero raises).
---@param x gpu.Tensor|gpu.scalar
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:div(x, opts) end
---`t / x`, in place.
---@param x gpu.Tensor|gpu.scalar
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:div_(x, opts) end

---`t ^ x`.
---@param x gpu.Tensor|gpu.scalar
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:pow(x, opts) end
---`t ^ x`, in place.
---@param x gpu.Tensor|gpu.scalar
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:pow_(x, opts) end

---C's `fmod` (the sign of `t`).
---@param x gpu.Tensor|gpu.scalar
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:fmod(x, opts) end
---C's `fmod`, in place.
---@param x gpu.Tensor|gpu.scalar
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:fmod_(x, opts) end

---Lua's `%` (the sign of `x`).
---@param x gpu.Tensor|gpu.scalar
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:remainder(x, opts) end
---Lua's `%`, in place.
---@param x gpu.Tensor|gpu.scalar
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:remainder_(x, opts) end

---Lua's `//`: `floor(t / x)`.
---@param x gpu.Tensor|gpu.scalar
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:floor_divide(x, opts) end
---Lua's `//`, in place.
---@param x gpu.Tensor|gpu.scalar
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:floor_divide_(x, opts) end

---Elementwise `max(t, x)`; without `x`, the largest element (a reduction).
---@param x? gpu.Tensor|gpu.scalar|gpu.ReduceOpts
---@param opts? gpu.OutOpts
---@return gpu.Tensor
---@overload fun(self: gpu.Tensor, opts?: gpu.ReduceOpts): gpu.Tensor
function Tensor:max(x, opts) end
---Elementwise `max(t, x)`, in place.
---@param x gpu.Tensor|gpu.scalar
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:max_(x, opts) end

---Elementwise `min(t, x)`; without `x`, the smallest element (a reduction).
---@param x? gpu.Tensor|gpu.scalar|gpu.ReduceOpts
---@param opts? gpu.OutOpts
---@return gpu.Tensor
---@overload fun(self: gpu.Tensor, opts?: gpu.ReduceOpts): gpu.Tensor
function Tensor:min(x, opts) end
---Elementwise `min(t, x)`, in place.
---@param x gpu.Tensor|gpu.scalar
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:min_(x, opts) end

---`t == x` as a bool tensor (Lua's `==` cannot return one).
---@param x gpu.Tensor|gpu.scalar
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:eq(x, opts) end

---`t ~= x` as a bool tensor.
---@param x gpu.Tensor|gpu.scalar
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:ne(x, opts) end

---`t < x` as a bool tensor.
---@param x gpu.Tensor|gpu.scalar
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:lt(x, opts) end

---`t <= x` as a bool tensor.
---@param x gpu.Tensor|gpu.scalar
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:le(x, opts) end

---`t > x` as a bool tensor.
---@param x gpu.Tensor|gpu.scalar
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:gt(x, opts) end

---`t >= x` as a bool tensor.
---@param x gpu.Tensor|gpu.scalar
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:ge(x, opts) end

---`t and x` as a bool tensor (nonzero is true).
---@param x gpu.Tensor|gpu.scalar
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:logical_and(x, opts) end

---`t or x` as a bool tensor (nonzero is true).
---@param x gpu.Tensor|gpu.scalar
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:logical_or(x, opts) end

-- selecting

---`v` where the bool tensor `mask` (broadcast) is true, `t` elsewhere.
---@param mask gpu.Tensor
---@param v gpu.scalar
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:masked_fill(mask, v, opts) end

---`masked_fill`, in place.
---@param mask gpu.Tensor
---@param v gpu.scalar
---@param opts? gpu.StreamOpts
---@return gpu.Tensor self
function Tensor:masked_fill_(mask, v, opts) end

---`log(1 + t)`, accurate near 0 (float dtypes).
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:log1p(opts) end
---`log1p`, in place.
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:log1p_(opts) end

---`exp(t) - 1`, accurate near 0 (float dtypes).
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:expm1(opts) end
---`expm1`, in place.
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:expm1_(opts) end

---base-2 logarithm (float dtypes).
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:log2(opts) end
---`log2`, in place.
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:log2_(opts) end

---base-10 logarithm (float dtypes).
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:log10(opts) end
---`log10`, in place.
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:log10_(opts) end

---`2^t` (float dtypes).
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:exp2(opts) end
---`exp2`, in place.
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:exp2_(opts) end

---tangent (float dtypes).
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:tan(opts) end
---`tan`, in place.
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:tan_(opts) end

---arc sine (NaN outside [-1, 1]) (float dtypes).
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:asin(opts) end
---`asin`, in place.
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:asin_(opts) end

---arc cosine (NaN outside [-1, 1]) (float dtypes).
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:acos(opts) end
---`acos`, in place.
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:acos_(opts) end

---arc tangent (float dtypes).
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:atan(opts) end
---`atan`, in place.
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:atan_(opts) end

---hyperbolic sine (float dtypes).
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:sinh(opts) end
---`sinh`, in place.
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:sinh_(opts) end

---hyperbolic cosine (float dtypes).
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:cosh(opts) end
---`cosh`, in place.
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:cosh_(opts) end

---the error function (float dtypes).
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:erf(opts) end
---`erf`, in place.
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:erf_(opts) end

---`1 / t` (float dtypes).
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:reciprocal(opts) end
---`reciprocal`, in place.
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:reciprocal_(opts) end

---`t/2 * (1 + erf(t/sqrt 2))` (PyTorch's exact gelu) (float dtypes).
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:gelu(opts) end
---`gelu`, in place.
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:gelu_(opts) end

---`t * sigmoid(t)` (float dtypes).
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:silu(opts) end
---`silu`, in place.
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:silu_(opts) end

---`log(1 + e^t)`, `t` above 20 (float dtypes).
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:softplus(opts) end
---`softplus`, in place.
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:softplus_(opts) end

---Whether each element is NaN, as a bool tensor.
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:isnan(opts) end

---Whether each element is +-inf, as a bool tensor.
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:isinf(opts) end

---Whether each element is neither NaN nor inf, as a bool tensor.
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:isfinite(opts) end

---`atan2(t, x)`, the angle of the point (x, t) (float dtypes).
---@param x gpu.Tensor|gpu.scalar
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:atan2(x, opts) end
---`atan2`, in place.
---@param x gpu.Tensor|gpu.scalar
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:atan2_(x, opts) end

---`sqrt(t*t + x*x)` without overflow (float dtypes).
---@param x gpu.Tensor|gpu.scalar
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:hypot(x, opts) end
---`hypot`, in place.
---@param x gpu.Tensor|gpu.scalar
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:hypot_(x, opts) end

---`t > 0 and t or t * slope` (float dtypes).
---@param slope? gpu.Tensor|number the negative slope (default 0.01)
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:leaky_relu(slope, opts) end
---`leaky_relu`, in place.
---@param slope? gpu.Tensor|number the negative slope (default 0.01)
---@param opts? gpu.OutOpts
---@return gpu.Tensor self
function Tensor:leaky_relu_(slope, opts) end

---`t + w * (b - t)` (PyTorch's lerp; float dtypes).
---@param b gpu.Tensor|number
---@param w gpu.Tensor|number
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:lerp(b, w, opts) end
---`lerp`, in place.
---@param b gpu.Tensor|number
---@param w gpu.Tensor|number
---@param opts? gpu.StreamOpts
---@return gpu.Tensor self
function Tensor:lerp_(b, w, opts) end

---NumPy's `|t - b| <= atol + rtol * |b|` (or `t == b`), elementwise: a bool tensor.
---@param b gpu.Tensor|number
---@param opts? gpu.IsCloseOpts
---@return gpu.Tensor
function Tensor:isclose(b, opts) end
---Whether every element is close to `b` (as `isclose`); a sync.
---@param b gpu.Tensor|number
---@param opts? gpu.IsCloseOpts
---@return boolean
function Tensor:allclose(b, opts) end

---NaN, inf and -inf replaced by finite numbers.
---@param opts? gpu.NanToNumOpts
---@return gpu.Tensor
function Tensor:nan_to_num(opts) end
---`nan_to_num`, in place.
---@param opts? gpu.NanToNumOpts
---@return gpu.Tensor self
function Tensor:nan_to_num_(opts) end

---`min(max(t, lo), hi)`; a bound nil for none (not both).
---@param lo gpu.Tensor|number|nil
---@param hi gpu.Tensor|number|nil
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:clamp(lo, hi, opts) end

---`clamp`, in place.
---@param lo gpu.Tensor|number|nil
---@param hi gpu.Tensor|number|nil
---@param opts? gpu.StreamOpts
---@return gpu.Tensor self
function Tensor:clamp_(lo, hi, opts) end

---Matrix product `t @ b` (see `gpu.matmul`).
---@param b gpu.Tensor
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:matmul(b, opts) end

---Batched matrix product (see `gpu.bmm`).
---@param b gpu.Tensor
---@return gpu.Tensor
function Tensor:bmm(b) end

---Outer product of two 1-D tensors (see `gpu.outer`).
---@param b gpu.Tensor
---@return gpu.Tensor
function Tensor:outer(b) end

---Dot product of two 1-D tensors, a 0-dim tensor (see `gpu.dot`).
---@param b gpu.Tensor
---@return gpu.Tensor
function Tensor:dot(b) end

-- reductions: a tensor result, no sync

---Sum (i64 for integers and bool).
---@overload fun(self: gpu.Tensor, dim: integer, opts?: gpu.ReduceOpts): gpu.Tensor
---@param opts? gpu.ReduceOpts
---@return gpu.Tensor
function Tensor:sum(opts) end

---The max over one dim or a table of dims (nil or {}: all), as torch.amax; NaN propagates.
---@overload fun(self: gpu.Tensor, opts: gpu.AmaxOpts): gpu.Tensor
---@param dims? integer|integer[]
---@param opts? gpu.AmaxOpts
---@return gpu.Tensor
function Tensor:amax(dims, opts) end

---The min over one dim or a table of dims (nil or {}: all), as torch.amin; NaN propagates.
---@overload fun(self: gpu.Tensor, opts: gpu.AmaxOpts): gpu.Tensor
---@param dims? integer|integer[]
---@param opts? gpu.AmaxOpts
---@return gpu.Tensor
function Tensor:amin(dims, opts) end

---Mean (f64 for integers).
---@overload fun(self: gpu.Tensor, dim: integer, opts?: gpu.ReduceOpts): gpu.Tensor
---@param opts? gpu.ReduceOpts
---@return gpu.Tensor
function Tensor:mean(opts) end

---Product (i64 for integers and bool).
---@overload fun(self: gpu.Tensor, dim: integer, opts?: gpu.ReduceOpts): gpu.Tensor
---@param opts? gpu.ReduceOpts
---@return gpu.Tensor
function Tensor:prod(opts) end

---1-based i64 index of the first largest element.
---@overload fun(self: gpu.Tensor, dim: integer, opts?: gpu.ReduceOpts): gpu.Tensor
---@param opts? gpu.ReduceOpts
---@return gpu.Tensor
function Tensor:argmax(opts) end

---1-based i64 index of the first smallest element.
---@overload fun(self: gpu.Tensor, dim: integer, opts?: gpu.ReduceOpts): gpu.Tensor
---@param opts? gpu.ReduceOpts
---@return gpu.Tensor
function Tensor:argmin(opts) end

---Whether any element is nonzero (bool).
---@overload fun(self: gpu.Tensor, dim: integer, opts?: gpu.ReduceOpts): gpu.Tensor
---@param opts? gpu.ReduceOpts
---@return gpu.Tensor
function Tensor:any(opts) end

---Whether every element is nonzero (bool).
---@overload fun(self: gpu.Tensor, dim: integer, opts?: gpu.ReduceOpts): gpu.Tensor
---@param opts? gpu.ReduceOpts
---@return gpu.Tensor
function Tensor:all(opts) end

---Variance (float dtypes).
---@overload fun(self: gpu.Tensor, dim: integer, opts?: gpu.VarOpts): gpu.Tensor
---@param opts? gpu.VarOpts
---@return gpu.Tensor
function Tensor:var(opts) end

---Standard deviation (float dtypes).
---@overload fun(self: gpu.Tensor, dim: integer, opts?: gpu.VarOpts): gpu.Tensor
---@param opts? gpu.VarOpts
---@return gpu.Tensor
function Tensor:std(opts) end

---p-norm (float dtypes).
---@overload fun(self: gpu.Tensor, dim: integer, opts?: gpu.NormOpts): gpu.Tensor
---@param opts? gpu.NormOpts
---@return gpu.Tensor
function Tensor:norm(opts) end

---`log(sum(exp(t)))`, max-shifted (float dtypes).
---@overload fun(self: gpu.Tensor, dim: integer, opts?: gpu.ReduceOpts): gpu.Tensor
---@param opts? gpu.ReduceOpts
---@return gpu.Tensor
function Tensor:logsumexp(opts) end

-- along one dim

---Running sum along `dim` (i64 for integers and bool).
---@overload fun(self: gpu.Tensor, opts: gpu.SoftmaxOpts): gpu.Tensor
---@param dim integer
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:cumsum(dim, opts) end

---Running product along `dim` (i64 for integers and bool).
---@overload fun(self: gpu.Tensor, opts: gpu.SoftmaxOpts): gpu.Tensor
---@param dim integer
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:cumprod(dim, opts) end

---Sorted along `dim` (default the last): the values and their 1-based
---positions (i64). Stable; NaN sorts last (first when descending).
---@overload fun(self: gpu.Tensor, dim: integer, opts?: gpu.SortOpts): gpu.Tensor, gpu.Tensor
---@param opts? gpu.SortOpts
---@return gpu.Tensor values
---@return gpu.Tensor indices
function Tensor:sort(opts) end

---The 1-based positions (i64) that sort `dim`, as `t:sort`'s second result.
---@overload fun(self: gpu.Tensor, dim: integer, opts?: gpu.SortOpts): gpu.Tensor
---@param opts? gpu.SortOpts
---@return gpu.Tensor
function Tensor:argsort(opts) end

---The k largest (or smallest) along `dim` (default the last), in order:
---values and 1-based positions (i64).
---@overload fun(self: gpu.Tensor, k: integer, dim: integer, opts?: gpu.TopkOpts): gpu.Tensor, gpu.Tensor
---@param k integer 0..size of dim
---@param opts? gpu.TopkOpts
---@return gpu.Tensor values
---@return gpu.Tensor indices
function Tensor:topk(k, opts) end

---A copy with the elements in reverse order along each of `dims`.
---@param dims integer|integer[]
---@param opts? gpu.StreamOpts
---@return gpu.Tensor
function Tensor:flip(dims, opts) end

---A copy with the elements moved by `shifts` along `dims`, wrapping around;
---without `dims`, over the flattened tensor.
---@overload fun(self: gpu.Tensor, shifts: integer|integer[], opts?: gpu.StreamOpts): gpu.Tensor
---@param shifts integer|integer[]
---@param dims integer|integer[]
---@param opts? gpu.StreamOpts
---@return gpu.Tensor
function Tensor:roll(shifts, dims, opts) end

---A copy with the elements above diagonal `k` of the last two dims zeroed.
---@overload fun(self: gpu.Tensor, opts?: gpu.StreamOpts): gpu.Tensor
---@param k integer the diagonal (default 0; > 0 above the main one)
---@param opts? gpu.StreamOpts
---@return gpu.Tensor
function Tensor:tril(k, opts) end

---A copy with the elements below diagonal `k` of the last two dims zeroed.
---@overload fun(self: gpu.Tensor, opts?: gpu.StreamOpts): gpu.Tensor
---@param k integer the diagonal (default 0; > 0 above the main one)
---@param opts? gpu.StreamOpts
---@return gpu.Tensor
function Tensor:triu(k, opts) end

---Softmax along `dim` (float dtypes); also `t:softmax{dim =}`.
---@param dim integer|gpu.SoftmaxOpts
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:softmax(dim, opts) end

---Log-softmax along `dim` (float dtypes); also `t:log_softmax{dim =}`.
---@param dim integer|gpu.SoftmaxOpts
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:log_softmax(dim, opts) end

-- indexing (1-based indices; one out of range raises at the next sync)

---The slices `idx[1], idx[2], ...` of `dim`.
---@param dim integer
---@param idx gpu.Tensor a 1-D integer tensor
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:index_select(dim, idx, opts) end

---The 1-based indices of the nonzero elements, N x ndim i64 (a sync: it needs N).
---@return gpu.Tensor
function Tensor:nonzero() end

---The elements where the bool mask (broadcast) is true, 1-D (a sync: it needs the count).
---@param mask gpu.Tensor
---@return gpu.Tensor
function Tensor:masked_select(mask) end

---`r[p] = t[p with p[dim] = idx[p]]`, `r` of idx's shape.
---@param dim integer
---@param idx gpu.Tensor an integer tensor
---@param opts? gpu.OutOpts
---@return gpu.Tensor
function Tensor:gather(dim, idx, opts) end

---`t[p with p[dim] = idx[p]] += src[p]`, in place.
---@param dim integer
---@param idx gpu.Tensor an integer tensor
---@param src gpu.Tensor
---@param opts? gpu.StreamOpts
---@return gpu.Tensor self
function Tensor:scatter_add_(dim, idx, src, opts) end

-- ---- gpu.Stream ------------------------------------------------------------

---A queue of device work.  Work on two user streams is ordered only by events and waits.
---@class gpu.Stream
---@field priority "low"|"normal"|"high" scheduling priority
---@field nonblocking boolean whether it is ordered with nothing (not even the default stream)
---@field id integer the stream's number (as in traces)
---@field is_default boolean whether this is the default stream
---@field closed boolean whether the stream has been closed
local Stream = {}

---Later work on this stream waits for `x` (an event, or all work now on a stream).
---@param x gpu.Event|gpu.Stream
---@return gpu.Stream self
function Stream:wait(x) end

---Wait for all work on this stream (a counted sync).
function Stream:synchronize() end

---Whether all work on this stream is done (never waits).
---@return boolean
function Stream:query() end

---A new event recorded on this stream.
---@param opts? gpu.EventOpts
---@return gpu.Event
function Stream:record(opts) end

---Release the stream (also `<close>`, `__gc`); the default stream cannot be closed.
function Stream:close() end

-- ---- gpu.Event -------------------------------------------------------------

---A point in a stream's work: orders streams, measures time.  `ev2 - ev1` is milliseconds.
---@class gpu.Event
---@field timing boolean whether it records times
---@field recorded boolean whether it has been recorded
---@field closed boolean whether the event has been closed
---@operator sub(gpu.Event): number
local Event = {}

---Record the event at the current end of `s`'s work.
---@param s? gpu.Stream (default: the current stream)
---@return gpu.Event self
function Event:record(s) end

---Wait until the event has happened (a counted sync).
function Event:synchronize() end

---Whether the event has happened (never waits).
---@return boolean
function Event:query() end

---Milliseconds from this event to `later` (both timing, recorded and done).
---@param later gpu.Event
---@return number
function Event:elapsed(later) end

---Release the event (also `<close>`, `__gc`).
function Event:close() end

-- ---- gpu.Group -------------------------------------------------------------

---A process group: a communicator over some ranks (`gpu.new_group`, `gpu.split_group`).
---Its methods are the collectives with `group` set; roots and peers are group ranks.
---@class gpu.Group
---@field rank integer? this rank's number in the group (nil: not a member)
---@field size integer? ranks in the group (nil: not a member)
---@field ranks integer[]? the members' world ranks, in group-rank order (a new table)
---@field name string what messages call it: "group {0,2}" or "group 'name'"
---@field closed boolean whether the group has been closed
local Group = {}

---`gpu.all_reduce` over the group.
---@param t gpu.Tensor
---@param opts? gpu.AllReduceOpts
---@return gpu.Tensor result
function Group:all_reduce(t, opts) end

---`gpu.broadcast` over the group (`root` a group rank).
---@param t gpu.Tensor
---@param opts? gpu.BroadcastOpts
---@return gpu.Tensor result
function Group:broadcast(t, opts) end

---`gpu.reduce` over the group (`root` a group rank).
---@param t gpu.Tensor
---@param opts? gpu.ReduceCollOpts
---@return gpu.Tensor result
function Group:reduce(t, opts) end

---`gpu.all_gather` over the group: blocks in group-rank order.
---@param out gpu.Tensor
---@param t gpu.Tensor
---@param opts? gpu.CollOpts
---@return gpu.Tensor out
function Group:all_gather(out, t, opts) end

---`gpu.reduce_scatter` over the group: block `g.rank`.
---@param out gpu.Tensor
---@param t gpu.Tensor
---@param opts? gpu.ReduceScatterOpts
---@return gpu.Tensor out
function Group:reduce_scatter(out, t, opts) end

---`gpu.send` to group rank `peer`.
---@param t gpu.Tensor
---@param peer integer
---@param opts? gpu.CollOpts
---@return gpu.Tensor t
function Group:send(t, peer, opts) end

---`gpu.recv` from group rank `peer`.
---@param t gpu.Tensor
---@param peer integer
---@param opts? gpu.CollOpts
---@return gpu.Tensor t
function Group:recv(t, peer, opts) end

---`gpu.barrier` of the group's ranks.
---@param opts? gpu.BarrierOpts
function Group:barrier(opts) end

---Release the group (also `<close>`, `__gc`); queued and captured collectives keep it until done.
function Group:close() end

-- ---- gpu.Graph -------------------------------------------------------------

---A step captured once by `gpu.graph` and replayed.
---@class gpu.Graph
---@field nodes integer ops captured
---@field name string the graph's name
---@field site string the script line that captured it
---@field closed boolean whether the graph has been closed
local Graph = {}

---Replay the graph on `s`.
---@param s? gpu.Stream (default: the current stream)
function Graph:launch(s) end

---Release the graph and what it keeps alive (also `<close>`, `__gc`).
function Graph:close() end

-- ---- gpu.Task --------------------------------------------------------------

---A function running as a task on the interpreter thread (`gpu.task`).
---@class gpu.Task
---@field done boolean finished, well or not
---@field failed boolean finished with an error (or cancelled)
---@field state gpu.task_state
---@field id integer the task's number
---@field error any the error when failed, else nil
local Task = {}

---The task's results; raises its error, or if it is not done.
---@return any ...
function Task:result() end

---Stop a task that has not finished: it never runs again.
function Task:cancel() end

-- ---- run-time kernels ------------------------------------------------------

---The kernels of a compiled module, by name: `m.saxpy`.  Indexing a missing name raises.
---@class gpu.Module
---@field [string] gpu.Kernel

---A `__global__` kernel.  `k{grid =, block =}` makes a launcher: `k{grid = g, block = 256}(x, n)`.
---@class gpu.Kernel
---@field name string the kernel's name
---@field signature string its `__global__` signature
---@field params gpu.KernelParam[] its parameters
---@field max_threads integer most threads a block
---@field static_shared integer bytes of static shared memory
---@field max_shared integer most bytes of dynamic shared memory
---@overload fun(cfg: gpu.LaunchOpts): gpu.Launcher
local Kernel = {}

---Release the kernel's hold on its module (also `<close>`, `__gc`).
function Kernel:close() end

---A kernel with its launch configuration; call it with the kernel's arguments to launch.
---@class gpu.Launcher
---@overload fun(...: gpu.Tensor|number|boolean|nil)

-- ---- scopes and handles ----------------------------------------------------

---The guard of `gpu.using`: closing it restores the current stream before.
---@class gpu.Using

---A `gpu.nosync` scope: closing it ends the scope.
---@class gpu.NoSync

---A `gpu.range` span: closing it ends the span.
---@class gpu.Range
local Range = {}

---End the span (ranges close innermost first).
function Range:close() end

---A DLPack managed tensor an application hands to scripts; `gpu.from_dlpack` imports it once.
---@class gpu.DLPack

return gpu
