---@meta gpu.test
-- LuaLS annotations for `require "gpu.test"`, the TAP producer of gpulua's
-- own tests (stdlib/gpu/test.lua; its header is the reference).  Checked by
-- tests/annotations.lua.

---A Lua pattern, or a list of them (any may match); each is also tried as plain text.
---@alias gpu.test.pattern string|string[]

---@class gpu.test.TestFlags
---@field keeps? boolean the test keeps buffers, streams or events on purpose: no leak check after it

---@class gpu.test.DoneFlags
---@field leak_check? boolean false: skip the final leak check
---@field exit? boolean false: return the failures instead of exiting

---A tolerance: relative and absolute at once, or each.
---@class gpu.test.Tolerance
---@field rel? number relative tolerance (default 0)
---@field abs? number absolute tolerance (default 0)

---TAP test scripts: assertions, tests with leak checks, reference arithmetic, child processes.
---@class gpulua.test
---@field LEAK_TESTS integer results T.done's final leak check adds to the plan
---@field gpulua string the interpreter running this test (for child processes)
---@field slowdown number how many times slower this run may be (GPULUA_TEST_SLOWDOWN, default 1): scale time-based premises by it
---@field dtypes string[] every dtype's short name
---@field float_dtypes string[] the float dtypes
---@field int_dtypes string[] the integer dtypes (not bool)
---@field dtype_size table<string, integer> bytes of an element, by dtype
local T = {}

-- output and plan

---Print a `# ` comment line (each line of msg).
---@param msg any
function T.diag(msg) end

---Print the plan: n of the script's results, plus the final leak check's.
---@param n integer
function T.plan(n) end

---A value as the assertions show it (deep, floats as floats).
---@param v any
---@param depth? integer nesting already shown
---@return string
function T.fmt(v, depth) end

-- assertions: each reports one result and returns whether it passed

---Passes when cond is true.
---@param cond any
---@param name? string
---@return boolean
function T.ok(cond, name) end

---Passes when got equals expected, deeply (NaN equals NaN).
---@param got any
---@param expected any
---@param name? string
---@return boolean
function T.is(got, expected, name) end

---Passes when got differs from unexpected, deeply.
---@param got any
---@param unexpected any
---@param name? string
---@return boolean
function T.isnt(got, unexpected, name) end

---Passes when two tensors are equal bit for bit as values: the same dtype
---and shape, each element equal (NaN equals NaN, -0 is not 0).
---@param got gpu.Tensor
---@param want gpu.Tensor
---@param name? string
---@return boolean
function T.same(got, want, name) end

---nil when T.same(got, want) would pass; else the first difference.
---@param got gpu.Tensor
---@param want gpu.Tensor
---@return string?
function T.differ(got, want) end

---Passes when numbers (or nested tables of them) agree within tol.
---@param got number|table
---@param expected number|table
---@param tol number|gpu.test.Tolerance
---@param name? string
---@return boolean
function T.near(got, expected, tol, name) end

---Passes when fn() raises an error matching pattern; the message.
---@param fn function
---@param pattern gpu.test.pattern
---@param name? string
---@return string? msg
function T.raises(fn, pattern, name) end

---As T.raises, and the message must start with fn's file and a line of its body.
---@param fn function
---@param pattern gpu.test.pattern
---@param name? string
---@return string? msg
function T.raises_at(fn, pattern, name) end

---Report a skipped result.
---@param name string
---@param why? string
---@return boolean
function T.skip(name, why) end

-- tests

---Run fn as a test: an error fails it (with its traceback), then a leak check.
---@param name string
---@param fn function
---@param opts? gpu.test.TestFlags
---@return boolean passed
function T.test(name, fn, opts) end

---The final leak check and the plan; exits non-zero on any failure.
---@param opts? gpu.test.DoneFlags
---@return integer? failures (with exit = false)
function T.done(opts) end

---Failures so far.
---@return integer
function T.failures() end

-- child processes and files

---Run `env gpulua args` through the shell; its output and whether it exited 0.
---@param env? string environment assignments
---@param args string arguments
---@param redirect? string shell redirections (default "2>&1")
---@return string output
---@return boolean exited_0
function T.run(env, args, redirect) end

---Run a shell command; its stdout and exit status (128 + signal).
---@param cmd string
---@return string output
---@return integer status
function T.sh(cmd) end

---A file's contents, or nil.
---@param path string
---@return string?
function T.readfile(path) end

---A new temporary file holding contents; its path.
---@param contents string
---@return string path
function T.tmpfile(contents) end

-- reference arithmetic

---x rounded to f16, nearest even.
---@param x number
---@return number
function T.round_f16(x) end

---x rounded to bf16, nearest even.
---@param x number
---@return number
function T.round_bf16(x) end

---x rounded to f32, nearest even.
---@param x number
---@return number
function T.round_f32(x) end

---Two's-complement wrap of integer x to `bits` bits.
---@param x integer
---@param bits integer
---@param signed boolean
---@return integer
function T.wrap_int(x, bits, signed) end

---Whether dtype is a float dtype.
---@param dtype string
---@return boolean
function T.is_float(dtype) end

---Whether dtype is an integer dtype (not bool).
---@param dtype string
---@return boolean
function T.is_int(dtype) end

---The smallest and largest value of an integer dtype.
---@param dtype string
---@return integer lo
---@return integer hi
function T.int_range(dtype) end

---The value x becomes when stored in dtype (the README's cast rules).
---@param x number|boolean
---@param dtype string
---@return number|boolean
function T.cast(x, dtype) end

---A nested table flattened into a list.
---@param t any
---@param acc? any[] list to append to
---@return any[]
function T.flatten(t, acc) end

---f applied to every leaf of a nested table; a new nested table.
---@param t any
---@param f fun(x: any): any
---@return any
function T.map(t, f) end

return T
