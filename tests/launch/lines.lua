-- Run by tests/launch.lua under `gpulua -n N`: two stdout lines, one stderr
-- line, and a last stdout line without its newline (the launcher ends it).
local r = os.getenv("RANK")
print("out " .. r .. " a")
io.stderr:write("err " .. r .. "\n")
print("out " .. r .. " b")
io.write("tail " .. r)
