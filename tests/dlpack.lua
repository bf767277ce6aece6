-- gpu.from_dlpack from a script: only a gpu.DLPack capsule that the
-- application pushed (gpulua_push_dlpack_capsule) is a managed tensor, so a
-- script alone can only get it wrong.  The imports themselves (capsules,
-- ownership, deleters, a bare pointer refused) are in tests/embed/test_dlpack.c.
local gpu = require "gpu"
local T = require "gpu.test"

T.test("gpu.from_dlpack refuses what is not a gpu.DLPack capsule", function()
  local t = gpu.ones({ 2 })
  local cases = {
    { "nil", function() gpu.from_dlpack() end },
    { "a number (an address)", function() gpu.from_dlpack(0x1000) end },
    { "a string", function() gpu.from_dlpack("0x1000") end },
    { "a table", function() gpu.from_dlpack({}) end },
    { "a tensor", function() gpu.from_dlpack(t) end },
    { "a full userdata", function() gpu.from_dlpack(io.stdout) end },
  }
  for _, c in ipairs(cases) do
    T.raises_at(c[2], "bad argument #1 to 'from_dlpack' %(gpu.DLPack %(a capsule from gpulua_push_dlpack_capsule%) expected",
      c[1])
  end
  T.is((t + 1):sum():item(), 4.0, "the runtime still works")
end)

T.done()
