/* Small chores of the device layer and both backends, one way each (as
 * llm.c's llmc/utils.h): an error message into a caller's (err, errlen), a
 * growing string, an on/off environment variable, a temporary file.  No Lua, no dev_ctx.  Compiled as C and, for fail_msg, as
 * the CUDA kernels' C++ (cuda/cuda/k_common.cuh includes it). */
#ifndef GPULUA_UTIL_H
#define GPULUA_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The message into err (when err has room), for `return fail_msg(...)`: -1.
 * Inline, so the parsers built alone (make fuzz) need no other object. */
__attribute__((format(printf, 3, 4)))
static inline int fail_msg(char *err, size_t errlen, const char *fmt, ...)
{
  if (err != NULL && errlen > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return -1;
}

/* A growing string: start at {0}, free(b.p) at the end.  b.p stays
 * NUL-terminated (the NUL not counted in b.n); a failed allocation sets oom
 * and later appends do nothing, so a caller checks once at the end. */
typedef struct sbuf { char *p; size_t n, cap; int oom; } sbuf;

/* n bytes of s */
void sb_add(sbuf *b, const void *s, size_t n);
/* the string s, without its NUL */
void sb_str(sbuf *b, const char *s);
/* the string s and its NUL: one part of a key, so "ab","c" differs from "a","bc" */
void sb_key(sbuf *b, const char *s);
/* printf-formatted text, without a NUL */
void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* An on/off setting: 1 for 1, on, yes or true; 0 for 0, off, no or false
 * (in any case); -1 for any other text. */
int flag_value(const char *v);
/* gpulua's own setting name (a GPULUA_* variable): its value, or NULL when
 * it is unset or the process ignores gpulua's settings.  env_settings_off
 * makes the process ignore them from then on (gpulua -E, lua5.4 -E with the
 * module, an embedder's ignore_env): process-wide, as the environment is,
 * since several settings shape what the process shares (the host threads,
 * NCCL, the C++ compiler, the kernel cache).  The launcher's own variables
 * (GPULUA_LAUNCHER, GPULUA_LAUNCHER_FD) are not settings: read them with
 * getenv. */
const char *env_setting(const char *name);
void env_settings_off(void);
int env_settings_ignored(void);

/* The on/off setting name (through env_setting): 0 with its flag_value in *on, or
 * *on untouched (the caller's default) when it is unset or empty; -1 for any
 * other value, with a message in err that names the variable and the values
 * it takes. */
int env_flag(const char *name, int *on, char *err, size_t errlen);

/* A new temporary file or directory named $TMPDIR/<prefix>-XXXXXX, else
 * /tmp/<prefix>-XXXXXX when TMPDIR is unset or unusable; its name in path.
 * tmp_file: the file's descriptor (O_CLOEXEC), tmp_dir: 0; -1 with errno. */
int tmp_file(const char *prefix, char *path, size_t n);
int tmp_dir(const char *prefix, char *path, size_t n);

#ifdef __cplusplus
}
#endif

#endif
