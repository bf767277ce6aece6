-- The `gpu` module (gpu.so, the bindings) for a stock Lua 5.4, built from a
-- checkout by the Makefile and installed into a LuaRocks tree:
--
--   luarocks --lua-version 5.4 make                 # the system tree (/usr/local)
--   luarocks --lua-version 5.4 make --local         # ~/.luarocks
--   luarocks --lua-version 5.4 make --tree DIR      # DIR
--
-- It builds in build-rock/ (BUILD=build-rock), never in a developer's
-- build/.  The Makefile builds the host backend always, and the CUDA
-- backend where a GPU is (and nvcc); from the environment, CUDA=1 builds it
-- anyway, NOCUDA=1 never, and MAKEFLAGS=-jN sets the jobs (default: one
-- per core): CUDA=1 luarocks make.
--
-- Needs Lua 5.4's headers (LUA_INCDIR, from luarocks' configuration) and a
-- liblua for a build tool to link: by default Debian's
-- /usr/lib/<multiarch>/liblua5.4.a (liblua5.4-dev); for another Lua, set
-- LUA_A=/path/to/liblua.a in the environment (luarocks 3 sets LUA_LIBDIR
-- only for rocks that link Lua, so the rockspec cannot pass it on).
-- docs/ (the man page, the LuaLS annotations of docs/types/) is copied into
-- the rock's documentation: luarocks doc gpulua.
rockspec_format = "3.0"
package = "gpulua"
version = "0.3.0-1"
source = {
   -- gpulua has no public repository yet: `luarocks make` builds the
   -- checkout it runs in and reads no URL; `luarocks build` cannot fetch.
   url = "git+https://gpulua.invalid/gpulua.git",
   tag = "v0.3.0",
}
description = {
   summary = "GPU pipelines from Lua: streams, events, pinned buffers and device tensors",
   detailed = [[
The gpu module of gpulua for a stock Lua 5.4: tensors in device, pinned and
pageable memory, streams and events, copy/compute overlap, run-time
kernels, collectives across ranks, pipelines (gpu.pipeline), tracing
(gpu.trace) and a TAP test library (gpu.test). On an NVIDIA GPU through
CUDA, or on the host backend (CPU threads with the same semantics) when
there is none.
]],
   license = "MIT",
   labels = { "gpu", "cuda", "tensor" },
}
dependencies = {
   "lua >= 5.4, < 5.5",
}
build = {
   type = "make",
   build_target = "build-rock/gpu.so",
   build_variables = {
      BUILD = "build-rock",
      CFLAGS = "$(CFLAGS)",
      LUA_INC = "$(LUA_INCDIR)",
   },
   -- not `make install` (the whole of gpulua): gpu.so alone, into the
   -- tree's lib/lua/5.4/, where luarocks records it for `luarocks remove`
   install_pass = false,
   install = {
      lib = { gpu = "build-rock/gpu.so" },
   },
   copy_directories = { "docs" },
}
