/* The .npy reader's Lua-free part (npy.c), shared with the .npz reader
 * (formats.c) and the fuzz target. */
#ifndef GPULUA_NPY_H
#define GPULUA_NPY_H

#include <stddef.h>
#include <stdint.h>

#include "../cuda/device.h"

typedef struct npy_header {
  int major, minor;
  size_t data_offset, nbytes;
  dev_dtype dt;
  int swap;                     /* big-endian elements: swapped after reading */
  int fortran;
  int nomap;                    /* read, never mapped (opts.map = false) */
  int ndim;
  int64_t shape[DEV_MAXDIM];
  char descr[40];               /* as written, for messages */
} npy_header;

/* Reads n bytes at off of a file or member: 0, or -1 (errno set, 0 at the end). */
typedef int (*npy_read_fn)(void *ctx, void *p, size_t n, uint64_t off);

/* The preamble and header of a .npy of size bytes, checked against the
 * size; 0, or -1 with a message. */
int npy_read_header(npy_read_fn rd, void *ctx, uint64_t size, npy_header *h, char *err, size_t errlen);
/* After reading: swaps big-endian elements, makes bools 0/1. */
void npy_fix_elements(const npy_header *h, void *p);

/* numpy.save's preamble and header for v (C order) into out (1024
 * bytes); its length (npy.c). */
size_t bind_npy_make_header(const dev_view *v, char *out);

#ifdef lua_h
/* Pushes a new tensor of kind holding h's elements, read through rd at
 * h->data_offset, as gpu.load does (npy.c). */
void bind_npy_load(lua_State *L, npy_read_fn rd, void *ctx, const npy_header *h, dev_memkind kind, int stream,
                   const char *fname, const char *path);
/* Pushes a new device tensor of h's elements at h->data_offset of the
 * regular file fd, its pages mapped and the staged copy queued on the
 * stream at slot stream: 1; or 0, nothing pushed, when they cannot be
 * mapped (the caller reads them then).  No byte swapping, no bool fix-up. */
int bind_npy_map(lua_State *L, int fd, const npy_header *h, int stream, const char *fname);
#endif

#endif
