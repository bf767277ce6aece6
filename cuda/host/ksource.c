/* ksource.c — the host backend's reading of a kernel's CUDA C++ source
 * before the C++ compiler sees it (cuda/host/kcompile.c compiles it): the
 * rewrite of what C++ lacks (extern __shared__ arrays), and which kernels
 * need fibers (they reach __syncthreads or a warp primitive). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hk.h"
#include "util.h"

/* ---- the source ----------------------------------------------------------- */

static int is_id(char c) { return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }

/* Past whitespace and comments (newlines counted into *nl). */
static const char *skip_ws(const char *p, int *nl)
{
  for (;;) {
    if (*p == '\n') { if (nl) (*nl)++; p++; continue; }
    if (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\f' || *p == '\v') { p++; continue; }
    if (p[0] == '/' && p[1] == '/') { while (*p && *p != '\n') p++; continue; }
    if (p[0] == '/' && p[1] == '*') {
      const char *e = strstr(p + 2, "*/");
      const char *end = e ? e + 2 : p + strlen(p);
      for (const char *q = p; q < end; q++) if (*q == '\n' && nl) (*nl)++;
      p = end;
      continue;
    }
    return p;
  }
}

static int word_at(const char *p, const char *w)
{
  size_t n = strlen(w);
  return strncmp(p, w, n) == 0 && !is_id(p[n]);
}

/* The declaration `extern __shared__ TYPE NAME[]REST;` at p (just past
 * `__shared__`) up to its ';': the parts, or -1 when it is not that shape. */
static int split_dyn_shared(const char *p, const char **ty, size_t *tyn, const char **nm, size_t *nmn,
                            const char **rest, size_t *restn, const char **semi)
{
  const char *s = p, *br = NULL;
  int depth = 0;
  for (; *s && !(*s == ';' && depth == 0); s++) {
    if (*s == '(') depth++;
    else if (*s == ')') depth--;
    else if (*s == '[' && !br && depth == 0) {
      const char *q = s + 1;
      while (*q == ' ' || *q == '\t') q++;
      if (*q == ']') br = s;
    }
  }
  if (!*s || !br) return -1;
  const char *e = br;
  while (e > p && (e[-1] == ' ' || e[-1] == '\t')) e--;
  const char *b = e;
  while (b > p && is_id(b[-1])) b--;
  if (b == e) return -1;
  *ty = p;
  *tyn = (size_t)(b - p);
  *nm = b;
  *nmn = (size_t)(e - b);
  const char *r = strchr(br, ']') + 1;
  *rest = r;
  *restn = (size_t)(s - r);
  *semi = s;
  return 0;
}

/* The type part of a declaration without alignment attributes, for a cast. */
static void add_cast_type(sbuf *o, const char *ty, size_t n)
{
  for (size_t i = 0; i < n;) {
    if ((n - i > 9 && word_at(ty + i, "__align__")) || (n - i > 7 && word_at(ty + i, "alignas")) ||
        (n - i > 13 && word_at(ty + i, "__attribute__"))) {
      size_t j = i;
      while (j < n && ty[j] != '(') j++;
      int d = 0;
      for (; j < n; j++) {
        if (ty[j] == '(') d++;
        else if (ty[j] == ')' && --d == 0) { j++; break; }
      }
      i = j;
      continue;
    }
    if (ty[i] == '\n' || ty[i] == '\r') { sb_add(o, " ", 1); i++; continue; }
    sb_add(o, ty + i, 1);
    i++;
  }
}

typedef struct fsname { char name[128]; sbuf repl; } fsname;

/* The source as compiled: `extern __shared__` declarations rewritten (lines
 * kept), the rest as written. */
/* rewrite's state: the braces open (a block or a namespace-like scope),
 * and the extern __shared__ arrays declared at namespace scope with what
 * each later use of their name becomes. */
enum { SC_BLOCK, SC_NS };
typedef struct rwstate {
  int scope[256], depth;
  fsname fs[16];
  int nfs;
  int check;                    /* GPULUA_KERNEL_CHECK: static __shared__ arrays set apart */
  int nstatic;                  /* the static __shared__ declarations rewritten so far */
} rwstate;

/* A preprocessor line at p (continuations included), copied; past it. */
static const char *copy_directive(const char *p, sbuf *o)
{
  while (*p && *p != '\n') {
    if (p[0] == '\\' && p[1] == '\n') { sb_add(o, p, 2); p += 2; continue; }
    sb_add(o, p++, 1);
  }
  return p;
}

/* A string or character literal at p (raw strings R"d(...)d" too), copied;
 * past it. */
static const char *copy_literal(const char *src, const char *p, sbuf *o)
{
  char c = *p;
  const char *s = p++;
  if (c == '"' && s > src && s[-1] == 'R') {
    const char *dl = p;
    while (*p && *p != '(') p++;
    char endm[40];
    snprintf(endm, sizeof endm, ")%.*s\"", (int)(p - dl) < 16 ? (int)(p - dl) : 16, dl);
    const char *e = strstr(p, endm);
    p = e ? e + strlen(endm) : p + strlen(p);
  } else {
    while (*p && *p != c && *p != '\n') { if (*p == '\\' && p[1]) p++; p++; }
    if (*p == c) p++;
  }
  sb_add(o, s, (size_t)(p - s));
  return p;
}

/* A number at p, copied (exponent signs included); past it. */
static const char *copy_number(const char *p, sbuf *o)
{
  const char *s = p;
  while (is_id(*p) || *p == '.' || *p == '\'' ||
         ((*p == '+' || *p == '-') && (p[-1] == 'e' || p[-1] == 'E' || p[-1] == 'p' || p[-1] == 'P')))
    p++;
  sb_add(o, s, (size_t)(p - s));
  return p;
}

/* A '{': what it opens, from the output before it (namespace NAME {,
 * namespace {, extern "C" { open namespace-like scopes). */
static void open_brace(rwstate *rw, const sbuf *o)
{
  int kind = SC_BLOCK;
  size_t k = o->n;
  while (k > 0 && (o->p[k - 1] == ' ' || o->p[k - 1] == '\t' || o->p[k - 1] == '\n' || o->p[k - 1] == '\r')) k--;
  size_t e = k;
  while (k > 0 && is_id(o->p[k - 1])) k--;
  if (e - k == 9 && strncmp(o->p + k, "namespace", 9) == 0) kind = SC_NS;
  else if (k == e && e >= 3 && strncmp(o->p + e - 3, "\"C\"", 3) == 0) kind = SC_NS;
  else if (e > k) {
    size_t k2 = k;
    while (k2 > 0 && (o->p[k2 - 1] == ' ' || o->p[k2 - 1] == '\t' || o->p[k2 - 1] == '\n')) k2--;
    size_t e2 = k2;
    while (k2 > 0 && is_id(o->p[k2 - 1])) k2--;
    if (e2 - k2 == 9 && strncmp(o->p + k2, "namespace", 9) == 0) kind = SC_NS;
  }
  if (rw->depth < 256) rw->scope[rw->depth] = kind;
  rw->depth++;
}

/* The name being output follows '.', '->' or '::': a member, not ours. */
static int after_member(const sbuf *o)
{
  size_t k = o->n;
  while (k > 0 && (o->p[k - 1] == ' ' || o->p[k - 1] == '\t')) k--;
  return k > 0 && (o->p[k - 1] == '.' || (k > 1 && o->p[k - 1] == '>' && o->p[k - 2] == '-') ||
                   (k > 1 && o->p[k - 1] == ':' && o->p[k - 2] == ':'));
}

/* `extern __shared__ TYPE NAME[];` with p just past "extern": in a function
 * a const pointer to the block's dynamic shared memory; at namespace scope
 * each later use of NAME becomes that pointer.  The declaration's lines are
 * kept as blank lines.  1 (*next past it), 0 when not such a declaration,
 * -1 on error. */
static int rewrite_extern_shared(rwstate *rw, const char *p, sbuf *o, const char **next, char *err, size_t errlen)
{
  int nl = 0;
  const char *q = skip_ws(p, &nl);
  const char *ty, *nm, *rest, *semi;
  size_t tyn, nmn, restn;
  if (!word_at(q, "__shared__") || split_dyn_shared(q + 10, &ty, &tyn, &nm, &nmn, &rest, &restn, &semi) != 0)
    return 0;
  int in_fn = 0;
  for (int d = 0; d < rw->depth && d < 256; d++) if (rw->scope[d] == SC_BLOCK) in_fn = 1;
  int lines = nl;
  for (const char *r = q; r < semi; r++) if (*r == '\n') lines++;
  if (in_fn) {
    /* TYPE (*const NAME)REST = (decltype(NAME))::gpulua_rt::dyn_shared(); */
    add_cast_type(o, ty, tyn);
    sb_printf(o, "(*const %.*s)", (int)nmn, nm);
    add_cast_type(o, rest, restn);
    sb_printf(o, " = (decltype(%.*s))::gpulua_rt::dyn_shared();", (int)nmn, nm);
  } else if (rw->nfs < 16 && nmn < sizeof rw->fs[0].name) {
    fsname *f = &rw->fs[rw->nfs++];
    memset(f, 0, sizeof *f);
    snprintf(f->name, sizeof f->name, "%.*s", (int)nmn, nm);
    sb_str(&f->repl, "((");
    add_cast_type(&f->repl, ty, tyn);
    sb_str(&f->repl, "(*)");
    add_cast_type(&f->repl, rest, restn);
    sb_str(&f->repl, ")::gpulua_rt::dyn_shared())");
    if (f->repl.oom) return fail_msg(err, errlen, "out of memory");
  } else {
    return fail_msg(err, errlen, "more than 16 extern __shared__ arrays at namespace scope");
  }
  for (int i = 0; i < lines; i++) sb_add(o, "\n", 1);
  *next = semi + 1;
  return 1;
}

/* The declaration `__shared__ TYPE NAME DIMS;` at p (just past
 * `__shared__`) up to its ';' at depth 0: NAME (the last identifier before
 * the first '[' outside brackets, or before the ';'), or -1 when it is not
 * that shape (several names, an initializer, no name). */
static int split_static_shared(const char *p, const char **nm, size_t *nmn, const char **semi)
{
  const char *s = p, *br = NULL;
  int depth = 0, angle = 0;
  for (; *s && !(*s == ';' && depth == 0); s++) {
    if (*s == '(' || *s == '[' || *s == '{') {
      if (*s == '[' && depth == 0 && !br) br = s;
      depth++;
    } else if (*s == ')' || *s == ']' || *s == '}') {
      depth--;
    } else if (depth == 0 && !br) {
      if (*s == '<') angle++;
      else if (*s == '>') angle--;
      else if (*s == '=' || (*s == ',' && angle <= 0) || *s == '"' || *s == '\'' || *s == '#') return -1;
    }
    if (depth < 0) return -1;
  }
  if (!*s) return -1;
  const char *e = br ? br : s;
  while (e > p && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r')) e--;
  const char *b = e;
  while (b > p && is_id(b[-1])) b--;
  if (b == e || (*b >= '0' && *b <= '9') || b == p) return -1;
  *nm = b;
  *nmn = (size_t)(e - b);
  *semi = s;
  return 0;
}

/* GPULUA_KERNEL_CHECK: `[static] __shared__ TYPE NAME DIMS;` in a function
 * (p just past `__shared__`) becomes a reference to the block's copy that
 * libgpulua keeps apart (gpulua_rt::static_shared), so that an access
 * outside it is one, lines kept:
 *   typedef TYPE gpulua_shI DIMS; gpulua_shI &NAME = *(gpulua_shI *)...;
 * 1 (*next past it), 0 when it is not such a declaration (then it stays
 * as written, in thread-local storage). */
static int rewrite_static_shared(rwstate *rw, const char *p, sbuf *o, const char **next)
{
  int in_fn = 0;
  for (int d = 0; d < rw->depth && d < 256; d++) if (rw->scope[d] == SC_BLOCK) in_fn = 1;
  const char *nm, *semi;
  size_t nmn;
  if (!rw->check || !in_fn || split_static_shared(p, &nm, &nmn, &semi) != 0) return 0;
  /* a `static` before it in the declaration: blanked (a typedef cannot be) */
  size_t k = o->n;
  while (k > 0 && !strchr(";{})", o->p[k - 1])) k--;
  for (; k + 6 <= o->n; k++)
    if (strncmp(o->p + k, "static", 6) == 0 && (k == 0 || !is_id(o->p[k - 1])) &&
        (k + 6 == o->n || !is_id(o->p[k + 6])))
      memcpy(o->p + k, "      ", 6);
  int id = rw->nstatic++, lines = 0;
  sb_str(o, "typedef");
  for (const char *r = p; r < semi; r++) {
    if (*r == '\n') lines++;
    if (r == nm) { sb_printf(o, "gpulua_sh%d", id); r += nmn - 1; continue; }
    sb_add(o, *r == '\n' || *r == '\r' ? " " : r, 1);
  }
  sb_printf(o, "; gpulua_sh%d &%.*s = *(gpulua_sh%d *)::gpulua_rt::static_shared(%d, sizeof(gpulua_sh%d), "
            "alignof(gpulua_sh%d), \"%.*s\");", id, (int)nmn, nm, id, id, id, id, (int)nmn, nm);
  for (int i = 0; i < lines; i++) sb_add(o, "\n", 1);
  *next = semi + 1;
  return 1;
}

/* The identifier s (n bytes): an extern __shared__ array of namespace scope
 * becomes its pointer, anything else is copied. */
static void copy_name(const rwstate *rw, const char *s, size_t n, sbuf *o)
{
  if (!after_member(o))
    for (int i = 0; i < rw->nfs; i++)
      if (strlen(rw->fs[i].name) == n && strncmp(rw->fs[i].name, s, n) == 0) {
        sb_add(o, rw->fs[i].repl.p, rw->fs[i].repl.n);
        return;
      }
  sb_add(o, s, n);
}

int hk_rewrite(const char *src, int check, sbuf *o, char *err, size_t errlen)
{
  rwstate rw;
  rw.depth = rw.nfs = rw.nstatic = 0;
  rw.check = check;
  int line_start = 1, ret = 0;
  const char *p = src;
  while (*p && ret == 0) {
    char c = *p;
    if (c == '\n') { line_start = 1; sb_add(o, p++, 1); continue; }
    if (c == ' ' || c == '\t' || c == '\r') { sb_add(o, p++, 1); continue; }
    if (c == '#' && line_start) { p = copy_directive(p, o); continue; }
    line_start = 0;
    if (p[0] == '/' && (p[1] == '/' || p[1] == '*')) {
      const char *e = skip_ws(p, NULL);
      sb_add(o, p, (size_t)(e - p));
      p = e;
    } else if (c == '"' || c == '\'') {
      p = copy_literal(src, p, o);
    } else if (c == '{') {
      open_brace(&rw, o);
      sb_add(o, p++, 1);
    } else if (c == '}') {
      if (rw.depth > 0) rw.depth--;
      sb_add(o, p++, 1);
    } else if (is_id(c) && !(c >= '0' && c <= '9')) {
      const char *s = p;
      while (is_id(*p)) p++;
      size_t n = (size_t)(p - s);
      int r = n == 6 && strncmp(s, "extern", 6) == 0 ? rewrite_extern_shared(&rw, p, o, &p, err, errlen)
              : n == 10 && strncmp(s, "__shared__", 10) == 0 ? rewrite_static_shared(&rw, p, o, &p)
              : 0;
      if (r < 0) ret = -1;
      else if (r == 0) copy_name(&rw, s, n, o);
    } else if (c >= '0' && c <= '9') {
      p = copy_number(p, o);
    } else {
      sb_add(o, p++, 1);
    }
  }
  for (int i = 0; i < rw.nfs; i++) free(rw.fs[i].repl.p);
  if (!ret && o->oom) ret = fail_msg(err, errlen, "out of memory");
  return ret;
}

/* ---- which kernels need fibers --------------------------------------------- */

/* A kernel needs its threads as fibers when it may reach a barrier or a
 * warp primitive.  The compiled module tells (gpulua_hk_fibers) but not for
 * which kernel; this reads the source instead: every function body and
 * macro, the names each uses, and which of them lead to a primitive.  It
 * errs towards fibers (a name used anywhere for something that leads there
 * counts); a header of the user's, which it cannot read, makes every kernel
 * of the module use them. */

typedef struct fnbody {
  const char *name;
  size_t len;
  size_t first, count;          /* its identifiers in ids[] */
  int need;
} fnbody;

typedef struct scan {
  fnbody *fn;
  int nfn, capfn;
  const char **ids;             /* identifiers, as (start, length) */
  size_t *idlen;
  size_t nids, capids;
  int unknown;                  /* an include it cannot see */
  int oom;
} scan;

static int is_primitive(const char *s, size_t n)
{
  return (n > 6 && strncmp(s, "__sync", 6) == 0) || (n > 5 && strncmp(s + n - 5, "_sync", 5) == 0) ||
         (n == 12 && strncmp(s, "__activemask", 12) == 0);
}

static void scan_id(scan *sc, const char *s, size_t n)
{
  if (sc->nids == sc->capids) {
    size_t cap = sc->capids ? 2 * sc->capids : 256;
    const char **ni = realloc(sc->ids, cap * sizeof *ni);
    if (!ni) { sc->oom = 1; return; }
    sc->ids = ni;
    size_t *nl = realloc(sc->idlen, cap * sizeof *nl);
    if (!nl) { sc->oom = 1; return; }
    sc->idlen = nl;
    sc->capids = cap;
  }
  sc->ids[sc->nids] = s;
  sc->idlen[sc->nids++] = n;
}

static fnbody *scan_fn(scan *sc, const char *name, size_t len)
{
  if (sc->nfn == sc->capfn) {
    int cap = sc->capfn ? 2 * sc->capfn : 64;
    fnbody *nf = realloc(sc->fn, (size_t)cap * sizeof *nf);
    if (!nf) { sc->oom = 1; return NULL; }
    sc->fn = nf;
    sc->capfn = cap;
  }
  fnbody *f = &sc->fn[sc->nfn++];
  f->name = name;
  f->len = len;
  f->first = sc->nids;
  f->count = 0;
  f->need = 0;
  return f;
}

/* The tokens that matter: identifiers (kind 'i') and ( ) { } ; (kind 'p'). */
typedef struct stok { const char *s; size_t n; char kind; } stok;

/* A directive at p (its line, continuations included): a macro is a body
 * of its own; an include of the user's is a body it cannot read.  Past it. */
static const char *scan_directive(scan *sc, const char *p)
{
  const char *e = p;
  while (*e && !(*e == '\n' && e[-1] != '\\')) e++;
  const char *q = p + 1;
  while (*q == ' ' || *q == '\t') q++;
  if (strncmp(q, "include", 7) == 0) {
    q += 7;
    while (*q == ' ' || *q == '\t') q++;
    if (*q == '"') sc->unknown = 1;
  } else if (strncmp(q, "define", 6) == 0 && (q[6] == ' ' || q[6] == '\t')) {
    q += 6;
    while (*q == ' ' || *q == '\t') q++;
    const char *nm = q;
    while (q < e && is_id(*q)) q++;
    fnbody *f = scan_fn(sc, nm, (size_t)(q - nm));
    for (; f && q < e;) {
      if (is_id(*q) && !(*q >= '0' && *q <= '9')) {
        const char *a = q;
        while (q < e && is_id(*q)) q++;
        scan_id(sc, a, (size_t)(q - a));
      } else {
        q++;
      }
    }
    if (f) f->count = sc->nids - f->first;
  }
  return e;
}

/* The tokens that matter for finding bodies: identifiers and ( ) { } ;,
 * directives handled on the way; *ntk of them (free the result). */
static stok *scan_tokens(scan *sc, const char *src, size_t *ntk)
{
  stok *tk = NULL;
  size_t captk = 0;
  int line_start = 1;
  *ntk = 0;
  for (const char *p = src; *p && !sc->oom;) {
    char c = *p;
    if (c == '\n') { line_start = 1; p++; continue; }
    if (c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v') { p++; continue; }
    if (p[0] == '/' && (p[1] == '/' || p[1] == '*')) { p = skip_ws(p, NULL); continue; }
    if (c == '#' && line_start) { p = scan_directive(sc, p); continue; }
    line_start = 0;
    if (c == '"' || c == '\'') {
      p++;
      while (*p && *p != c && *p != '\n') { if (*p == '\\' && p[1]) p++; p++; }
      if (*p == c) p++;
      continue;
    }
    stok t = {p, 1, 0};
    if (is_id(c) && !(c >= '0' && c <= '9')) {
      while (is_id(*p)) p++;
      t.n = (size_t)(p - t.s);
      t.kind = 'i';
    } else if (c >= '0' && c <= '9') {
      while (is_id(*p) || *p == '.') p++;
      continue;
    } else {
      p++;
      if (!strchr("(){};", c)) continue;
      t.kind = 'p';
    }
    if (*ntk == captk) {
      size_t cap = captk ? 2 * captk : 1024;
      stok *nt = realloc(tk, cap * sizeof *nt);
      if (!nt) { sc->oom = 1; break; }
      tk = nt;
      captk = cap;
    }
    tk[(*ntk)++] = t;
  }
  return tk;
}

/* Function bodies: a { after ) at a level outside any body; inside it,
 * every identifier up to the matching }. */
static void scan_bodies(scan *sc, const stok *tk, size_t ntk)
{
  for (size_t i = 0; i < ntk && !sc->oom; i++) {
    if (!(tk[i].kind == 'p' && tk[i].s[0] == '{')) continue;
    size_t j = i;
    while (j > 0 && tk[j - 1].kind == 'i') j--;       /* const, noexcept, override... */
    if (j == 0 || !(tk[j - 1].kind == 'p' && tk[j - 1].s[0] == ')')) continue;
    /* the ( that matches, and the name before it */
    size_t k = j - 1;
    int depth = 0;
    for (;;) {
      if (tk[k].kind == 'p' && tk[k].s[0] == ')') depth++;
      else if (tk[k].kind == 'p' && tk[k].s[0] == '(' && --depth == 0) break;
      if (k == 0) break;
      k--;
    }
    const char *nm = "";
    size_t nl = 0;
    if (k > 0 && tk[k - 1].kind == 'i') { nm = tk[k - 1].s; nl = tk[k - 1].n; }
    fnbody *f = scan_fn(sc, nm, nl);
    depth = 0;
    size_t e = i;
    for (; e < ntk; e++) {
      if (tk[e].kind == 'p' && tk[e].s[0] == '{') depth++;
      else if (tk[e].kind == 'p' && tk[e].s[0] == '}' && --depth == 0) break;
      else if (tk[e].kind == 'i') scan_id(sc, tk[e].s, tk[e].n);
    }
    if (f) f->count = sc->nids - f->first;
    i = e;
  }
}

/* Which bodies lead to a primitive: those that name one, then those that
 * name such a body, until nothing changes.  1 if a body without a name (a
 * lambda at namespace scope, which could be any) does. */
static int mark_needs(scan *sc)
{
  int changed = 1, anon = 0;
  for (int f = 0; f < sc->nfn; f++)
    for (size_t k = 0; k < sc->fn[f].count && !sc->fn[f].need; k++)
      sc->fn[f].need = is_primitive(sc->ids[sc->fn[f].first + k], sc->idlen[sc->fn[f].first + k]);
  while (changed && !sc->oom) {
    changed = 0;
    for (int f = 0; f < sc->nfn; f++) {
      if (sc->fn[f].need) continue;
      for (size_t k = 0; k < sc->fn[f].count && !sc->fn[f].need; k++) {
        const char *id = sc->ids[sc->fn[f].first + k];
        size_t n = sc->idlen[sc->fn[f].first + k];
        for (int g = 0; g < sc->nfn; g++)
          if (sc->fn[g].need && sc->fn[g].len == n && strncmp(sc->fn[g].name, id, n) == 0) {
            sc->fn[f].need = 1;
            break;
          }
      }
      changed |= sc->fn[f].need;
    }
  }
  for (int f = 0; f < sc->nfn; f++) if (sc->fn[f].need && sc->fn[f].len == 0) anon = 1;
  return anon;
}

void hk_fiber_scan(const char *src, const char *const *exprs, int nexprs, int *need)
{
  scan sc;
  memset(&sc, 0, sizeof sc);
  size_t ntk;
  stok *tk = scan_tokens(&sc, src, &ntk);
  scan_bodies(&sc, tk, ntk);
  int anon = mark_needs(&sc);
  for (int i = 0; i < nexprs; i++) {
    const char *q = exprs[i][0] == '&' ? exprs[i] + 1 : exprs[i], *last = q;
    for (const char *r = q; *r; r++) if (r[0] == ':' && r[1] == ':') last = r + 2;
    size_t n = strlen(last);
    int found = 0, nd = 0;
    for (int f = 0; f < sc.nfn; f++) {
      if (sc.fn[f].len != n || strncmp(sc.fn[f].name, last, n) != 0) continue;
      found = 1;
      nd |= sc.fn[f].need;
    }
    need[i] = sc.oom || sc.unknown || anon || !found || nd;
  }
  free(tk);
  free(sc.fn);
  free(sc.ids);
  free(sc.idlen);
}

