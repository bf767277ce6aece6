-- matmul rows through gpulua: n x n x n in f32 and bf16 (cuBLAS on the cuda
-- backend, cublasGemmEx with CUBLAS_COMPUTE_32F as bench/ref.cu calls it).
-- Event timing around each product, warm-up, median of the repeats; a few
-- entries spot-checked against dot products worked out on the host in
-- double.  TFLOP/s = 2 n^3 / time.
package.path = (arg[0]:match("^(.*)/") or ".") .. "/?.lua;" .. package.path
local gpu = require "gpu"
local B = require "benchlib"
local Z = B.sizes

local N = Z.mm_n
local s = gpu.stream()

for _, dt in ipairs { "f32", "bf16" } do
  local key = "matmul_" .. dt
  B.guard(key, function()
    local a = gpu.rand({N, N}, { dtype = dt, seed = 1, stream = s })
    local b = gpu.rand({N, N}, { dtype = dt, seed = 2, stream = s })
    local c = gpu.full({N, N}, 0 / 0, { dtype = dt, stream = s })   -- NaN until written
    local o = { out = c, stream = s }
    local t = {}
    for r = 1 - Z.mm[dt].warm, Z.mm[dt].reps do
      local e0 = s:record { timing = true }
      gpu.matmul(a, b, o)
      local e1 = s:record { timing = true }
      e1:synchronize()
      if r > 0 then t[r] = e1 - e0 end
    end
    local ms = B.median(t)
    B.row(key, 2 * N * N * N / (ms * 1e9), "TFLOP/s", string.format("matmul %d^3 %s", N, dt))
    -- spot check, relative to sum |a_ik b_kj| (inputs in [0, 1))
    local worst = 0
    local hd = { device = "host", dtype = "f64" }
    for _, p in ipairs { { 1, 1 }, { N, N }, { N // 3 + 1, 2 * N // 3 + 1 }, { N // 2 + 2, 8 } } do
      local i, j = p[1], p[2]
      local row = a:narrow(1, i, 1):to(hd):totable()[1]
      local col = b:narrow(2, j, 1):contiguous():to(hd):totable()
      local ref, mag = 0, 0
      for k = 1, N do
        local x = row[k] * col[k][1]
        ref, mag = ref + x, mag + math.abs(x)
      end
      local err = math.abs(c:get(i, j) - ref) / (mag > 0 and mag or 1)
      if not (err <= worst) then worst = err end          -- NaN sticks
    end
    local tol = dt == "bf16" and 1e-2 or 1e-4
    B.check(key, worst <= tol, string.format("relative error %.3g at a spot-checked entry", worst))
    a:close(); b:close(); c:close()
  end)
end

-- The layouts matmul takes without a copy, bf16, as bench/ref.cu calls
-- cuBLAS for them: a:t() @ b (op T on a), and a batch of products
-- (cublasGemmStridedBatchedEx).  Spot checks as above, per batch.
local function layout_row(key, label, a, b, nb, n, at)
  local c = gpu.matmul(a, b, { stream = s })
  local o = { out = c, stream = s }
  local t = {}
  for r = 1 - Z.mm.bf16.warm, Z.mm.bf16.reps do
    local e0 = s:record { timing = true }
    gpu.matmul(a, b, o)
    local e1 = s:record { timing = true }
    e1:synchronize()
    if r > 0 then t[r] = e1 - e0 end
  end
  B.row(key, 2 * nb * n * n * n / (B.median(t) * 1e9), "TFLOP/s", label)
  local worst = 0
  local hd = { device = "host", dtype = "f64" }
  for _, p in ipairs { { 1, 1, 1 }, { nb, n, n }, { nb // 2 + 1, n // 3 + 1, 2 * n // 3 + 1 } } do
    local q, i, j = p[1], p[2], p[3]
    local aq, bq, cq = a, b, c
    if nb > 1 then aq, bq, cq = a:select(1, q), b:select(1, q), c:select(1, q) end
    local row = aq:narrow(1, i, 1):contiguous():to(hd):totable()[1]
    local col = bq:narrow(2, j, 1):contiguous():to(hd):totable()
    local ref, mag = 0, 0
    for k = 1, n do
      local x = row[k] * col[k][1]
      ref, mag = ref + x, mag + math.abs(x)
    end
    local err = math.abs(cq:get(i, j) - ref) / (mag > 0 and mag or 1)
    if not (err <= worst) then worst = err end
  end
  B.check(key, worst <= 1e-2, string.format("relative error %.3g at a spot-checked entry", worst))
end

B.guard("matmul_t_bf16", function()
  local a = gpu.rand({N, N}, { dtype = "bf16", seed = 3, stream = s })
  local b = gpu.rand({N, N}, { dtype = "bf16", seed = 4, stream = s })
  layout_row("matmul_t_bf16", string.format("matmul a:t() @ b %d^3 bf16", N), a:t(), b, 1, N)
  a:close(); b:close()
end)

B.guard("matmul_bmm_bf16", function()
  local nb, n = Z.mm_bmm_batch, Z.mm_bmm_n
  local a = gpu.rand({nb, n, n}, { dtype = "bf16", seed = 5, stream = s })
  local b = gpu.rand({nb, n, n}, { dtype = "bf16", seed = 6, stream = s })
  layout_row("matmul_bmm_bf16", string.format("matmul %d x %d^3 bf16, batched", nb, n), a, b, nb, n)
  a:close(); b:close()
end)

B.finish()
