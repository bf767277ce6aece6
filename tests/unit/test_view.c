/* dev_view_check, the one checker every op's views pass through before a
 * kernel touches memory: the edges of a buffer, negative strides, alignment,
 * and strides or shapes large enough to overflow the arithmetic. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "devpriv.h"
#include "tests/tap.h"


static _Alignas(16) unsigned char mem[4096];
static dev_buf buf;

/* A 1-D or 2-D view of buf: dtype t, offset in bytes. */
static dev_view view(dev_dtype t, size_t offset, int ndim, int64_t n0, int64_t s0, int64_t n1, int64_t s1) {
  dev_view v;
  memset(&v, 0, sizeof v);
  v.buf = &buf;
  v.dtype = t;
  v.offset = offset;
  v.ndim = ndim;
  v.shape[0] = n0;
  v.stride[0] = s0;
  v.shape[1] = n1;
  v.stride[1] = s1;
  return v;
}

/* passes: expect 0; else the message contains want */
static void expect(const dev_view *v, const char *want, const char *what) {
  char err[200] = "";
  int rc = dev_view_check(v, "out", err, sizeof err);
  if (!want) {
    ok(rc == 0, "%s: accepted%s%s", what, rc ? " -- got: " : "", rc ? err : "");
  } else {
    ok(rc != 0 && strstr(err, want) != NULL, "%s: rejected with '%s' (got rc %d, '%s')", what, want, rc, err);
  }
}

int main(void) {
  buf.ptr = mem;
  buf.bytes = 1024;
  buf.kind = DEV_MEM_DEVICE;
  dev_view v;

  /* the edges of the buffer */
  v = view(DEV_F32, 0, 1, 256, 1, 0, 0);
  expect(&v, NULL, "f32[256] fills 1024 bytes exactly");
  v = view(DEV_F32, 0, 1, 257, 1, 0, 0);
  expect(&v, "exceeds its buffer", "f32[257] is one element too many");
  v = view(DEV_F32, 4, 1, 255, 1, 0, 0);
  expect(&v, NULL, "offset 4, f32[255] ends on the last byte");
  v = view(DEV_F32, 8, 1, 255, 1, 0, 0);
  expect(&v, "exceeds its buffer", "offset 8, f32[255] is one past the end");
  v = view(DEV_F64, 1024, 1, 1, 1, 0, 0);
  expect(&v, "exceeds its buffer", "an element at offset == size");
  v = view(DEV_U8, 2048, 1, 1, 1, 0, 0);
  expect(&v, "exceeds its buffer", "offset past the end");
  v = view(DEV_U8, 1023, 1, 1, 1, 0, 0);
  expect(&v, NULL, "u8 at the last byte");

  /* strides: a column of a 16x16 f32 matrix, a transposed view, broadcasts */
  v = view(DEV_F32, 15 * 4, 1, 16, 16, 0, 0);
  expect(&v, NULL, "last column of a 16x16 f32");
  v = view(DEV_F32, 16 * 4, 1, 16, 16, 0, 0);
  expect(&v, "exceeds its buffer", "a column one element too far");
  v = view(DEV_F32, 0, 2, 16, 1, 16, 16);
  expect(&v, NULL, "transposed 16x16");
  v = view(DEV_F32, 0, 2, 1000, 0, 1000, 0);
  expect(&v, NULL, "a 1000x1000 broadcast of one element");

  /* negative strides reach before the offset */
  v = view(DEV_F32, 0, 1, 2, -1, 0, 0);
  expect(&v, "exceeds its buffer", "a reversed view from offset 0");
  v = view(DEV_F32, 4, 1, 2, -1, 0, 0);
  expect(&v, NULL, "a reversed view of two elements from offset 4");
  v = view(DEV_F32, 1020, 1, 256, -1, 0, 0);
  expect(&v, NULL, "the whole buffer reversed");
  v = view(DEV_F32, 1020, 1, 257, -1, 0, 0);
  expect(&v, "exceeds its buffer", "reversed, one element too many");

  /* alignment, dtype, ndim, sizes */
  v = view(DEV_F32, 2, 1, 4, 1, 0, 0);
  expect(&v, "misaligned", "f32 at byte offset 2");
  v = view(DEV_F64, 4, 1, 4, 1, 0, 0);
  expect(&v, "misaligned", "f64 at byte offset 4");
  v = view(DEV_U8, 3, 1, 4, 1, 0, 0);
  expect(&v, NULL, "u8 at byte offset 3");
  v = view((dev_dtype)99, 0, 1, 1, 1, 0, 0);
  expect(&v, "bad dtype", "an unknown dtype");
  v = view(DEV_F32, 0, DEV_MAXDIM + 1, 1, 1, 1, 1);
  expect(&v, "bad ndim", "too many dims");
  v = view(DEV_F32, 0, 1, -1, 1, 0, 0);
  expect(&v, "negative size", "a negative size");
  v = view(DEV_F32, 1 << 20, 1, 0, 1, 0, 0);
  expect(&v, NULL, "an empty view touches nothing, wherever it points");

  /* arithmetic that would overflow */
  v = view(DEV_F32, 0, 2, INT64_MAX / 2, 1, 4, 1);
  expect(&v, "too many elements", "numel overflows int64");
  v = view(DEV_F32, 0, 1, 2, INT64_MAX / 8, 0, 0);
  expect(&v, "stride too large", "a stride near INT64_MAX / 8");
  v = view(DEV_F32, 0, 1, 3, INT64_MAX / 16, 0, 0);
  expect(&v, "stride too large", "span * stride overflows the extent limit");
  v = view(DEV_F32, 0, 1, 2, (INT64_MAX / 16) / 4, 0, 0);
  expect(&v, "exceeds its buffer", "an extent that fits the limit but not in bytes");
  v = view(DEV_F32, 1020, 1, 2, -((INT64_MAX / 16) / 4), 0, 0);
  expect(&v, "exceeds its buffer", "a huge negative stride");

  buf.ptr = NULL;
  v = view(DEV_F32, 0, 1, 1, 1, 0, 0);
  expect(&v, "no memory", "a buffer with no memory");

  return done_testing();
}
