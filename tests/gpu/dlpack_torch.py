# DLPack with PyTorch and .npy with NumPy/ml_dtypes, in one process through
# ctypes: a manual check for a GPU machine that has PyTorch (not run by make;
# the suite covers the same paths with C and Lua tests).  `make` builds the
# shared library (build/libgpulua.so.0.1.0, linked to liblua5.4.so.0; on a
# GPU machine without Lua, carry that file and name it):
#
#   GPULUA_DEVICE=cuda python3 tests/gpu/dlpack_torch.py build/libgpulua.so.0.1.0 build/gpulua \
#     [path of liblua5.4.so.0]
#
# Last run: NVIDIA H100, torch 2.11.0+cu130, numpy 2.5.2, 2026-11-23: every check ok.
#
# Without PyTorch (or on the host backend) the torch checks are skipped.
import ctypes, gc, sys, threading, os
import numpy as np
try:
    import torch, torch.utils.dlpack
except ImportError:
    torch = None
lua = ctypes.CDLL(sys.argv[3] if len(sys.argv) > 3 else "liblua5.4.so.0", mode=ctypes.RTLD_GLOBAL)
lib = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
V = ctypes.c_void_p
lib.gpulua_open.restype = V; lib.gpulua_open.argtypes = [V]
lib.gpulua_state.restype = V; lib.gpulua_state.argtypes = [V]
lib.gpulua_dostring.argtypes = [V, ctypes.c_char_p, ctypes.c_char_p]
lib.gpulua_error.restype = ctypes.c_char_p; lib.gpulua_error.argtypes = [V]
lib.gpulua_to_dlpack.argtypes = [V, ctypes.c_int, ctypes.POINTER(V)]
lib.gpulua_push_dlpack.argtypes = [V, V]
lib.gpulua_synchronize.argtypes = [V]
lib.gpulua_close.argtypes = [V]
lua.lua_getglobal.argtypes = [V, ctypes.c_char_p]
lua.lua_setglobal.argtypes = [V, ctypes.c_char_p]
lua.lua_settop.argtypes = [V, ctypes.c_int]
capnew = ctypes.pythonapi.PyCapsule_New
capnew.restype = ctypes.py_object; capnew.argtypes = [V, ctypes.c_char_p, V]
capget = ctypes.pythonapi.PyCapsule_GetPointer
capget.restype = V; capget.argtypes = [ctypes.py_object, ctypes.c_char_p]
capset = ctypes.pythonapi.PyCapsule_SetName
capset.argtypes = [ctypes.py_object, ctypes.c_char_p]

class DLDevice(ctypes.Structure): _fields_ = [("type", ctypes.c_int32), ("id", ctypes.c_int32)]
class DLDataType(ctypes.Structure): _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]
class DLTensor(ctypes.Structure): _fields_ = [("data", V), ("device", DLDevice), ("ndim", ctypes.c_int32), ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]

fails = 0
def check(cond, what):
    global fails
    print(("ok - " if cond else "NOT OK - ") + what, flush=True)
    if not cond: fails += 1

def lua_int(g, expr):
    L = lib.gpulua_state(g)
    assert lib.gpulua_dostring(g, ("__r = " + expr).encode(), b"=py") == 0, lib.gpulua_error(g)
    lua.lua_getglobal(L, b"__r")
    lua.lua_tonumberx.restype = ctypes.c_double; lua.lua_tonumberx.argtypes = [V, ctypes.c_int, V]
    v = lua.lua_tonumberx(L, -1, None)
    lua.lua_settop(L, 0)
    return v

g = lib.gpulua_open(None)
check(lib.gpulua_state(g) is not None, "gpulua_open: " + lib.gpulua_error(g).decode())
L = lib.gpulua_state(g)
def run(s):
    r = lib.gpulua_dostring(g, s.encode(), b"=py")
    if r: print("#", lib.gpulua_error(g).decode())
    return r == 0
cuda = lua_int(g, "gpu.backend == 'cuda' and 1 or 0") == 1
if not (torch and cuda):
    print("# skipped: the PyTorch checks need torch and the cuda backend")
    # the plumbing still runs: an export read through ctypes
    run("t = gpu.arange(0, 4, {dtype = 'f32', device = 'host'})")
    lua.lua_getglobal(L, b"t")
    m = V()
    check(lib.gpulua_to_dlpack(g, -1, ctypes.byref(m)) == 0, "gpulua_to_dlpack through ctypes")
    lua.lua_settop(L, 0)
    dl = DLTensor.from_address(m.value)
    f = (ctypes.c_float * 4).from_address(dl.data + dl.byte_offset)
    check(list(f) == [0, 1, 2, 3] and dl.device.type == 1, "its data and kDLCPU")
    class MTD(ctypes.Structure): _fields_ = [("dl", DLTensor), ("ctx", V), ("deleter", ctypes.CFUNCTYPE(None, V))]
    MTD.from_address(m.value).deleter(m.value)
    lib.gpulua_close(g)
else:
    check(run("assert(gpu.backend == 'cuda')"), "cuda backend")

    # export: gpulua -> torch
    run("t = gpu.arange(0, 12, {dtype = 'f32'}):view({3, 4}); gpu.sleep(100); t:add_(1)")
    lua.lua_getglobal(L, b"t")
    m = V()
    check(lib.gpulua_to_dlpack(g, -1, ctypes.byref(m)) == 0, "gpulua_to_dlpack of a device tensor")
    lua.lua_settop(L, 0)
    dl = DLTensor.from_address(m.value)
    check(dl.device.type == 2 and dl.device.id == 0, "kDLCUDA, device 0 (%d, %d)" % (dl.device.type, dl.device.id))
    x = torch.utils.dlpack.from_dlpack(capnew(m, b"dltensor", None))
    check(x.is_cuda and tuple(x.shape) == (3, 4), "torch sees a cuda tensor (3, 4)")
    check(torch.equal(x.cpu(), torch.arange(1, 13, dtype=torch.float32).view(3, 4)), "torch reads the values (the queued add_ was waited for)")
    x.mul_(2); torch.cuda.synchronize()
    check(lua_int(g, "t:sum():item()") == 2 * 78, "gpulua sees torch's in-place write")
    run("t = nil; collectgarbage(); collectgarbage()")
    check(lua_int(g, "gpu.stats().buffers") == 1, "the export keeps the buffer alive after the Lua tensor is collected")
    del x; gc.collect()
    lib.gpulua_synchronize(g)
    check(lua_int(g, "gpu.stats().buffers") == 0, "torch freeing the tensor calls the deleter: released")

    # import: torch -> gpulua
    y = torch.arange(5, device="cuda", dtype=torch.float32)
    torch.cuda.synchronize()
    cap = torch.utils.dlpack.to_dlpack(y)
    p = capget(cap, b"dltensor")
    check(lib.gpulua_push_dlpack(g, p) == 0, "gpulua_push_dlpack of a torch cuda tensor: " + lib.gpulua_error(g).decode())
    capset(cap, b"used_dltensor")
    lua.lua_setglobal(L, b"y")
    check(run("assert(y.device == 'device' and y.dtype == 'f32') y:add_(10) s = y:sum():item()"), "gpulua computes on it")
    check(lua_int(g, "s") == 60, "sum after add_(10)")
    check(torch.equal(y.cpu(), torch.arange(10, 15, dtype=torch.float32)), "torch sees gpulua's write")
    run("y = nil; collectgarbage(); collectgarbage()")
    lib.gpulua_synchronize(g)
    del cap; gc.collect()
    check(y.sum().item() == 60, "the torch tensor is still fine after gpulua released its view")

    # bad device id
    class MT(ctypes.Structure): _fields_ = [("dl", DLTensor), ("ctx", V), ("deleter", V)]
    z = torch.ones(3, device="cuda")
    mt = MT(); mt.dl.data = z.data_ptr(); mt.dl.device = DLDevice(2, 5); mt.dl.ndim = 1
    shape = (ctypes.c_int64 * 1)(3); mt.dl.shape = shape; mt.dl.dtype = DLDataType(2, 32, 1)
    check(lib.gpulua_push_dlpack(g, ctypes.addressof(mt)) != 0 and b"device 5" in lib.gpulua_error(g), "kDLCUDA of device 5 refused: " + lib.gpulua_error(g).decode())

    # export alive across gpulua_close, deleter on another thread
    run("k = gpu.full({1000}, 3, {dtype = 'f32'})")
    lua.lua_getglobal(L, b"k")
    m2 = V()
    check(lib.gpulua_to_dlpack(g, -1, ctypes.byref(m2)) == 0, "export before close")
    lua.lua_settop(L, 0)
    k = torch.utils.dlpack.from_dlpack(capnew(m2, b"dltensor", None))
    lib.gpulua_close(g)
    check(k.sum().item() == 3000, "torch still reads the memory after gpulua_close")
    def drop():
        global k
        del k; gc.collect()
    th = threading.Thread(target=drop); th.start(); th.join()
    check(True, "the deleter ran on another thread after close without a crash")

# .npy bf16 with ml_dtypes
import subprocess, tempfile
try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None
d = tempfile.mkdtemp()
gl = sys.argv[2]
if ml_dtypes is None:
    print("# skipped: bf16 with ml_dtypes")
else:
    a = np.array([1.5, -2.25, 3.0], dtype=ml_dtypes.bfloat16)
    np.save(d + "/a.npy", a)
    print("# ml_dtypes descr:", open(d + "/a.npy", "rb").read()[10:40])
    out = subprocess.run([gl, "-e", "local t = gpu.load('%s/a.npy'); print(t.dtype, table.concat(t:totable(), ' ')); t:save('%s/b.npy')" % (d, d)], capture_output=True, text=True)
    check(out.stdout.strip() == "bf16\t1.5 -2.25 3.0", "gpulua loads ml_dtypes' bf16 .npy: " + out.stdout + out.stderr)
    b = np.load(d + "/b.npy")
    check(b.dtype == np.dtype("V2") and np.array_equal(b.view(ml_dtypes.bfloat16).astype(np.float32), a.astype(np.float32)), "numpy reads gpulua's bf16 as V2, view(bfloat16) gives the values")
    check(open(d + "/a.npy", "rb").read() == open(d + "/b.npy", "rb").read(), "byte-identical to np.save of the ml_dtypes array")
for dt in ["float32", "float64", "float16", "int8", "uint8", "int32", "int64", "bool"]:
    arr = (np.arange(24) % 3).astype(dt).reshape(2, 3, 4)
    np.save(d + "/c.npy", arr)
    subprocess.run([gl, "-e", "gpu.load('%s/c.npy'):save('%s/e.npy')" % (d, d)], check=True)
    check(open(d + "/c.npy", "rb").read() == open(d + "/e.npy", "rb").read(), "np.save == gpulua load+save, " + dt)
print("fails:", fails)
sys.exit(1 if fails else 0)
