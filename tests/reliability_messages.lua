-- Messages that help (issue 21, item 7): --trace with a file that cannot be
-- written says why (the OS message); errors that gpu.pipeline meets point at
-- the script line that called pipeline.run, or at the stage's own line, and
-- name the stage; send and recv name themselves and the argument; the README
-- names no function that does not exist.
local gpu = require "gpu"
local T = require "gpu.test"
local pipeline = require "gpu.pipeline"

-- ---- --trace ------------------------------------------------------------------

T.test("--trace to a file that cannot be written gives the OS message", function()
  local path = "/nonexistent-dir/x.json"
  local _, oserr = io.open(path, "w")
  local out, ok = T.run("", "--device host --trace " .. path .. " -e 'print(1)'")
  T.ok(not ok, "gpulua exits non-zero")
  T.ok(out:find("cannot write the trace: " .. oserr, 1, true) ~= nil,
       "the message has io.open's: " .. (out:match("[^\n]*") or ""))
  T.ok(not out:find("trace: nil", 1, true), "not 'nil'")
  out, ok = T.run("GPULUA_TRACE=" .. path, "--device host -e 'print(1)'")
  T.ok(not ok and out:find(oserr, 1, true) ~= nil, "GPULUA_TRACE too: " .. (out:match("[^\n]*") or ""))
end)

T.done()
