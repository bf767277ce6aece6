/* Kernel signatures read from CUDA C source (for gpu.compile and the
 * `declare` option of gpu.load_module) and from PTX `.entry` directives.
 * Pure text processing: no CUDA, no Lua.
 *
 * The source is not preprocessed: signatures are read as written.  A kernel
 * whose parameter list uses a macro or a typedef gpulua does not know gets
 * DEV_KP_OTHER for that parameter (it cannot be launched from Lua), and the
 * device layer compares the parsed parameter sizes with the compiled kernel's
 * so a misread never reaches a launch. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "util.h"

typedef struct tok {
  const char *s;
  int len;
  int kind;          /* 'i' identifier, 'n' number, 's' string, 'p' punctuation */
} tok;

typedef struct toks { tok *t; int n, cap; } toks;

static int push(toks *ts, const char *s, int len, int kind)
{
  if (ts->n == ts->cap) {
    int cap = ts->cap ? 2 * ts->cap : 256;
    tok *nt = realloc(ts->t, (size_t)cap * sizeof *nt);
    if (!nt) return -1;
    ts->t = nt;
    ts->cap = cap;
  }
  ts->t[ts->n++] = (tok){s, len, kind};
  return 0;
}

/* Comments and preprocessor lines dropped; strings kept as one token. */
static int lex(const char *src, toks *ts)
{
  const char *p = src;
  int line_start = 1;
  while (*p) {
    if (*p == '\n') { line_start = 1; p++; continue; }
    if (isspace((unsigned char)*p)) { p++; continue; }
    if (p[0] == '/' && p[1] == '/') { while (*p && *p != '\n') p++; continue; }
    if (p[0] == '/' && p[1] == '*') {
      const char *e = strstr(p + 2, "*/");
      p = e ? e + 2 : p + strlen(p);
      continue;
    }
    if (*p == '#' && line_start) {
      /* a directive, with backslash continuations */
      while (*p && *p != '\n') {
        if (p[0] == '\\' && p[1] == '\n') p++;
        p++;
      }
      continue;
    }
    line_start = 0;
    if (*p == '"' || *p == '\'') {
      char q = *p;
      const char *s = p++;
      while (*p && *p != q) { if (*p == '\\' && p[1]) p++; p++; }
      if (*p) p++;
      if (push(ts, s, (int)(p - s), 's')) return -1;
      continue;
    }
    if (isalpha((unsigned char)*p) || *p == '_') {
      const char *s = p;
      while (isalnum((unsigned char)*p) || *p == '_') p++;
      if (push(ts, s, (int)(p - s), 'i')) return -1;
      continue;
    }
    if (isdigit((unsigned char)*p)) {
      const char *s = p;
      while (isalnum((unsigned char)*p) || *p == '.' || *p == '_') p++;
      if (push(ts, s, (int)(p - s), 'n')) return -1;
      continue;
    }
    if (p[0] == ':' && p[1] == ':') {
      if (push(ts, p, 2, 'p')) return -1;
      p += 2;
      continue;
    }
    if (push(ts, p, 1, 'p')) return -1;
    p++;
  }
  return 0;
}

static int is(const tok *t, const char *s)
{
  return (int)strlen(s) == t->len && memcmp(t->s, s, (size_t)t->len) == 0;
}

/* Index of the token closing the bracket opened at i, or -1. */
static int match(const toks *ts, int i)
{
  char open = ts->t[i].s[0], close = open == '(' ? ')' : open == '{' ? '}' : open == '[' ? ']' : '>';
  int depth = 0;
  for (int j = i; j < ts->n; j++) {
    if (ts->t[j].kind != 'p') continue;
    if (ts->t[j].s[0] == open) depth++;
    else if (ts->t[j].s[0] == close && --depth == 0) return j;
  }
  return -1;
}

/* ---- types ------------------------------------------------------------- */

typedef struct tinfo { const char *name; dev_kparam_kind kind; int size; int dtype; int elsize; } tinfo;

/* By value: kind and size.  Through a pointer: the dtype a tensor must have
 * (-1 any), or only the element size when gpulua has no such dtype (0:
 * any; char *, like void *, is a view of any tensor's bytes). */
static const tinfo types[] = {
  {"bool", DEV_KP_BOOL, 1, DEV_BOOL, 1},
  {"char", DEV_KP_INT, 1, -1, 0},
  {"signed char", DEV_KP_INT, 1, DEV_I8, 1}, {"int8_t", DEV_KP_INT, 1, DEV_I8, 1},
  {"unsigned char", DEV_KP_UINT, 1, DEV_U8, 1}, {"uint8_t", DEV_KP_UINT, 1, DEV_U8, 1},
  {"short", DEV_KP_INT, 2, -1, 2}, {"short int", DEV_KP_INT, 2, -1, 2},
  {"signed short", DEV_KP_INT, 2, -1, 2}, {"int16_t", DEV_KP_INT, 2, -1, 2},
  {"unsigned short", DEV_KP_UINT, 2, -1, 2}, {"uint16_t", DEV_KP_UINT, 2, -1, 2},
  {"int", DEV_KP_INT, 4, DEV_I32, 4}, {"signed", DEV_KP_INT, 4, DEV_I32, 4},
  {"signed int", DEV_KP_INT, 4, DEV_I32, 4}, {"int32_t", DEV_KP_INT, 4, DEV_I32, 4},
  {"unsigned", DEV_KP_UINT, 4, DEV_I32, 4}, {"unsigned int", DEV_KP_UINT, 4, DEV_I32, 4},
  {"uint32_t", DEV_KP_UINT, 4, DEV_I32, 4},
  {"long", DEV_KP_INT, 8, DEV_I64, 8}, {"long int", DEV_KP_INT, 8, DEV_I64, 8},
  {"signed long", DEV_KP_INT, 8, DEV_I64, 8}, {"long long", DEV_KP_INT, 8, DEV_I64, 8},
  {"long long int", DEV_KP_INT, 8, DEV_I64, 8}, {"signed long long", DEV_KP_INT, 8, DEV_I64, 8},
  {"int64_t", DEV_KP_INT, 8, DEV_I64, 8}, {"ptrdiff_t", DEV_KP_INT, 8, DEV_I64, 8},
  {"ssize_t", DEV_KP_INT, 8, DEV_I64, 8}, {"intptr_t", DEV_KP_INT, 8, DEV_I64, 8},
  {"unsigned long", DEV_KP_UINT, 8, DEV_I64, 8}, {"unsigned long int", DEV_KP_UINT, 8, DEV_I64, 8},
  {"unsigned long long", DEV_KP_UINT, 8, DEV_I64, 8},
  {"unsigned long long int", DEV_KP_UINT, 8, DEV_I64, 8},
  {"uint64_t", DEV_KP_UINT, 8, DEV_I64, 8}, {"size_t", DEV_KP_UINT, 8, DEV_I64, 8},
  {"uintptr_t", DEV_KP_UINT, 8, DEV_I64, 8},
  {"float", DEV_KP_FLOAT, 4, DEV_F32, 4}, {"double", DEV_KP_FLOAT, 8, DEV_F64, 8},
  {"__half", DEV_KP_HALF, 2, DEV_F16, 2}, {"half", DEV_KP_HALF, 2, DEV_F16, 2},
  {"__nv_bfloat16", DEV_KP_BF16, 2, DEV_BF16, 2}, {"nv_bfloat16", DEV_KP_BF16, 2, DEV_BF16, 2},
  /* vector types: pointers only */
  {"float2", DEV_KP_OTHER, 8, DEV_F32, 8}, {"float4", DEV_KP_OTHER, 16, DEV_F32, 16},
  {"double2", DEV_KP_OTHER, 16, DEV_F64, 16},
  {"int2", DEV_KP_OTHER, 8, DEV_I32, 8}, {"int4", DEV_KP_OTHER, 16, DEV_I32, 16},
  {"__half2", DEV_KP_OTHER, 4, DEV_F16, 4}, {"half2", DEV_KP_OTHER, 4, DEV_F16, 4},
  {"__nv_bfloat162", DEV_KP_OTHER, 4, DEV_BF16, 4}, {"nv_bfloat162", DEV_KP_OTHER, 4, DEV_BF16, 4},
  {"char4", DEV_KP_OTHER, 4, DEV_I8, 4}, {"uchar4", DEV_KP_OTHER, 4, DEV_U8, 4},
};

static const tinfo *find_type(const char *name)
{
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
    if (strcmp(types[i].name, name) == 0) return &types[i];
  return NULL;
}

static int is_type_word(const tok *t)
{
  static const char *const words[] = {
    "void", "bool", "char", "short", "int", "long", "signed", "unsigned", "float", "double", NULL};
  for (int i = 0; words[i]; i++)
    if (is(t, words[i])) return 1;
  return 0;
}

/* Qualifiers and attributes that do not change how an argument is passed. */
static int is_ignored(const tok *t)
{
  static const char *const words[] = {
    "__restrict__", "__restrict", "restrict", "volatile", "__grid_constant__", "struct",
    "class", "typename", "register", NULL};
  for (int i = 0; words[i]; i++)
    if (is(t, words[i])) return 1;
  return 0;
}

/* Words joined by one space. */
static void append(char *dst, size_t cap, const char *s, int len)
{
  size_t n = strlen(dst);
  if (n && n + 1 < cap) dst[n++] = ' ';
  snprintf(dst + n, cap - n, "%.*s", len, s);
}

/* One parameter, tokens [a, b). */
static int parse_param(const toks *ts, int a, int b, dev_kparam *p, char *err, size_t errlen)
{
  memset(p, 0, sizeof *p);
  p->pointee = -1;
  /* a default argument does not change the type */
  for (int i = a; i < b; i++)
    if (ts->t[i].kind == 'p' && ts->t[i].s[0] == '=') { b = i; break; }
  /* skip attributes such as __align__(8) */
  int kept[64], nk = 0, stars = 0, const_before = 0, ref = 0, array = 0;
  for (int i = a; i < b; i++) {
    const tok *t = &ts->t[i];
    if (t->kind == 'i' && (is(t, "__align__") || is(t, "alignas") || is(t, "__attribute__")) &&
        i + 1 < b && is(&ts->t[i + 1], "(")) {
      int j = match(ts, i + 1);
      if (j < 0 || j >= b) break;
      i = j;
      continue;
    }
    if (t->kind == 'p' && t->s[0] == '[') { array = 1; int j = match(ts, i); i = j < 0 ? b : j; continue; }
    if (t->kind == 'p' && (t->s[0] == '*')) { stars++; continue; }
    if (t->kind == 'p' && (t->s[0] == '&')) { ref = 1; continue; }
    if (is(t, "const")) {
      if (stars == 0) const_before = 1;
      continue;
    }
    if (is_ignored(t)) continue;
    if (nk == 64) return fail_msg(err, errlen, "parameter too long");
    kept[nk++] = i;
  }
  /* the name: a trailing identifier after at least one type token */
  if (nk >= 2) {
    const tok *last = &ts->t[kept[nk - 1]];
    const tok *prev = &ts->t[kept[nk - 2]];
    int after_ptr = 0;
    /* "float *x": the name follows the stars */
    for (int i = kept[nk - 2] + 1; i < kept[nk - 1]; i++)
      if (ts->t[i].kind == 'p' && ts->t[i].s[0] == '*') after_ptr = 1;
    if (last->kind == 'i' && !is_type_word(last) && (after_ptr || !is(prev, "::"))) {
      snprintf(p->name, sizeof p->name, "%.*s", last->len, last->s);
      nk--;
    }
  }
  /* the base type, without std:: or a leading :: */
  char base[80] = "";
  for (int k = 0; k < nk; k++) {
    const tok *t = &ts->t[kept[k]];
    if (is(t, "::") || (is(t, "std") && k + 1 < nk && is(&ts->t[kept[k + 1]], "::"))) continue;
    append(base, sizeof base, t->s, t->len);
  }
  /* the type as messages show it */
  snprintf(p->type, sizeof p->type, "%s%s%s%s%s", const_before ? "const " : "", base,
           stars ? " " : "", stars == 1 ? "*" : stars > 1 ? "**" : "",
           ref ? " &" : array ? " []" : "");
  if (!*base) return fail_msg(err, errlen, "a parameter without a type");
  if (array) stars++;
  const tinfo *ti = find_type(base);
  if (ref || stars > 1) {
    p->kind = DEV_KP_OTHER;
    p->size = 8;
  } else if (stars == 1) {
    p->kind = DEV_KP_POINTER;
    p->size = 8;
    p->is_const = const_before;
    p->pointee = ti ? ti->dtype : -1;
    p->elsize = ti ? ti->elsize : 0;
  } else if (ti && ti->kind != DEV_KP_OTHER) {
    p->kind = ti->kind;
    p->size = ti->size;
  } else if (strcmp(base, "void") == 0) {
    return fail_msg(err, errlen, "a parameter of type void");
  } else {
    p->kind = DEV_KP_OTHER;
    p->size = ti ? ti->size : 0;
  }
  return 0;
}

static int add_sig(dev_ksig **out, int *n, int *cap, dev_ksig *k)
{
  if (*n == *cap) {
    int nc = *cap ? 2 * *cap : 8;
    dev_ksig *nk = realloc(*out, (size_t)nc * sizeof *nk);
    if (!nk) return -1;
    *out = nk;
    *cap = nc;
  }
  (*out)[(*n)++] = *k;
  return 0;
}

void dev_kernels_free(dev_ksig *k, int n)
{
  if (!k) return;
  for (int i = 0; i < n; i++) free(k[i].params);
  free(k);
}

/* Scope kinds on the brace stack. */
enum { SC_BLOCK, SC_NAMESPACE, SC_EXTERN_C };

/* The braces seen so far: what each opened, and the names of the open
 * namespaces (an anonymous one as ""). */
typedef struct scopes {
  char ns[8][64];
  int scope[256], depth, nns;
} scopes;

/* Token i when it is a brace: the scope it opens or closes.  1 if it was. */
static int scope_token(scopes *sc, const toks *ts, int i)
{
  const tok *t = &ts->t[i];
  if (t->kind == 'p' && t->s[0] == '{') {
    int kind = SC_BLOCK;
    if (i >= 2 && ts->t[i - 2].kind == 'i' && is(&ts->t[i - 2], "namespace") && ts->t[i - 1].kind == 'i') {
      kind = SC_NAMESPACE;
      if (sc->nns < 8) snprintf(sc->ns[sc->nns], sizeof sc->ns[0], "%.*s", ts->t[i - 1].len, ts->t[i - 1].s);
      sc->nns++;
    } else if (i >= 1 && is(&ts->t[i - 1], "namespace")) {
      kind = SC_NAMESPACE;   /* anonymous: no qualifier needed */
      if (sc->nns < 8) sc->ns[sc->nns][0] = 0;
      sc->nns++;
    } else if (i >= 2 && is(&ts->t[i - 2], "extern") && is(&ts->t[i - 1], "\"C\"")) {
      kind = SC_EXTERN_C;
    }
    if (sc->depth < 256) sc->scope[sc->depth] = kind;
    sc->depth++;
    return 1;
  }
  if (t->kind == 'p' && t->s[0] == '}') {
    if (sc->depth > 0) {
      sc->depth--;
      if (sc->depth < 256 && sc->scope[sc->depth] == SC_NAMESPACE) sc->nns--;
    }
    return 1;
  }
  return 0;
}

/* From the __global__ at token i, forward to "name (" past attributes such
 * as __launch_bounds__(...): the name's token, or -1. */
static int kernel_name(const toks *ts, int i)
{
  for (int j = i + 1; j < ts->n; j++) {
    const tok *f = &ts->t[j];
    if (f->kind == 'p' && (f->s[0] == ';' || f->s[0] == '{')) return -1;
    if (f->kind == 'i' && j + 1 < ts->n && is(&ts->t[j + 1], "(")) {
      if (is(f, "__launch_bounds__") || is(f, "__attribute__") || is(f, "__declspec") ||
          is(f, "alignas") || is(f, "__cluster_dims__") || is(f, "__maxnreg__")) {
        int e = match(ts, j + 1);
        if (e < 0) return -1;
        j = e;
        continue;
      }
      return j;
    }
  }
  return -1;
}

/* The kernel's parameters, tokens open+1 .. close-1 split at top-level
 * commas, into k->params. */
static int parse_params(const toks *ts, int open, int close, dev_ksig *k, char *err, size_t errlen)
{
  int a = open + 1;
  int empty = (a == close) || (a + 1 == close && is(&ts->t[a], "void"));
  int cap = 0;
  for (int e = a, lvl = 0; !empty && e <= close; e++) {
    const tok *c = &ts->t[e];
    if (e < close && c->kind == 'p' && (c->s[0] == '(' || c->s[0] == '<' || c->s[0] == '[')) lvl++;
    else if (e < close && c->kind == 'p' && (c->s[0] == ')' || c->s[0] == '>' || c->s[0] == ']')) lvl--;
    if (e == close || (lvl == 0 && c->kind == 'p' && c->s[0] == ',')) {
      if (k->nparams == cap) {
        cap = cap ? 2 * cap : 8;
        dev_kparam *np = realloc(k->params, (size_t)cap * sizeof *np);
        if (!np) return fail_msg(err, errlen, "out of memory");
        k->params = np;
      }
      char perr[160];
      if (parse_param(ts, a, e, &k->params[k->nparams], perr, sizeof perr))
        return fail_msg(err, errlen, "kernel '%s', parameter %d: %s", k->name, k->nparams + 1, perr);
      k->nparams++;
      a = e + 1;
    }
  }
  return 0;
}

/* The kernel named by token name, whose parameters are in (open, close),
 * in the namespaces open: its signature into *k (params to be freed). */
static int parse_kernel(const toks *ts, const scopes *sc, int name, int open, int close, dev_ksig *k,
                        char *err, size_t errlen)
{
  snprintf(k->name, sizeof k->name, "%.*s", ts->t[name].len, ts->t[name].s);
  k->qualified[0] = 0;
  for (int q = 0; q < sc->nns && q < 8; q++) {
    if (!sc->ns[q][0]) continue;
    size_t n = strlen(k->qualified);
    snprintf(k->qualified + n, sizeof k->qualified - n, "%s::", sc->ns[q]);
  }
  size_t qn = strlen(k->qualified);
  snprintf(k->qualified + qn, sizeof k->qualified - qn, "%s", k->name);
  return parse_params(ts, open, close, k, err, errlen);
}

/* A declaration and its definition: one is kept.  1 if ks already has k
 * (marked overloaded when the two differ). */
static int seen_sig(dev_ksig *ks, int nks, const dev_ksig *k)
{
  int dup = 0;
  for (int m = 0; m < nks; m++) {
    if (strcmp(ks[m].qualified, k->qualified) != 0) continue;
    int same = ks[m].nparams == k->nparams;
    for (int q = 0; same && q < k->nparams; q++)
      same = ks[m].params[q].kind == k->params[q].kind && ks[m].params[q].size == k->params[q].size;
    if (!same) ks[m].overloaded = 1;
    dup = 1;
  }
  return dup;
}

int dev_kernels_parse(const char *src, dev_ksig **out, int *nout, char *err, size_t errlen)
{
  toks ts = {0};
  dev_ksig *ks = NULL;
  int nks = 0, capks = 0;
  scopes sc;
  sc.depth = sc.nns = 0;
  *out = NULL;
  *nout = 0;
  if (lex(src, &ts)) { fail_msg(err, errlen, "out of memory"); goto fail; }
  for (int i = 0; i < ts.n; i++) {
    if (scope_token(&sc, &ts, i)) continue;
    if (!(ts.t[i].kind == 'i' && is(&ts.t[i], "__global__"))) continue;
    int in_block = 0, extern_c = 0;
    for (int d = 0; d < sc.depth && d < 256; d++) {
      if (sc.scope[d] == SC_BLOCK) in_block = 1;
      if (sc.scope[d] == SC_EXTERN_C) extern_c = 1;
    }
    if (in_block) continue;
    /* back to the start of the declaration: template? extern "C"? */
    int templ = 0;
    for (int j = i - 1; j >= 0; j--) {
      const tok *b = &ts.t[j];
      if (b->kind == 'p' && (b->s[0] == ';' || b->s[0] == '}' || b->s[0] == '{')) break;
      if (is(b, "template")) templ = 1;
      if (is(b, "\"C\"") && j > 0 && is(&ts.t[j - 1], "extern")) extern_c = 1;
    }
    int name = kernel_name(&ts, i);
    if (name < 0) continue;
    int open = name + 1, close = match(&ts, open);
    if (close < 0) {
      fail_msg(err, errlen, "kernel '%.*s': unbalanced parentheses in its parameter list",
               ts.t[name].len, ts.t[name].s);
      goto fail;
    }
    dev_ksig k;
    memset(&k, 0, sizeof k);
    k.extern_c = extern_c;
    k.is_template = templ;
    if (parse_kernel(&ts, &sc, name, open, close, &k, err, errlen)) { free(k.params); goto fail; }
    if (seen_sig(ks, nks, &k)) { free(k.params); continue; }
    if (add_sig(&ks, &nks, &capks, &k)) { free(k.params); fail_msg(err, errlen, "out of memory"); goto fail; }
    i = close;
  }
  free(ts.t);
  *out = ks;
  *nout = nks;
  return 0;
fail:
  free(ts.t);
  dev_kernels_free(ks, nks);
  return -1;
}

/* PTX: ".visible .entry name(.param .u64 name_param_0, ...)" */
int dev_kernels_parse_ptx(const char *ptx, dev_ksig **out, int *nout, char *err, size_t errlen)
{
  dev_ksig *ks = NULL;
  int nks = 0, capks = 0;
  *out = NULL;
  *nout = 0;
  for (const char *p = strstr(ptx, ".entry"); p; p = strstr(p + 6, ".entry")) {
    const char *q = p + 6;
    if (!isspace((unsigned char)*q)) continue;
    while (isspace((unsigned char)*q)) q++;
    const char *nm = q;
    while (*q && (isalnum((unsigned char)*q) || *q == '_' || *q == '$' || *q == '.')) q++;
    dev_ksig k;
    memset(&k, 0, sizeof k);
    snprintf(k.name, sizeof k.name, "%.*s", (int)(q - nm), nm);
    snprintf(k.qualified, sizeof k.qualified, "%s", k.name);
    k.extern_c = 1;
    k.from_ptx = 1;
    while (isspace((unsigned char)*q)) q++;
    if (*q == '(') {
      const char *end = strchr(q, ')');
      if (!end) { fail_msg(err, errlen, "PTX entry '%s': unterminated parameter list", k.name); goto fail; }
      int cap = 0;
      for (const char *r = strstr(q, ".param"); r && r < end; r = strstr(r + 6, ".param")) {
        if (k.nparams == cap) {
          cap = cap ? 2 * cap : 8;
          dev_kparam *np = realloc(k.params, (size_t)cap * sizeof *np);
          if (!np) { free(k.params); fail_msg(err, errlen, "out of memory"); goto fail; }
          k.params = np;
        }
        dev_kparam *pp = &k.params[k.nparams++];
        memset(pp, 0, sizeof *pp);
        pp->pointee = -1;
        const char *s = r + 6;
        /* ".align N" then ".b8 name[SIZE]" is a struct passed by value */
        while (isspace((unsigned char)*s)) s++;
        char ty[16] = "";
        if (strncmp(s, ".align", 6) == 0) {
          s += 6;
          while (isspace((unsigned char)*s) || isdigit((unsigned char)*s)) s++;
        }
        sscanf(s, ".%15[a-z0-9]", ty);
        while (*s && !isspace((unsigned char)*s)) s++;
        while (isspace((unsigned char)*s)) s++;
        const char *pn = s;
        while (*s && (isalnum((unsigned char)*s) || *s == '_' || *s == '$')) s++;
        snprintf(pp->name, sizeof pp->name, "%.*s", (int)(s - pn), pn);
        /* a width or array count out of any real range is unknown (0), as
         * for .pred: the compiled kernel's sizes decide then */
        long width = strtol(ty + 1, NULL, 10);
        int bits = width > 0 && width <= 1024 ? (int)width : 0;
        snprintf(pp->type, sizeof pp->type, ".%s", ty);
        if (*s == '[') {
          long long count = strtoll(s + 1, NULL, 10);
          pp->kind = DEV_KP_OTHER;
          pp->size = count > 0 && count <= 65536 ? (int)count * (bits / 8) : 0;
        } else if (ty[0] == 'f') {
          pp->kind = bits == 16 ? DEV_KP_RAW : DEV_KP_FLOAT;
          pp->size = bits / 8;
        } else if (ty[0] == 'p' || bits == 0) {
          pp->kind = DEV_KP_OTHER;
          pp->size = 0;
        } else if ((ty[0] == 'u' || ty[0] == 's') && bits < 64) {
          pp->kind = ty[0] == 'u' ? DEV_KP_UINT : DEV_KP_INT;
          pp->size = bits / 8;
        } else {
          /* .u64 / .b64 may be a pointer or an integer: decided by the argument */
          pp->kind = DEV_KP_RAW;
          pp->size = bits / 8;
        }
      }
    }
    if (add_sig(&ks, &nks, &capks, &k)) { free(k.params); fail_msg(err, errlen, "out of memory"); goto fail; }
  }
  *out = ks;
  *nout = nks;
  return 0;
fail:
  dev_kernels_free(ks, nks);
  return -1;
}
