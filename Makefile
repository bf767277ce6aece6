# gpulua — the one Makefile.
#
#   make             build/libgpulua.a, build/libgpulua.so.<version>, build/gpu.so
#                    (the Lua module) and build/gpulua (prints what it found);
#                    in parallel (one job per core) unless -j says otherwise.
#                    The CUDA backend is built where a GPU is (or with CUDA=1,
#                    or when $(BUILD) already has it); NOCUDA=1 (CUDA=0): never
#   make test        build, run the suite (prove over tests/*.lua and the C
#                    tests), then the same suite under ASan+UBSan (test-asan)
#   make suite       the suite of one build only, no sanitizer run (it first
#                    installs into $(BUILD)/stage and builds the example
#                    application against it: $(BUILD)/example/)
#   make test-asan   the suite in a separate ASan+UBSan build, build-asan/
#   make test-gpu    on a GPU machine: the suite and tests/gpu on the cuda backend
#   make check-cuda  build everything with CUDA=1 in build-cuda/ (CI: the CUDA
#                    code keeps compiling with -Werror where no GPU is), then
#                    every op as a fused kernel through NVRTC (no GPU needed)
#   make test-gpu-sanitize  the same under compute-sanitizer (memcheck on every
#                    file; racecheck and synccheck on the kernel tests), by
#                    tests/gpu_sanitize.sh
#   make fuzz        the fuzzers of tests/fuzz/ under ASan+UBSan: libFuzzer on the
#                    .npy header reader, the kernel-signature parsers and the
#                    kernel cache's entry reader (clang),
#                    and the random API fuzzer tests/fuzz/api.lua; FUZZ_SECONDS
#                    each (default 60) over the seeds FUZZ_SEEDS (default 1 2 3);
#                    a failure prints its seed and a minimal reproducer
#   make install     PREFIX=/usr/local (and DESTDIR=): bin/gpulua, lib/libgpulua.a,
#                    lib/libgpulua.so*, include/gpulua.h, lib/lua/5.4/gpu.so (the
#                    bindings for a stock lua5.4), share/lua/5.4/gpu/*.lua (the
#                    stdlib, also embedded), lib/pkgconfig/gpulua.pc,
#                    share/man/man1/gpulua.1, share/gpulua/types/*.lua (LuaLS
#                    annotations); make uninstall
#   make run         build, then run scripts/overlap.lua  (alias: make example)
#   make bench       on a GPU machine: bench/*.lua through gpulua beside the raw
#                    CUDA C reference (build/bench/ref), the raw NCCL all_reduce
#                    sweep (build/bench/nccl_ref) and PyTorch where it imports;
#                    prints a table and appends it to bench/RESULTS.md.
#                    BENCH_QUICK=1: small sizes (a smoke test, also on the host)
#   make deps        install the missing Debian packages (as root), otherwise
#                    print the sudo command; `make deps run` works in one go
#   make clean
#
# Variables: NOBUILD=1 runs suite/test/run/bench on the existing build without
# building anything (a build copied to a machine without the toolchain);
# BUILD (build dir), LUA_A, LUA_SO, LUA_INC, NVCC, CUDA, NOCUDA, PROVE,
# PROVE_FLAGS, SUITE_JOBS (test files at a time in suite/test); CFLAGS
# and LDFLAGS are appended to ours; FUZZ_SECONDS, FUZZ_SEEDS,
# FUZZ_MINIMIZE_SECONDS (time to reduce a failure) and FUZZ_CC for make fuzz.

.DEFAULT_GOAL := all
MAKEFLAGS += --no-builtin-rules
# Parallel by default, one job per core; an explicit -j (or -j1) wins.
NPROC := $(shell nproc 2>/dev/null || echo 1)
ifeq ($(filter -j% j%,$(MAKEFLAGS)),)
MAKEFLAGS += -j$(NPROC)
endif
.SUFFIXES:
.DELETE_ON_ERROR:

BUILD ?= build
ASAN_BUILD := build-asan
PROVE ?= prove

MULTIARCH := $(or $(shell $(CC) -print-multiarch 2>/dev/null),x86_64-linux-gnu)
PKGCONF := $(shell command -v pkg-config 2>/dev/null)
pkgconf_has = $(if $(PKGCONF),$(shell $(PKGCONF) --exists $(1) 2>/dev/null && echo yes))

# ---- what this machine has ------------------------------------------------

ifeq ($(origin NVCC),undefined)
NVCC := $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
endif

# The CUDA backend: nvcc plus the static cudart beside it.
CUDA_HOME ?= $(if $(NVCC),$(patsubst %/bin/,%,$(dir $(realpath $(NVCC)))))
CUDART_A := $(if $(CUDA_HOME),$(wildcard $(CUDA_HOME)/lib64/libcudart_static.a))
CUDA_TOOLKIT := $(if $(and $(NVCC),$(CUDART_A),$(wildcard $(CUDA_HOME)/include/cuda_runtime_api.h),$(wildcard cuda/cuda/k_launch.cu)),yes)
# A GPU on this machine: the NVIDIA driver lists one.
HAVE_GPU := $(if $(wildcard /proc/driver/nvidia/gpus/* /dev/nvidia0),yes)
# Whether to build the CUDA backend.  nvcc takes minutes on a small machine,
# so it is built where it can run (a GPU here), where asked (CUDA=1: a build
# to carry to a GPU machine), or where this build dir already has it (so a
# plain `make` after `make CUDA=1` does not drop it).  NOCUDA=1 or CUDA=0:
# never.
CUDA_WANT :=
ifneq ($(filter 1,$(NOCUDA))$(filter 0,$(CUDA)),)
CUDA_WHY := not built (NOCUDA=1 or CUDA=0)
else ifeq ($(CUDA),1)
CUDA_WANT := yes
CUDA_WHY := built (CUDA=1)
else ifneq ($(HAVE_GPU),)
CUDA_WANT := yes
CUDA_WHY := built (this machine has a GPU)
else ifneq ($(wildcard $(BUILD)/obj/cuda/cuda/k_launch.o),)
CUDA_WANT := yes
CUDA_WHY := built ($(BUILD) was built with it; NOCUDA=1 or make clean drops it)
else
CUDA_WHY := not built (no GPU here: make CUDA=1 builds it anyway)
endif
CUDA_FOUND := $(and $(CUDA_WANT),$(CUDA_TOOLKIT))
ifeq ($(CUDA),1)
ifeq ($(CUDA_TOOLKIT),)
$(error CUDA=1 but no CUDA toolkit: need nvcc ($(or $(NVCC),not found)), its static cudart and cuda_runtime_api.h)
endif
endif
CUDA_ARCH ?= -gencode arch=compute_90,code=[sm_90,compute_90]
# Every kernel image compressed (nvcc leaves some as they are): 17.5 MB of
# fatbin becomes about 7.  The driver decompresses what it loads; the kernels
# load in the background (cuda/cuda/loader.c), so start-up pays only for the
# few that a script's first ops use (bench/RESULTS.md, 2026-11-25).
# (--compress-mode=speed made k_reduce's image larger than none: 8.6 MB.)
FATBIN_FLAGS ?= -Xfatbin -compress-all

# Lua 5.4 is linked statically: the GPU machines have no liblua.
ifeq ($(origin LUA_A),undefined)
LUA_A := /usr/lib/$(MULTIARCH)/liblua5.4.a
endif
ifeq ($(origin LUA_INC),undefined)
LUA_INC := $(or $(patsubst -I%,%,$(firstword $(filter -I%,$(if $(call pkgconf_has,lua5.4),$(shell $(PKGCONF) --cflags lua5.4))))),/usr/include/lua5.4)
endif
LUA_FOUND := $(if $(and $(wildcard $(LUA_A)),$(wildcard $(LUA_INC)/lua.h)),yes)
# libgpulua.so links the shared liblua (one Lua per process with the
# application's); gpu.so links no Lua at all (the loading lua5.4 has it).
LUA_SO ?= $(LUA_A:.a=.so)

ifeq ($(call pkgconf_has,libedit),yes)
EDIT_FOUND := yes
EDIT_CFLAGS := $(shell $(PKGCONF) --cflags libedit)
EDIT_LIBS := $(shell $(PKGCONF) --libs libedit)
else ifneq ($(and $(wildcard /usr/include/editline/readline.h),$(wildcard /usr/lib/$(MULTIARCH)/libedit.so)),)
EDIT_FOUND := yes
EDIT_LIBS := -ledit
endif

ifeq ($(call pkgconf_has,openblas),yes)
BLAS_FOUND := yes
BLAS_CFLAGS := $(shell $(PKGCONF) --cflags openblas)
else ifneq ($(and $(wildcard /usr/include/$(MULTIARCH)/cblas.h),$(wildcard /usr/lib/$(MULTIARCH)/libopenblas.so)),)
BLAS_FOUND := yes
endif
# zlib: the deflated members of .npz files (bindings/zip.c); without it,
# stored members only (CRC-32 by a built-in loop).
ifeq ($(call pkgconf_has,zlib),yes)
ZLIB_FOUND := yes
ZLIB_CFLAGS := $(shell $(PKGCONF) --cflags zlib)
ZLIB_LIBS := $(shell $(PKGCONF) --libs zlib)
else ifneq ($(and $(wildcard /usr/include/zlib.h),$(wildcard /usr/lib/$(MULTIARCH)/libz.so)),)
ZLIB_FOUND := yes
ZLIB_LIBS := -lz
endif

# OpenBLAS is not linked: cuda/cpu_matmul.c loads libopenblas.so.0 with dlopen
# at the first host matmul (its header is all the build needs).

# Print the findings once per invocation (sub-makes get GPULUA_QUIET=1).
PRINT_GOALS := $(filter-out clean,$(or $(MAKECMDGOALS),all))
ifneq ($(GPULUA_QUIET),1)
ifneq ($(PRINT_GOALS),)
$(info gpulua: nvcc      $(if $(CUDA_FOUND),found ($(NVCC)): building the CUDA and host backends (cudart static; cuBLAS loaded at run time),$(if $(CUDA_TOOLKIT),found ($(NVCC)); CUDA backend $(CUDA_WHY): building the host backend only,$(if $(NVCC),found, but no static cudart or cuda/cuda/k_launch.cu: building the host backend only,not found: building the host backend only))))
$(info gpulua: liblua5.4 $(if $(LUA_FOUND),found ($(LUA_A) linked statically; headers $(LUA_INC)),not found (need $(LUA_A) and $(LUA_INC)/lua.h)))
$(info gpulua: libedit   $(if $(EDIT_FOUND),found (REPL line editing),not found (REPL reads plain lines)))
$(info gpulua: zlib      $(if $(ZLIB_FOUND),found (.npz files stored and deflated),not found (.npz files stored only)))
$(info gpulua: OpenBLAS  $(if $(BLAS_FOUND),found (host matmul f32/f64 through cblas, libopenblas.so.0 loaded at run time),not found (matmul through the built-in loops)))
endif
endif

# ---- flags -----------------------------------------------------------------

DEFS := -D_GNU_SOURCE $(if $(EDIT_FOUND),-DGPULUA_HAVE_LIBEDIT) $(if $(BLAS_FOUND),-DGPULUA_HAVE_OPENBLAS) $(if $(ZLIB_FOUND),-DGPULUA_HAVE_ZLIB) $(if $(CUDA_FOUND),-DGPULUA_HAVE_CUDA)
INCLUDES := -iquote . -iquote interp/lib -iquote bindings -iquote cuda -I$(LUA_INC) $(EDIT_CFLAGS) $(BLAS_CFLAGS) $(ZLIB_CFLAGS) $(if $(CUDA_FOUND),-isystem $(CUDA_HOME)/include)
# The gpulua program (interp/cli/) sees the library through gpulua.h alone.
CLI_INCLUDES := -iquote interp/lib -I$(LUA_INC) $(EDIT_CFLAGS)
OPT := -O2 -g
SAN :=
ifeq ($(SANITIZE),1)
OPT := -O1 -g
SAN := -fsanitize=address,undefined -fno-omit-frame-pointer
SUITE_ENV := ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=1 \
             UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 GPULUA_SANITIZE=1
endif
# -fPIC: one set of objects serves libgpulua.a, libgpulua.so and gpu.so.
ALL_CFLAGS = -std=c11 -Wall -Wextra -Werror $(OPT) $(SAN) -fPIC -fno-semantic-interposition -pthread -MMD -MP $(DEFS) $(or $(OBJ_INCLUDES),$(INCLUDES)) $(CFLAGS)
ALL_LDFLAGS = $(SAN) -pthread $(LDFLAGS)
# -fmad=false: no FMA across two roundings; a fused op (cuda/cuda/fgen.c)
# must give the unfused ops' results, and the host backend has no FMA.
NVCCFLAGS = -std=c++17 -O3 -fmad=false $(CUDA_ARCH) $(FATBIN_FLAGS) -Xcompiler -Wall,-Wextra,-Werror,-fPIC,-fno-semantic-interposition -MMD -MP -Icuda $(NVCC_EXTRA)
SYSLIBS := $(if $(CUDA_FOUND),$(CUDART_A) -lrt -lstdc++) $(ZLIB_LIBS) -lm -ldl -lpthread

# ---- what gets built -------------------------------------------------------

# Files are picked by folder (docs/internals.md, "Layout"): the library is the device
# layer (cuda/), its backends (cuda/host/ always, cuda/cuda/ when nvcc is
# found), the bindings and interp/lib/; gpu.so adds interp/module/ and drops
# the runtime; the gpulua program is interp/cli/; interp/tools/ runs at build
# time.
LIB_SRC := $(sort $(wildcard cuda/*.c cuda/host/*.c) $(if $(CUDA_FOUND),$(wildcard cuda/cuda/*.c)) \
             $(wildcard bindings/*.c interp/lib/*.c))
CU_SRC := $(if $(CUDA_FOUND),$(sort $(wildcard cuda/cuda/*.cu)))
CLI_SRC := $(sort $(wildcard interp/cli/*.c))
LUAMOD_SRC := $(sort $(wildcard interp/module/*.c))
# tests/fuzz/replay_*.c replay the fuzz targets' corpus and crashes (make fuzz)
CTEST_SRC := $(sort $(wildcard tests/embed/*.c tests/unit/*.c tests/fuzz/replay_*.c))
STDLIB_LUA := $(sort $(shell find stdlib -name '*.lua' 2>/dev/null))
# Directories too, so adding or removing a module regenerates the table.
STDLIB_DIRS := $(sort $(shell find stdlib -type d 2>/dev/null))
LUA_TESTS := $(sort $(wildcard tests/*.lua) $(wildcard tests/gpu/*.lua))

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))
LIB_OBJ := $(call obj,$(LIB_SRC)) $(patsubst %.cu,$(BUILD)/obj/%.o,$(CU_SRC)) $(BUILD)/obj/gen/stdlib.o \
           $(BUILD)/obj/gen/hk_rt.o $(if $(CUDA_FOUND),$(BUILD)/obj/gen/fused_hdr.o)
CLI_OBJ := $(call obj,$(CLI_SRC))
CTESTS := $(patsubst tests/%.c,$(BUILD)/tests/%,$(CTEST_SRC))
PTY_TOOL := $(BUILD)/tests/tools/pty
# Keep the C tests' objects, which only a pattern rule mentions.  Only those:
# a bare .SECONDARY makes every target intermediate, and then a missing
# library object is not rebuilt while the library is newer than its sources.
.SECONDARY: $(patsubst tests/%.c,$(BUILD)/obj/tests/%.o,$(CTEST_SRC))
LIB := $(BUILD)/libgpulua.a
BIN := $(BUILD)/gpulua
EMBED := $(BUILD)/embed
# The raw CUDA C reference of `make bench`, and its raw NCCL all_reduce
# reference where the toolkit has NCCL; built with the CUDA backend (not in
# the sanitizer build), so that they travel with build/ to a GPU machine.
BENCH_REF := $(BUILD)/bench/ref
BENCH_NCCL_REF := $(BUILD)/bench/nccl_ref
BENCH_NCCL_FOUND := $(if $(and $(CUDA_FOUND),$(wildcard $(CUDA_HOME)/include/nccl.h),$(wildcard $(CUDA_HOME)/lib64/libnccl.so)),yes)
# The shared library, the Lua module and the pkg-config file (see "shared
# library, Lua module, install" below).
VERSION := $(shell sed -n 's/^\#define GPULUA_VERSION_STRING "\(.*\)"/\1/p' interp/lib/gpulua.h)
SOVERSION := $(firstword $(subst ., ,$(VERSION)))
SO := $(BUILD)/libgpulua.so.$(VERSION)
LUAMOD := $(BUILD)/gpu.so
PC_IN := $(BUILD)/gpulua.pc.in
STAGE := $(BUILD)/stage
EXAMPLES := $(BUILD)/example/app $(BUILD)/example/app-static
TWOSTATES := $(if $(wildcard $(LUA_SO)),$(BUILD)/tests/luamod/twostates)
BENCH_BUILT := $(if $(CUDA_FOUND),$(if $(filter 1,$(SANITIZE)),,$(BENCH_REF) $(if $(BENCH_NCCL_FOUND),$(BENCH_NCCL_REF))))

# Building needs liblua; `deps` and `clean` do not, nor anything under NOBUILD=1.
ifneq ($(NOBUILD),1)
ifeq ($(filter deps,$(MAKECMDGOALS)),)
ifneq ($(filter-out clean,$(or $(MAKECMDGOALS),all)),)
ifeq ($(LUA_FOUND),)
$(error liblua5.4 not found: run `make deps` (or set LUA_A= and LUA_INC=))
endif
endif
endif
endif

.PHONY: all lib tests suite test test-asan test-gpu test-gpu-sanitize check-cuda run example bench deps clean \
        install uninstall fuzz fuzz-cc FORCE

ifneq ($(and $(filter deps,$(MAKECMDGOALS)),$(filter-out deps,$(MAKECMDGOALS))),)
# `make deps run`: what was detected above predates the install, so the other
# goals run in a fresh make after `deps`.
$(filter-out deps,$(MAKECMDGOALS)): deps
	@$(MAKE) --no-print-directory $@
else

all: $(LIB) $(BIN) $(SO) $(LUAMOD) $(PC_IN) $(BENCH_BUILT)
lib: $(LIB)
tests: $(CTESTS) $(EXAMPLES) $(TWOSTATES) $(PTY_TOOL)

# The pseudo-terminal driver of tests/repl.lua (a tool, not a TAP test).
$(PTY_TOOL): $(BUILD)/obj/tests/tools/pty.o
	@mkdir -p $(@D)
	$(CC) $(ALL_LDFLAGS) -o $@ $<

# Objects are rebuilt when the flags change (a build dir from before -fPIC).
$(BUILD)/cflags: FORCE
	@mkdir -p $(@D)
	@printf '%s\n' '$(ALL_CFLAGS)' '$(NVCCFLAGS)' > $@.tmp
	@if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv $@.tmp $@; fi

$(BUILD)/obj/%.o: %.c $(BUILD)/cflags
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -c -o $@ $<
$(CLI_OBJ): OBJ_INCLUDES := $(CLI_INCLUDES)

$(BUILD)/obj/%.o: %.cu $(BUILD)/cflags
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -c -o $@ $<

$(BUILD)/obj/gen/stdlib.o: $(BUILD)/gen/stdlib.c $(BUILD)/cflags
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -c -o $@ $<

$(BUILD)/gen/stdlib.c: $(EMBED) $(STDLIB_LUA) $(STDLIB_DIRS)
	@mkdir -p $(@D)
	$(EMBED) $@ stdlib $(STDLIB_LUA)

# The host backend's device vocabulary for compiled kernels, embedded as one
# C string (cuda/host/kcompile.c writes it beside each source it compiles):
# cuda_device_rt.h with each `#include "cuda_device_*.h"` line replaced by
# that file (cuda_device_math.h), so the copy stands alone.
$(BUILD)/obj/gen/hk_rt.o: $(BUILD)/gen/hk_rt.c $(BUILD)/cflags
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -c -o $@ $<

$(BUILD)/gen/hk_rt.c: cuda/host/cuda_device_rt.h $(filter-out cuda/host/cuda_device_rt.h,$(wildcard cuda/host/cuda_device_*.h))
	@mkdir -p $(@D)
	{ echo '/* generated from $(filter %.h,$^) */'; echo 'const char hk_rt_header[] ='; \
	  awk '/^#include "cuda_device_[a-z_]*\.h"$$/ { f = $$2; gsub(/"/, "", f); f = "cuda/host/" f; \
	         while ((getline l < f) > 0) print l; close(f); next } { print }' $< | \
	  sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/"/' -e 's/$$/\\n"/'; echo ';'; } > $@.tmp && mv $@.tmp $@

# The headers a fused kernel includes (cuda/cuda/fgen.c), embedded for NVRTC,
# which reads no files: each one C string under the name it is included by.
FUSED_HDRS := cuda/cuda/k_elem.cuh cuda/cuda/k_reduce.cuh cuda/device.h cuda/ops.h cuda/scalar.h
$(BUILD)/obj/gen/fused_hdr.o: $(BUILD)/gen/fused_hdr.c $(BUILD)/cflags
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -c -o $@ $<

$(BUILD)/gen/fused_hdr.c: $(FUSED_HDRS)
	@mkdir -p $(@D)
	{ echo '/* generated from $^ */'; echo 'const int cuda_fused_hdr_count = $(words $^);'; \
	  echo 'const char *const cuda_fused_hdr_names[] = {'; for f in $^; do echo "\"$${f##*/}\","; done; echo '};'; \
	  echo 'const char *const cuda_fused_hdr_texts[] = {'; \
	  for f in $^; do sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/"/' -e 's/$$/\\n"/' $$f; echo ','; done; \
	  echo '};'; } > $@.tmp && mv $@.tmp $@

$(EMBED): $(BUILD)/obj/interp/tools/embed_stdlib.o
	$(CC) $(ALL_LDFLAGS) -o $@ $^ $(LUA_A) -lm -ldl

$(LIB): $(LIB_OBJ)
	@rm -f $@
	$(AR) rcs $@ $^

# -Wl,-E: Lua C modules loaded by require find the (static) Lua API in gpulua.
$(BIN): $(CLI_OBJ) $(LIB)
	$(CC) $(ALL_LDFLAGS) -Wl,-E -o $@ $(CLI_OBJ) $(LIB) $(LUA_A) $(EDIT_LIBS) $(SYSLIBS)

# cudart static (nvcc's default); cuBLAS is loaded with dlopen, as gpulua does.
$(BENCH_REF): bench/ref.cu
	@mkdir -p $(@D)
	$(NVCC) -std=c++17 -O3 $(CUDA_ARCH) -Xcompiler -Wall,-Wextra,-Werror -cudart static -o $@ $< -ldl

# At run time libnccl.so.2 comes from beside the toolkit where it is there
# (runpath), else from the system's (/usr/lib/<multiarch> on the GPU machines).
$(BENCH_NCCL_REF): bench/nccl_ref.cu
	@mkdir -p $(@D)
	$(NVCC) -std=c++17 -O3 $(CUDA_ARCH) -Xcompiler -Wall,-Wextra,-Werror -cudart static -o $@ $< \
	  -L$(CUDA_HOME)/lib64 -Xlinker -rpath,$(CUDA_HOME)/lib64 -lnccl

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(LIB)
	@mkdir -p $(@D)
	$(CC) $(ALL_LDFLAGS) -o $@ $< $(LIB) $(LUA_A) $(SYSLIBS)

# ---- shared library, Lua module, install ------------------------------------

# libgpulua.so exports the public API alone: the functions gpulua.h declares.
$(BUILD)/libgpulua.map: interp/lib/gpulua.h
	@mkdir -p $(@D)
	{ echo '{ global:'; \
	  sed -n 's/^[a-zA-Z_][a-zA-Z_ ]*[ *]\(gpulua_[a-z_]*\)(.*/    \1;/p' $<; \
	  echo '  local: *;'; echo '};'; } > $@

$(BUILD)/gpu.map:
	@mkdir -p $(@D)
	printf '{ global: luaopen_gpu; local: *; };\n' > $@

$(SO): $(LIB_OBJ) $(BUILD)/libgpulua.map
	$(CC) $(ALL_LDFLAGS) -shared -Wl,-soname,libgpulua.so.$(SOVERSION) \
	  -Wl,--version-script=$(BUILD)/libgpulua.map -Wl,-z,defs -o $@ $(LIB_OBJ) $(LUA_SO) $(SYSLIBS)

# gpu.so: the library's objects without the runtime, plus interp/module/'s
# luaopen_gpu, and without Lua: its symbols come from the lua5.4 that loads
# the module, so no -z defs here.
LUAMOD_OBJ := $(filter-out $(BUILD)/obj/interp/lib/runtime.o,$(LIB_OBJ)) $(call obj,$(LUAMOD_SRC))

$(LUAMOD): $(LUAMOD_OBJ) $(BUILD)/gpu.map
	$(CC) $(ALL_LDFLAGS) -shared -Wl,--version-script=$(BUILD)/gpu.map -o $@ $(LUAMOD_OBJ) $(SYSLIBS)

# gpulua.pc with this build's link flags; @PREFIX@ is filled in at install.
# Rewritten only when it changes (the flags depend on what make found).
# Libs.private: what libgpulua.a needs beside Lua, the link's SYSLIBS.
PC_LIBS_PRIVATE = $(SYSLIBS)
$(PC_IN): gpulua.pc.in interp/lib/gpulua.h FORCE
	@mkdir -p $(@D)
	@sed -e 's|@VERSION@|$(VERSION)|' -e 's|@LIBS@|$(strip $(SAN))|' \
	  -e 's|@LIBS_PRIVATE@|$(strip $(PC_LIBS_PRIVATE))|' $< > $@.tmp
	@if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv $@.tmp $@; echo "generated $@"; fi
FORCE:

# make install PREFIX=/usr/local [DESTDIR=/tmp/pkg]: GNU conventions; PREFIX
# (or prefix) is what the installed gpulua.pc says, DESTDIR only prepended.
# gpu.so goes where Debian's lua5.4 looks for /usr/local
# (package.cpath: /usr/local/lib/lua/5.4/?.so); the stdlib modules are also
# installed as Lua files (share/lua/5.4/gpu/, on lua5.4's package.path),
# though gpulua and gpu.so have them embedded and do not read these.
# NOBUILD=1: install what $(BUILD) already holds, building nothing.
PREFIX ?= $(or $(prefix),/usr/local)
INSTALL ?= install
STDLIB_REL := $(STDLIB_LUA:stdlib/%=%)
# The man page, and the LuaLS annotations (---@meta files) for editors.
MAN_PAGE := docs/gpulua.1
# (the tree under docs/types/ as it is: LuaLS finds gpu.trace in gpu/trace.lua)
TYPES_REL := $(patsubst docs/types/%,%,$(sort $(shell find docs/types -name '*.lua' 2>/dev/null)))
# $(1): where the files go (DESTDIR + PREFIX); $(2): the prefix gpulua.pc names
define install_tree
	$(INSTALL) -d $(1)/bin $(1)/include $(1)/lib/pkgconfig $(1)/lib/lua/5.4 $(1)/share/lua/5.4 $(1)/share/man/man1
	$(INSTALL) -m 755 $(BIN) $(1)/bin/gpulua
	$(INSTALL) -m 644 $(LIB) $(1)/lib/libgpulua.a
	$(INSTALL) -m 755 $(SO) $(1)/lib/$(notdir $(SO))
	ln -sf $(notdir $(SO)) $(1)/lib/libgpulua.so.$(SOVERSION)
	ln -sf libgpulua.so.$(SOVERSION) $(1)/lib/libgpulua.so
	$(INSTALL) -m 644 interp/lib/gpulua.h $(1)/include/gpulua.h
	$(INSTALL) -m 755 $(LUAMOD) $(1)/lib/lua/5.4/gpu.so
	for f in $(STDLIB_REL); do $(INSTALL) -D -m 644 stdlib/$$f $(1)/share/lua/5.4/$$f || exit 1; done
	$(INSTALL) -m 644 $(MAN_PAGE) $(1)/share/man/man1/gpulua.1
	for f in $(TYPES_REL); do $(INSTALL) -D -m 644 docs/types/$$f $(1)/share/gpulua/types/$$f || exit 1; done
	sed 's|@PREFIX@|$(2)|' $(PC_IN) > $(1)/lib/pkgconfig/gpulua.pc
endef
INSTALLED := bin/gpulua lib/libgpulua.a lib/$(notdir $(SO)) lib/libgpulua.so.$(SOVERSION) lib/libgpulua.so \
             include/gpulua.h lib/lua/5.4/gpu.so lib/pkgconfig/gpulua.pc $(STDLIB_REL:%=share/lua/5.4/%) \
             share/man/man1/gpulua.1 $(TYPES_REL:%=share/gpulua/types/%)


# The suite's install: $(STAGE), a tree as `make install PREFIX=$(STAGE)`
# makes, and the example application built against it through pkg-config,
# as an application would be: shared (libgpulua.so and liblua5.4.so at run
# time), and with libgpulua.a and liblua5.4.a inside (runs where no Lua is
# installed, e.g. the GPU machines; only libc, libm and libstdc++ shared,
# and OpenBLAS loaded at run time when there is one).  Run by tests/install.lua.
STAGE_PKGCONF = PKG_CONFIG_PATH=$(abspath $(STAGE))/lib/pkgconfig $(or $(PKGCONF),$(error pkg-config not found: the example is built with it (make deps)))
EXAMPLE_CFLAGS := -std=c11 -Wall -Wextra -Werror -O2 -g
$(STAGE)/.installed: $(LIB) $(BIN) $(SO) $(LUAMOD) $(PC_IN) interp/lib/gpulua.h $(STDLIB_LUA) $(MAN_PAGE) \
                     $(TYPES_REL:%=docs/types/%)
	rm -rf $(STAGE)
	$(call install_tree,$(abspath $(STAGE)),$(abspath $(STAGE)))
	touch $@

$(BUILD)/example/app: tests/embed/example/app.c $(STAGE)/.installed
	@mkdir -p $(@D)
	flags=$$($(STAGE_PKGCONF) --cflags --libs gpulua) || exit 1; \
	$(CC) $(EXAMPLE_CFLAGS) -o $@ $< $$flags

# -Wl,-Bstatic takes the archives of what `--libs` names (gpulua, lua5.4);
# `--static --libs` adds their dependencies, and --as-needed drops the
# shared libgpulua and liblua it names again (all their symbols are taken).
$(BUILD)/example/app-static: tests/embed/example/app.c $(STAGE)/.installed
	@mkdir -p $(@D)
	cflags=$$($(STAGE_PKGCONF) --static --cflags gpulua) && libs=$$($(STAGE_PKGCONF) --libs gpulua) && \
	  static=$$($(STAGE_PKGCONF) --static --libs gpulua) || exit 1; \
	$(CC) $(EXAMPLE_CFLAGS) -o $@ $< $$cflags -Wl,-Bstatic $$libs -Wl,-Bdynamic -Wl,--as-needed $$static

# Two lua_States of one process, each requiring gpu.so (tests/luamod.lua);
# liblua5.4.so is the process's Lua, as lua5.4's is for the module.
$(BUILD)/tests/luamod/twostates: tests/luamod/twostates.c
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) $(ALL_LDFLAGS) -o $@ $< $(LUA_SO)

ifneq ($(NOBUILD),1)
install: $(LIB) $(BIN) $(SO) $(LUAMOD) $(PC_IN)
endif
install:
	$(call install_tree,$(DESTDIR)$(PREFIX),$(PREFIX))

# Removes the files install made, and the Lua, man and types directories
# if left empty.
uninstall:
	rm -f $(addprefix $(DESTDIR)$(PREFIX)/,$(INSTALLED))
	for d in $(sort $(dir $(STDLIB_REL:%=share/lua/5.4/%))) share/lua/5.4 share/lua lib/lua/5.4 lib/lua \
	  share/man/man1 share/man $(sort $(dir $(TYPES_REL:%=share/gpulua/types/%))) share/gpulua/types share/gpulua; do \
	  rmdir $(DESTDIR)$(PREFIX)/$$d 2>/dev/null || true; done

ifeq ($(NOBUILD),1)
SUITE_DEPS :=
RUN_DEPS :=
else
SUITE_DEPS := all tests
RUN_DEPS := all
endif

# One prove run over the Lua tests and the C tests, so one summary line;
# SUITE_JOBS files at a time (default: one per core; the tests time nothing).
# GPULUA_DEVICE=auto unless set: the automatic choice without its note.
SUITE_JOBS ?= $(NPROC)
suite: $(SUITE_DEPS)
	$(SUITE_ENV) GPULUA=$(BIN) GPULUA_DEVICE=$${GPULUA_DEVICE:-auto} \
	  $(PROVE) -j$(SUITE_JOBS) $(PROVE_FLAGS) -e tests/tap-exec $(LUA_TESTS) $(CTESTS)

# Both runs happen even when the first fails; the exit status covers both.
test: $(SUITE_DEPS)
	@st=0; \
	echo "== suite: $(BIN)"; \
	$(MAKE) --no-print-directory GPULUA_QUIET=1 suite || st=1; \
	echo "== suite: $(ASAN_BUILD)/gpulua (ASan + UBSan)"; \
	$(MAKE) --no-print-directory GPULUA_QUIET=1 test-asan || st=1; \
	exit $$st

# The sanitized build has the CUDA backend only where it can run it (a GPU
# here): elsewhere a second nvcc build would cost minutes and test nothing.
test-asan:
	@$(MAKE) --no-print-directory GPULUA_QUIET=1 BUILD=$(ASAN_BUILD) SANITIZE=1 $(if $(HAVE_GPU),,CUDA=0) suite

# On the GPU machine, from a carried build: make test-gpu NOBUILD=1
test-gpu: $(SUITE_DEPS)
	@command -v nvidia-smi >/dev/null && nvidia-smi -L || true
	NCCL_NVLS_ENABLE=0 GPULUA_DEVICE=cuda GPULUA=$(BIN) $(PROVE) $(PROVE_FLAGS) -e tests/tap-exec $(LUA_TESTS) $(CTESTS)

# compute-sanitizer over every test file on the cuda backend: memcheck on all,
# racecheck and synccheck on the kernel tests (tests/gpu_sanitize.sh says
# how).  SANITIZER: the compute-sanitizer command (the script finds one when
# it is not set).
SANITIZE_RACE := tests/gpu/compare.lua tests/gpu/kernels.lua
test-gpu-sanitize: $(SUITE_DEPS)
	@SANITIZER='$(SANITIZER)' GPULUA=$(BIN) SANITIZE_MEMCHECK='$(LUA_TESTS)' SANITIZE_RACE='$(SANITIZE_RACE)' \
	  bash tests/gpu_sanitize.sh

# CI has no GPU, so `make` there builds no CUDA code; this keeps it compiling
# (-Werror, as every build): the whole CUDA build, bench references
# included, in its own dir, so a host build beside it is left alone.
CUDA_CHECK_BUILD := build-cuda
# Then every op of the table, as a fused kernel, through NVRTC (which runs
# on the CPU): the code generation of gpu.fuse, checked without a GPU.
check-cuda:
	@$(MAKE) --no-print-directory GPULUA_QUIET=1 BUILD=$(CUDA_CHECK_BUILD) CUDA=1 all \
	  $(CUDA_CHECK_BUILD)/tests/cuda/nvrtc_fused
	$(CUDA_CHECK_BUILD)/tests/cuda/nvrtc_fused

run example: $(RUN_DEPS)
	$(BIN) scripts/overlap.lua

# The driver is Lua run by gpulua itself (the GPU machines have no other Lua);
# it stays on the host backend and starts the measured programs as children.
bench: $(RUN_DEPS)
	BENCH_QUICK=$(BENCH_QUICK) GPULUA=$(BIN) BENCH_REF=$(BENCH_REF) BENCH_NCCL_REF=$(BENCH_NCCL_REF) \
	  $(BIN) --device host bench/run.lua

# ---- fuzzing ---------------------------------------------------------------

# The libFuzzer targets (tests/fuzz/fuzz_<name>.c) are built by clang with
# the parsers' own sources; the API fuzzer runs the ASan+UBSan gpulua of
# test-asan.  tests/fuzz/run.lua runs them all and reduces a failure.
FUZZ_SECONDS ?= 60
FUZZ_SEEDS ?= 1 2 3
FUZZ_MINIMIZE_SECONDS ?= 120
FUZZ_CC ?= clang
FUZZ_DIR := $(BUILD)/fuzz
FUZZ_TARGETS := npy safetensors npz kernel_sig kcache
FUZZ_BINS := $(FUZZ_TARGETS:%=$(FUZZ_DIR)/fuzz_%)
FUZZ_CFLAGS := -std=c11 -g -O1 -Wall -Wextra -Werror -fsanitize=fuzzer,address,undefined \
               -fno-sanitize-recover=all -fno-omit-frame-pointer -D_GNU_SOURCE \
               -iquote . -iquote bindings -iquote cuda -iquote interp/lib -I$(LUA_INC)
FUZZ_HDRS := tests/fuzz/fuzz.h $(wildcard bindings/*.h cuda/*.h)
FUZZ_PKGS := clang libclang-rt-dev

# FUZZ_CC must link a libFuzzer program; as root, the packages are installed.
FUZZ_PROBE := int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; (void)n; return 0; }
fuzz-cc:
	@mkdir -p $(FUZZ_DIR)
	@echo '$(FUZZ_PROBE)' > $(FUZZ_DIR)/probe.c
	@if ! $(FUZZ_CC) -fsanitize=fuzzer,address,undefined -o $(FUZZ_DIR)/probe $(FUZZ_DIR)/probe.c >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "fuzz: $(FUZZ_CC) cannot build a libFuzzer program; installing $(FUZZ_PKGS)"; \
	    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $(FUZZ_PKGS) && \
	    $(FUZZ_CC) -fsanitize=fuzzer,address,undefined -o $(FUZZ_DIR)/probe $(FUZZ_DIR)/probe.c || exit 1; \
	  else \
	    echo "fuzz: $(FUZZ_CC) cannot build a libFuzzer program (-fsanitize=fuzzer); run:"; \
	    echo "  sudo apt-get update && sudo apt-get install -y $(FUZZ_PKGS)"; exit 1; \
	  fi; \
	fi
	@rm -f $(FUZZ_DIR)/probe $(FUZZ_DIR)/probe.c

$(FUZZ_DIR)/fuzz_npy: tests/fuzz/fuzz_npy.c bindings/npy.c cuda/dtype.c $(FUZZ_HDRS) | fuzz-cc
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -o $@ tests/fuzz/fuzz_npy.c cuda/dtype.c $(LUA_A) -lm -ldl

$(FUZZ_DIR)/fuzz_safetensors: tests/fuzz/fuzz_safetensors.c bindings/safetensors.c bindings/json.c cuda/dtype.c $(FUZZ_HDRS) | fuzz-cc
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -o $@ tests/fuzz/fuzz_safetensors.c bindings/safetensors.c bindings/json.c cuda/dtype.c

$(FUZZ_DIR)/fuzz_npz: tests/fuzz/fuzz_npz.c bindings/zip.c bindings/npy.c cuda/dtype.c $(FUZZ_HDRS) | fuzz-cc
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(if $(ZLIB_FOUND),-DGPULUA_HAVE_ZLIB) -o $@ tests/fuzz/fuzz_npz.c bindings/zip.c cuda/dtype.c \
	  $(LUA_A) $(ZLIB_LIBS) -lm -ldl

$(FUZZ_DIR)/fuzz_kernel_sig: tests/fuzz/fuzz_kernel_sig.c cuda/kernel_sig.c $(FUZZ_HDRS) | fuzz-cc
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -o $@ tests/fuzz/fuzz_kernel_sig.c cuda/kernel_sig.c

$(FUZZ_DIR)/fuzz_kcache: tests/fuzz/fuzz_kcache.c cuda/kcache.c cuda/util.c $(FUZZ_HDRS) | fuzz-cc
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -o $@ tests/fuzz/fuzz_kcache.c cuda/kcache.c cuda/util.c

ifneq ($(NOBUILD),1)
fuzz: $(BIN) $(FUZZ_BINS)
endif
fuzz:
ifneq ($(NOBUILD),1)
	@$(MAKE) --no-print-directory GPULUA_QUIET=1 BUILD=$(ASAN_BUILD) SANITIZE=1 $(if $(HAVE_GPU),,CUDA=0) all
endif
	FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_SEEDS='$(FUZZ_SEEDS)' FUZZ_MINIMIZE_SECONDS=$(FUZZ_MINIMIZE_SECONDS) \
	  FUZZ_DIR=$(FUZZ_DIR) FUZZ_GPULUA=$(ASAN_BUILD)/gpulua $(BIN) tests/fuzz/run.lua

endif

# (plus build-essential without a C compiler, perl without prove; its g++ is
# also the C++ compiler gpu.compile runs on the host backend; python3-numpy is
# the oracle of tests/ops_numpy.lua; luarocks builds the rockspec in
# tests/rockspec.lua)
DEB_PKGS := liblua5.4-dev lua5.4 libedit-dev libopenblas-dev zlib1g-dev pkg-config python3-numpy luarocks
deps:
	@missing=; \
	for p in $(DEB_PKGS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$p"; \
	done; \
	{ command -v $(CC) && command -v c++; } >/dev/null 2>&1 || missing="$$missing build-essential"; \
	command -v $(PROVE) >/dev/null 2>&1 || missing="$$missing perl"; \
	if [ -z "$$missing" ]; then echo "deps: all installed ($(DEB_PKGS))"; exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then \
	  echo "deps: installing$$missing"; \
	  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y $$missing; \
	else \
	  echo "deps: missing$$missing; run:"; \
	  echo "  sudo apt-get update && sudo apt-get install -y$$missing"; \
	  exit 1; \
	fi

# build-rock: where `luarocks make` builds (gpulua-*.rockspec)
clean:
	rm -rf build $(ASAN_BUILD) $(CUDA_CHECK_BUILD) build-rock \
	  $(filter-out build $(ASAN_BUILD) $(CUDA_CHECK_BUILD) build-rock,$(BUILD))

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
