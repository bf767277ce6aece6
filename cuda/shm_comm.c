/* Collectives for the host backend between the ranks of one node: a shared
 * memory segment per job, with a slot per rank for the steps of a collective
 * and a ring per (sender, receiver) pair for send and recv.  Ranks meet at
 * barrier phases.  A waiting rank sleeps on a futex in the segment and, every
 * few milliseconds, checks that the rank it waits for is still there, so a
 * rank that died or finished its script is an error here, not a hang.  Each
 * collective is first compared across ranks (kind, dtype, count, op, root):
 * ranks that disagree all fail with both calls named. */
#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "devpriv.h"
#include "shm_comm.h"
#include "util.h"
#include "where.h"

#define HC_MAGIC 0x67706c7561636f6dULL
#define HC_SLOT ((size_t)1 << 20)     /* bytes per rank per step */
#define HC_CHAN ((size_t)128 << 10)   /* bytes per send/recv ring */
#define HC_SIDE_CHAN ((size_t)4 << 10) /* ... in a sideband: headers only */
#define HC_TICK_NS 20000000L          /* liveness checks while waiting */
#define HC_MAXRANK 256

enum { HC_ABSENT, HC_JOINED, HC_LEFT };

typedef struct hc_sig {
  uint64_t seq;
  int32_t kind, dtype, red, peer;
  int64_t count;
  int32_t graph;    /* captured: run by a graph replay */
} hc_sig;

typedef struct hc_rank {
  _Alignas(64) _Atomic uint64_t phase;   /* barrier phases passed */
  _Atomic int32_t state;
  _Atomic int32_t pid;
  _Atomic uint64_t done;                 /* collectives finished (read when it left) */
  hc_sig sig;                            /* the collective it is in */
} hc_rank;

typedef struct hc_chan {
  _Alignas(64) _Atomic uint64_t posted;  /* bytes written by the sender */
  _Alignas(64) _Atomic uint64_t consumed;
} hc_chan;

typedef struct hc_hdr {
  _Atomic uint64_t magic;      /* set last by rank 0 */
  int32_t world;
  _Atomic int32_t creator;
  _Atomic int32_t joined;
  _Atomic uint32_t bell;       /* bumped on every change; futex word */
} hc_hdr;

struct shm_comm {
  void *map;
  size_t bytes;
  hc_hdr *h;
  hc_rank *ranks;
  hc_chan *chans;
  unsigned char *slots, *rings;
  int rank, world, check;
  int side;                    /* sideband only: no slots, rings for headers (another transport moves the data) */
  size_t chan;                 /* bytes per ring */
  double timeout;
  uint64_t phase;              /* phases this rank has passed */
  uint64_t done;
  /* collectives run in the order they were enqueued, whichever stream */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t next_seq;
  int broken;
  char broken_msg[512];
  /* a process group's: its members' world ranks (NULL: the world's own),
   * its name in messages, its segment's name suffix */
  int *gmap;
  char label[96];
  char tag[48];
};

/* Rank q of c as the world numbers it, for messages. */
static int wr(const shm_comm *c, int q) { return c->gmap && q >= 0 ? c->gmap[q] : q; }

static size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

static size_t layout(int world, int side, size_t *ranks_off, size_t *chans_off, size_t *slots_off, size_t *rings_off) {
  size_t off = align_up(sizeof(hc_hdr), 64);
  *ranks_off = off;
  off = align_up(off + (size_t)world * sizeof(hc_rank), 64);
  *chans_off = off;
  off = align_up(off + (size_t)world * (size_t)world * sizeof(hc_chan), 4096);
  *slots_off = off;
  if (!side) off += (size_t)world * HC_SLOT;
  *rings_off = off;
  off += (size_t)world * (size_t)world * (side ? HC_SIDE_CHAN : HC_CHAN);
  return off;
}

static void attach(shm_comm *c, void *map) {
  size_t ro, co, so, go;
  c->bytes = layout(c->world, c->side, &ro, &co, &so, &go);
  c->map = map;
  c->h = map;
  c->ranks = (hc_rank *)((char *)map + ro);
  c->chans = (hc_chan *)((char *)map + co);
  c->slots = (unsigned char *)map + so;
  c->rings = (unsigned char *)map + go;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void bell_ring(shm_comm *c) {
  atomic_fetch_add(&c->h->bell, 1);
  syscall(SYS_futex, (uint32_t *)&c->h->bell, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static void bell_wait(shm_comm *c, uint32_t seen) {
  struct timespec ts = {0, HC_TICK_NS};
  syscall(SYS_futex, (uint32_t *)&c->h->bell, FUTEX_WAIT, seen, &ts, NULL, 0);
}

/* Is rank q still in the job?  0, or -1 with why not. */
static int alive(shm_comm *c, int q, const char *what, char *err, size_t errlen) {
  hc_rank *r = &c->ranks[q];
  if (atomic_load(&r->state) == HC_LEFT)
    return c->gmap ? fail_msg(err, errlen, "rank %d left %s (closed it, or its script ended, after %llu collectives "
                              "of it) while rank %d waits for it in %s", wr(c, q), c->label,
                              (unsigned long long)atomic_load(&r->done), wr(c, c->rank), what)
                   : fail_msg(err, errlen, "rank %d left the job (its script ended after %llu collectives) while "
                              "rank %d waits for it in %s", q, (unsigned long long)atomic_load(&r->done), c->rank,
                              what);
  int pid = atomic_load(&r->pid);
  if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH)
    return fail_msg(err, errlen, "rank %d (pid %d) is gone: it died while rank %d waits for it in %s", wr(c, q), pid,
                    wr(c, c->rank), what);
  return 0;
}

/* Wait until every rank has passed phase p. */
static int wait_phase(shm_comm *c, uint64_t p, const char *what, char *err, size_t errlen) {
  double t0 = now_s();
  for (;;) {
    uint32_t seen = atomic_load(&c->h->bell);
    int who = -1;
    for (int q = 0; q < c->world && who < 0; q++)
      if (atomic_load_explicit(&c->ranks[q].phase, memory_order_acquire) < p) who = q;
    if (who < 0) return 0;
    if (alive(c, who, what, err, errlen)) return -1;
    if (now_s() - t0 > c->timeout) {
      char at[256];
      if (!where_ask(atomic_load(&c->ranks[who].pid), at, sizeof at, 1.0))
        snprintf(at, sizeof at, "did not say where it is");
      return fail_msg(err, errlen, "timed out after %.0f s: rank %d never reached %s; rank %d %s (set "
                      "GPULUA_COMM_TIMEOUT to wait longer)", c->timeout, wr(c, who), what, wr(c, who), at);
    }
    bell_wait(c, seen);
  }
}

static int barrier(shm_comm *c, const char *what, char *err, size_t errlen) {
  uint64_t p = ++c->phase;
  atomic_store_explicit(&c->ranks[c->rank].phase, p, memory_order_release);
  bell_ring(c);
  return wait_phase(c, p, what, err, errlen);
}

/* ---- joining and leaving -------------------------------------------------- */

static int open_private(shm_comm *c, char *err, size_t errlen) {
  size_t ro, co, so, go;
  size_t bytes = layout(c->world, c->side, &ro, &co, &so, &go);
  void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return fail_msg(err, errlen, "cannot map %zu bytes: %s", bytes, strerror(errno));
  attach(c, m);
  c->h->world = c->world;
  atomic_store(&c->ranks[0].pid, (int32_t)getpid());
  atomic_store(&c->ranks[0].state, HC_JOINED);
  atomic_store(&c->h->joined, 1);
  atomic_store(&c->h->magic, HC_MAGIC);
  return 0;
}

static void seg_name(char *name, size_t len, int port, int world, int side, const char *tag) {
  snprintf(name, len, "/gpulua-%u-%d-%d%s%s", (unsigned)getuid(), port, world, tag, side ? "-side" : "");
}

void dev_comm_cleanup(int port, int world) {
  char name[128];
  for (int side = 0; side < 2; side++) {
    seg_name(name, sizeof name, port, world, side, "");
    shm_unlink(name);
  }
  /* the process groups' segments: "<the job's>-g<id>-<rank>" */
  seg_name(name, sizeof name, port, world, 0, "-g");
  DIR *d = opendir("/dev/shm");
  struct dirent *e;
  while (d && (e = readdir(d)))
    if (strncmp(e->d_name, name + 1, strlen(name + 1)) == 0) {
      char path[300];
      snprintf(path, sizeof path, "/%s", e->d_name);
      shm_unlink(path);
    }
  if (d) closedir(d);
}

/* Rank 0: a new segment of bytes named name, mapped and attached, its
 * header ready for the others. */
static int create_shared(shm_comm *c, const char *name, size_t bytes, char *err, size_t errlen) {
  shm_unlink(name);   /* a segment left by a job that died */
  int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return fail_msg(err, errlen, "cannot create shared memory %s: %s", name, strerror(errno));
  if (ftruncate(fd, (off_t)bytes) != 0) {
    int e = errno;
    close(fd);
    shm_unlink(name);
    return fail_msg(err, errlen, "cannot size shared memory %s to %zu bytes: %s (is /dev/shm big enough?)", name,
                bytes, strerror(e));
  }
  void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  close(fd);
  if (m == MAP_FAILED) {
    shm_unlink(name);
    return fail_msg(err, errlen, "cannot map shared memory %s: %s", name, strerror(e));
  }
  attach(c, m);
  c->h->world = c->world;
  atomic_store(&c->h->creator, (int32_t)getpid());
  atomic_store(&c->ranks[0].pid, (int32_t)getpid());
  atomic_store(&c->ranks[0].state, HC_JOINED);
  atomic_store(&c->h->joined, 1);
  atomic_store_explicit(&c->h->magic, HC_MAGIC, memory_order_release);
  return 0;
}

/* The other ranks: rank 0's segment of this job, once it is ready (until
 * the timeout, from t0), mapped and attached; then this rank joins. */
static int join_shared(shm_comm *c, const char *name, size_t bytes, double t0, char *err, size_t errlen) {
  void *m = MAP_FAILED;
  for (;;) {
    int fd = shm_open(name, O_RDWR, 0);
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0 && (size_t)st.st_size == bytes) {
      m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      close(fd);
      if (m != MAP_FAILED) {
        hc_hdr *h = m;
        int creator = atomic_load(&h->creator);
        /* rank 0's segment of this job: ready, and its maker alive */
        if (atomic_load_explicit(&h->magic, memory_order_acquire) == HC_MAGIC && h->world == c->world &&
            creator > 0 && (kill(creator, 0) == 0 || errno != ESRCH))
          break;
        munmap(m, bytes);
        m = MAP_FAILED;
      }
    } else if (fd >= 0) {
      close(fd);
    }
    if (now_s() - t0 > c->timeout)
      return fail_msg(err, errlen, "timed out after %.0f s waiting for rank 0 to open the job's shared memory %s",
                  c->timeout, name);
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
  }
  attach(c, m);
  atomic_store(&c->ranks[c->rank].pid, (int32_t)getpid());
  atomic_store(&c->ranks[c->rank].state, HC_JOINED);
  atomic_fetch_add(&c->h->joined, 1);
  bell_ring(c);
  return 0;
}

static int open_shared(shm_comm *c, const dev_rank_info *ri, char *err, size_t errlen) {
  char name[128];
  seg_name(name, sizeof name, ri->master_port, ri->world, c->side, c->tag);
  size_t ro, co, so, go;
  size_t bytes = layout(c->world, c->side, &ro, &co, &so, &go);
  double t0 = now_s();
  int rc = c->rank == 0 ? create_shared(c, name, bytes, err, errlen) : join_shared(c, name, bytes, t0, err, errlen);
  if (rc) return rc;
  /* everyone in before the first collective; then the name can go */
  for (;;) {
    uint32_t seen = atomic_load(&c->h->bell);
    if (atomic_load(&c->h->joined) == c->world) break;
    for (int q = 0; q < c->world; q++)
      if (atomic_load(&c->ranks[q].state) != HC_ABSENT && alive(c, q, "joining the job", err, errlen)) goto fail;
    if (now_s() - t0 > c->timeout) {
      fail_msg(err, errlen, "timed out after %.0f s: %d of %d ranks joined the job", c->timeout,
           (int)atomic_load(&c->h->joined), c->world);
      goto fail;
    }
    bell_wait(c, seen);
  }
  if (c->rank == 0) shm_unlink(name);
  return 0;
fail:
  if (c->rank == 0) shm_unlink(name);
  atomic_store(&c->ranks[c->rank].state, HC_LEFT);
  bell_ring(c);
  munmap(c->map, c->bytes);
  c->map = NULL;
  return -1;
}

static shm_comm *comm_new(const dev_rank_info *ri, int rank, int world, int side) {
  shm_comm *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->rank = rank;
  c->world = world;
  c->check = ri->check;
  c->side = side;
  c->chan = side ? HC_SIDE_CHAN : HC_CHAN;
  c->timeout = ri->timeout_s > 0 ? ri->timeout_s : 300;
  c->next_seq = 1;
  snprintf(c->label, sizeof c->label, "the job");
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  return c;
}

static void comm_free(shm_comm *c) {
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  free(c->gmap);
  free(c);
}

int shm_comm_open(const dev_rank_info *ri, int side, shm_comm **out, char *err, size_t errlen) {
  *out = NULL;
  if (ri->world > HC_MAXRANK)
    return fail_msg(err, errlen, "the host backend joins at most %d ranks, not %d", HC_MAXRANK, ri->world);
  if (ri->local_world != ri->world)
    return fail_msg(err, errlen, "the host backend joins ranks of one node only (world of %d, %d on this node)",
                ri->world, ri->local_world);
  shm_comm *c = comm_new(ri, ri->rank, ri->world, side);
  if (!c) return fail_msg(err, errlen, "out of memory");
  int rc = c->world == 1 ? open_private(c, err, errlen) : open_shared(c, ri, err, errlen);
  if (rc) {
    comm_free(c);
    return -1;
  }
  *out = c;
  return 0;
}

int shm_comm_open_group(const dev_rank_info *ri, const int *members, int n, int rank, uint64_t id,
                        const char *label, int side, shm_comm **out, char *err, size_t errlen) {
  *out = NULL;
  shm_comm *c = comm_new(ri, rank, n, side);
  if (!c || !(c->gmap = malloc((size_t)n * sizeof *c->gmap))) {
    if (c) comm_free(c);
    return fail_msg(err, errlen, "out of memory");
  }
  memcpy(c->gmap, members, (size_t)n * sizeof *c->gmap);
  snprintf(c->label, sizeof c->label, "%s", label);
  /* the groups of one split have no member in common: their group rank
   * 0's world rank tells them apart */
  snprintf(c->tag, sizeof c->tag, "-g%llu-%d", (unsigned long long)id, members[0]);
  int rc = n == 1 ? open_private(c, err, errlen) : open_shared(c, ri, err, errlen);
  if (rc) {
    char why[512];
    snprintf(why, sizeof why, "%s", err);
    fail_msg(err, errlen, "making %s: %s", c->label, why);
    comm_free(c);
    return -1;
  }
  *out = c;
  return 0;
}

void shm_comm_close(shm_comm *c) {
  if (!c) return;
  if (c->map) {
    atomic_store(&c->ranks[c->rank].done, c->done);
    atomic_store(&c->ranks[c->rank].state, HC_LEFT);
    bell_ring(c);
    munmap(c->map, c->bytes);
  }
  comm_free(c);
}

/* ---- element arithmetic ---------------------------------------------------- */

static int64_t ld_int(dev_dtype t, const unsigned char *p, size_t i) {
  switch (t) {
  case DEV_I8: return ((const int8_t *)p)[i];
  case DEV_U8: return ((const uint8_t *)p)[i];
  case DEV_I32: return ((const int32_t *)p)[i];
  case DEV_I64: return ((const int64_t *)p)[i];
  default: return 0;
  }
}

static void st_int(dev_dtype t, unsigned char *p, size_t i, int64_t v) {
  switch (t) {
  case DEV_I8: ((int8_t *)p)[i] = (int8_t)v; break;
  case DEV_U8: ((uint8_t *)p)[i] = (uint8_t)v; break;
  case DEV_I32: ((int32_t *)p)[i] = (int32_t)v; break;
  case DEV_I64: ((int64_t *)p)[i] = v; break;
  default: break;
  }
}

static double ld_flt(dev_dtype t, const unsigned char *p, size_t i) {
  switch (t) {
  case DEV_F32: return ((const float *)p)[i];
  case DEV_F64: return ((const double *)p)[i];
  case DEV_F16: return dev_half_to_float(((const uint16_t *)p)[i]);
  case DEV_BF16: return dev_bf16_to_float(((const uint16_t *)p)[i]);
  default: return 0;
  }
}

static void st_flt(dev_dtype t, unsigned char *p, size_t i, double v) {
  switch (t) {
  case DEV_F32: ((float *)p)[i] = (float)v; break;
  case DEV_F64: ((double *)p)[i] = v; break;
  case DEV_F16: ((uint16_t *)p)[i] = dev_float_to_half((float)v); break;
  case DEV_BF16: ((uint16_t *)p)[i] = dev_float_to_bf16((float)v); break;
  default: break;
  }
}

/* dst[i] = src[0][i] op src[1][i] op ..., in rank order on every rank, so
 * every rank gets the same bits.  Integers wrap (as NCCL's do). */
static void reduce_into(dev_dtype t, dev_cred r, unsigned char *dst, unsigned char *const *src, int w, size_t n) {
  if (dev_dtype_is_float(t)) {
    for (size_t i = 0; i < n; i++) {
      double a = ld_flt(t, src[0], i);
      for (int q = 1; q < w; q++) {
        double b = ld_flt(t, src[q], i);
        switch (r) {
        case DEV_CRED_SUM: case DEV_CRED_AVG: a += b; break;
        case DEV_CRED_PROD: a *= b; break;
        case DEV_CRED_MAX: if (b != b || b > a) a = b; break;   /* a NaN wins, as in a kernel's fmax chain */
        case DEV_CRED_MIN: if (b != b || b < a) a = b; break;
        default: break;
        }
      }
      if (r == DEV_CRED_AVG) a /= w;
      st_flt(t, dst, i, a);
    }
    return;
  }
  for (size_t i = 0; i < n; i++) {
    int64_t a = ld_int(t, src[0], i);
    for (int q = 1; q < w; q++) {
      int64_t b = ld_int(t, src[q], i);
      switch (r) {
      case DEV_CRED_SUM: a = (int64_t)((uint64_t)a + (uint64_t)b); break;
      case DEV_CRED_PROD: a = (int64_t)((uint64_t)a * (uint64_t)b); break;
      case DEV_CRED_MAX: if (b > a) a = b; break;
      case DEV_CRED_MIN: if (b < a) a = b; break;
      default: break;
      }
    }
    st_int(t, dst, i, a);
  }
}

/* ---- collectives ----------------------------------------------------------- */

static unsigned char *slot(shm_comm *c, int q) { return c->slots + (size_t)q * HC_SLOT; }
static unsigned char *vptr(const dev_view *v) { return (unsigned char *)dev_view_ptr(v); }

static void describe(char *out, size_t len, const hc_sig *s) {
  int red = s->kind == DEV_COLL_ALL_REDUCE || s->kind == DEV_COLL_REDUCE || s->kind == DEV_COLL_REDUCE_SCATTER;
  int root = s->kind == DEV_COLL_BROADCAST || s->kind == DEV_COLL_REDUCE;
  char r[32] = "";
  if (root) snprintf(r, sizeof r, ", root %d", (int)s->peer);
  snprintf(out, len, "%s%s%s%s of %lld %s%s%s", dev_coll_name((dev_coll_kind)s->kind), red ? "(" : "",
           red ? dev_cred_name((dev_cred)s->red) : "", red ? ")" : "", (long long)s->count,
           dev_dtype_name((dev_dtype)s->dtype), r, s->graph ? " in a graph replay" : "");
}

/* Publish this rank's call, meet, and compare: every rank sees the same
 * table, so ranks that disagree all fail, together. */
static int check_sig(shm_comm *c, const dev_coll *x, uint64_t seq, const char *what, char *err, size_t errlen) {
  hc_sig *me = &c->ranks[c->rank].sig;
  const dev_view *v = x->kind == DEV_COLL_RECV ? &x->recv : &x->send;
  me->seq = seq;
  me->kind = x->kind;
  me->dtype = v->dtype;
  me->red = x->red;
  me->peer = x->kind == DEV_COLL_BROADCAST || x->kind == DEV_COLL_REDUCE ? x->peer : -1;
  me->count = dev_view_numel(&x->send);
  me->graph = x->graph != 0;
  if (barrier(c, what, err, errlen)) return -1;
  const hc_sig *a = &c->ranks[0].sig;
  for (int q = 1; q < c->world; q++) {
    const hc_sig *b = &c->ranks[q].sig;
    int same = a->kind == b->kind && a->dtype == b->dtype && a->count == b->count && a->peer == b->peer &&
               a->graph == b->graph;
    if (same && (a->kind == DEV_COLL_ALL_REDUCE || a->kind == DEV_COLL_REDUCE || a->kind == DEV_COLL_REDUCE_SCATTER))
      same = a->red == b->red;
    if (!same) {
      char da[128], db[128];
      describe(da, sizeof da, a);
      describe(db, sizeof db, b);
      return fail_msg(err, errlen, "ranks%s%s disagree on collective #%llu: rank %d called %s, rank %d called %s",
                      c->gmap ? " of " : "", c->gmap ? c->label : "", (unsigned long long)seq, wr(c, 0), da,
                      wr(c, q), db);
    }
  }
  return 0;
}

static int run_rooted_or_reduce(shm_comm *c, const dev_coll *x, const char *what, char *err, size_t errlen) {
  dev_dtype t = x->send.dtype;
  size_t esz = dev_dtype_size(t), n = (size_t)dev_view_numel(&x->send), w = (size_t)c->world;
  unsigned char *send = vptr(&x->send), *recv = vptr(&x->recv);
  unsigned char *src[HC_MAXRANK];
  size_t per;
  switch (x->kind) {
  case DEV_COLL_ALL_REDUCE: case DEV_COLL_REDUCE:
    per = HC_SLOT / esz;
    for (size_t off = 0; off < n || off == 0; off += per) {
      size_t k = n - off < per ? n - off : per;
      memcpy(slot(c, c->rank), send + off * esz, k * esz);
      if (barrier(c, what, err, errlen)) return -1;
      if (x->kind == DEV_COLL_ALL_REDUCE || x->peer == c->rank) {
        for (size_t q = 0; q < w; q++) src[q] = slot(c, (int)q);
        reduce_into(t, x->red, recv + off * esz, src, c->world, k);
      }
      if (barrier(c, what, err, errlen)) return -1;
    }
    return 0;
  case DEV_COLL_BROADCAST:
    per = HC_SLOT / esz;
    if (c->rank == x->peer && recv != send) memmove(recv, send, n * esz);
    for (size_t off = 0; off < n || off == 0; off += per) {
      size_t k = n - off < per ? n - off : per;
      if (c->rank == x->peer) memcpy(slot(c, x->peer), send + off * esz, k * esz);
      if (barrier(c, what, err, errlen)) return -1;
      if (c->rank != x->peer) memcpy(recv + off * esz, slot(c, x->peer), k * esz);
      if (barrier(c, what, err, errlen)) return -1;
    }
    return 0;
  case DEV_COLL_ALL_GATHER:
    per = HC_SLOT / esz;
    for (size_t off = 0; off < n || off == 0; off += per) {
      size_t k = n - off < per ? n - off : per;
      memcpy(slot(c, c->rank), send + off * esz, k * esz);
      if (barrier(c, what, err, errlen)) return -1;
      for (size_t q = 0; q < w; q++) memmove(recv + (q * n + off) * esz, slot(c, (int)q), k * esz);
      if (barrier(c, what, err, errlen)) return -1;
    }
    return 0;
  case DEV_COLL_REDUCE_SCATTER: {
    size_t m = n / w;   /* elements each rank ends with */
    per = HC_SLOT / (esz * w);
    for (size_t off = 0; off < m || off == 0; off += per) {
      size_t k = m - off < per ? m - off : per;
      for (size_t q = 0; q < w; q++) memcpy(slot(c, c->rank) + q * k * esz, send + (q * m + off) * esz, k * esz);
      if (barrier(c, what, err, errlen)) return -1;
      for (size_t q = 0; q < w; q++) src[q] = slot(c, (int)q) + (size_t)c->rank * k * esz;
      reduce_into(t, x->red, recv + off * esz, src, c->world, k);
      if (barrier(c, what, err, errlen)) return -1;
    }
    return 0;
  }
  default:
    return fail_msg(err, errlen, "%s is not a collective of the whole job", dev_coll_name(x->kind));
  }
}

/* One send or recv in a group: a stream of a 16-byte header (dtype, count)
 * then the elements, through the ring of its (sender, receiver) pair. */
typedef struct p2p {
  const dev_coll *x;
  hc_chan *ch;
  unsigned char *ring;
  int64_t hdr[2];
  size_t total, moved;   /* header included */
} p2p;

static unsigned char *p2p_byte(p2p *p, size_t i) {
  return i < sizeof p->hdr ? (unsigned char *)p->hdr + i
                           : vptr(p->x->kind == DEV_COLL_SEND ? &p->x->send : &p->x->recv) + (i - sizeof p->hdr);
}

/* Move what the ring allows; 1 if anything moved. */
static int p2p_progress(p2p *p, shm_comm *c, char *err, size_t errlen, int *bad) {
  int is_send = p->x->kind == DEV_COLL_SEND, moved = 0;
  while (p->moved < p->total) {
    uint64_t posted = atomic_load_explicit(&p->ch->posted, memory_order_acquire);
    uint64_t consumed = atomic_load_explicit(&p->ch->consumed, memory_order_acquire);
    size_t room = is_send ? c->chan - (size_t)(posted - consumed) : (size_t)(posted - consumed);
    size_t at = (size_t)((is_send ? posted : consumed) % c->chan);
    size_t k = p->total - p->moved;
    /* the header arrives whole before it is read */
    if (!is_send && p->moved < sizeof p->hdr) k = sizeof p->hdr - p->moved;
    if (k > room) k = room;
    if (k > c->chan - at) k = c->chan - at;
    if (p->moved < sizeof p->hdr && k > sizeof p->hdr - p->moved) k = sizeof p->hdr - p->moved;
    if (k == 0) break;
    if (is_send) memcpy(p->ring + at, p2p_byte(p, p->moved), k);
    else memcpy(p2p_byte(p, p->moved), p->ring + at, k);
    p->moved += k;
    moved = 1;
    atomic_store_explicit(is_send ? &p->ch->posted : &p->ch->consumed, (is_send ? posted : consumed) + k,
                          memory_order_release);
    if (!is_send && p->moved == sizeof p->hdr) {
      int64_t want = dev_view_numel(&p->x->recv);
      if (p->hdr[0] != (int64_t)p->x->recv.dtype || p->hdr[1] != want) {
        *bad = 1;
        return fail_msg(err, errlen, "rank %d sent %lld %s to rank %d%s%s, which expected %lld %s", wr(c, p->x->peer),
                        (long long)p->hdr[1], dev_dtype_name((dev_dtype)p->hdr[0]), wr(c, c->rank),
                        c->gmap ? " in " : "", c->gmap ? c->label : "", (long long)want,
                        dev_dtype_name(p->x->recv.dtype));
      }
    }
  }
  return moved;
}

static int run_p2p(shm_comm *c, const dev_coll *g, int n, const char *what, char *err, size_t errlen) {
  p2p *ps = calloc((size_t)n, sizeof *ps);
  if (!ps) return fail_msg(err, errlen, "out of memory");
  for (int i = 0; i < n; i++) {
    const dev_coll *x = &g[i];
    int is_send = x->kind == DEV_COLL_SEND;
    size_t pair = is_send ? (size_t)c->rank * (size_t)c->world + (size_t)x->peer
                          : (size_t)x->peer * (size_t)c->world + (size_t)c->rank;
    const dev_view *v = is_send ? &x->send : &x->recv;
    ps[i].x = x;
    ps[i].ch = &c->chans[pair];
    ps[i].ring = c->rings + pair * c->chan;
    ps[i].hdr[0] = v->dtype;
    ps[i].hdr[1] = dev_view_numel(v);
    /* a sideband carries the headers only */
    ps[i].total = sizeof ps[i].hdr + (c->side ? 0 : (size_t)dev_view_numel(v) * dev_dtype_size(v->dtype));
  }
  double t0 = now_s();
  int rc = 0;
  for (;;) {
    uint32_t seen = atomic_load(&c->h->bell);
    int any = 0, left = 0, blocked = -1, bad = 0;
    for (int i = 0; i < n && !bad; i++) {
      if (ps[i].moved == ps[i].total) continue;
      /* ops on one ring go in the order they were called */
      int first = 1;
      for (int j = 0; j < i; j++)
        if (ps[j].ch == ps[i].ch && ps[j].x->kind == ps[i].x->kind && ps[j].moved < ps[j].total) first = 0;
      if (!first) { left++; continue; }
      int m = p2p_progress(&ps[i], c, err, errlen, &bad);
      if (bad) { rc = -1; break; }
      if (m) any = 1;
      if (ps[i].moved < ps[i].total) {
        left++;
        if (blocked < 0) blocked = ps[i].x->peer;
      }
    }
    if (rc) break;
    if (any) bell_ring(c);
    if (!left) break;
    if (any) continue;
    if (blocked >= 0 && blocked != c->rank && alive(c, blocked, what, err, errlen)) { rc = -1; break; }
    if (now_s() - t0 > c->timeout) {
      rc = fail_msg(err, errlen, "timed out after %.0f s in %s waiting for rank %d (set GPULUA_COMM_TIMEOUT to wait "
                "longer)", c->timeout, what, wr(c, blocked));
      break;
    }
    bell_wait(c, seen);
  }
  free(ps);
  return rc;
}

int shm_comm_run(shm_comm *c, shm_comm *sub, uint64_t seq, const dev_coll *g, int n, char *err, size_t errlen) {
  pthread_mutex_lock(&c->mu);
  while (c->next_seq != seq) pthread_cond_wait(&c->cv, &c->mu);
  pthread_mutex_unlock(&c->mu);

  /* in its turn among this rank's collectives; through the group's segment,
   * numbered there by the group's own count (alike on its members) */
  shm_comm *t = sub ? sub : c;
  char what[192];
  int p2p_group = g[0].kind == DEV_COLL_SEND || g[0].kind == DEV_COLL_RECV;
  uint64_t k = sub ? sub->done + 1 : seq;
  dev_coll_describe(what, sizeof what, g[0].kind, n, k);
  if (sub) snprintf(what + strlen(what), sizeof what - strlen(what), " of %s", sub->label);
  int rc;
  if (c->broken) {
    rc = fail_msg(err, errlen, "%s: the communicator failed earlier: %s", what, c->broken_msg);
  } else if (p2p_group) {
    rc = run_p2p(t, g, n, what, err, errlen);
  } else {
    rc = c->check ? check_sig(t, &g[0], k, what, err, errlen) : 0;
    if (rc == 0) rc = run_rooted_or_reduce(t, &g[0], what, err, errlen);
  }
  if (rc && !c->broken) {
    c->broken = 1;
    snprintf(c->broken_msg, sizeof c->broken_msg, "%s", err);
  }
  t->done++;
  atomic_store(&t->ranks[t->rank].done, t->done);

  pthread_mutex_lock(&c->mu);
  c->next_seq = seq + 1;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  return rc;
}

int shm_comm_fail(shm_comm *c, uint64_t seq, const char *why) {
  pthread_mutex_lock(&c->mu);
  while (c->next_seq != seq) pthread_cond_wait(&c->cv, &c->mu);
  if (!c->broken) {
    c->broken = 1;
    snprintf(c->broken_msg, sizeof c->broken_msg, "collective #%llu was not run: %s", (unsigned long long)seq, why);
  }
  c->next_seq = seq + 1;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  return -1;
}

/* ---- sideband for another transport ----------------------------------------
 * The CUDA backend moves data with NCCL but joins the same segment (without
 * slots or rings) to compare collectives across ranks and to see a rank that
 * left or died, which NCCL itself does not notice between GPUs of one node. */

int shm_comm_check(shm_comm *c, uint64_t seq, const dev_coll *g, int n, char *err, size_t errlen) {
  char what[192];
  int p2p = g[0].kind == DEV_COLL_SEND || g[0].kind == DEV_COLL_RECV;
  /* a process group's sideband numbers its collectives itself */
  if (c->gmap) seq = c->done + 1;
  dev_coll_describe(what, sizeof what, g[0].kind, n, seq);
  if (c->gmap) snprintf(what + strlen(what), sizeof what - strlen(what), " of %s", c->label);
  /* sends and receives: each send's header to its receiver, which compares */
  int rc = p2p ? run_p2p(c, g, n, what, err, errlen) : check_sig(c, &g[0], seq, what, err, errlen);
  if (c->gmap) atomic_store(&c->ranks[c->rank].done, ++c->done);
  return rc;
}

int shm_comm_gone(shm_comm *c, const uint64_t *mask, uint64_t need, const char *what, char *err, size_t errlen) {
  for (int q = 0; q < c->world; q++) {
    if (q == c->rank || (mask && !(mask[q / 64] >> (q % 64) & 1))) continue;
    hc_rank *r = &c->ranks[q];
    int left = atomic_load(&r->state) == HC_LEFT;
    if (left && atomic_load(&r->done) >= need) continue;
    if ((left || atomic_load(&r->state) == HC_JOINED) && alive(c, q, what, err, errlen)) return q;
  }
  return -1;
}

void shm_comm_set_done(shm_comm *c, uint64_t done) { c->done = done; }

void shm_comm_set_options(shm_comm *c, int check, double timeout_s) {
  pthread_mutex_lock(&c->mu);
  c->check = check;
  if (timeout_s > 0) c->timeout = timeout_s;
  pthread_mutex_unlock(&c->mu);
}

void shm_comm_where(shm_comm *c, char *out, size_t len) {
  double wait = c->world > 2 ? 1.0 / (c->world - 1) : 1.0;
  if (wait < 0.2) wait = 0.2;
  for (int q = 0; q < c->world; q++) {
    size_t at = strlen(out);
    int pid = atomic_load(&c->ranks[q].pid);
    if (q == c->rank || pid <= 0 || at + 1 >= len) continue;
    char here[256];
    if (where_ask(pid, here, sizeof here, wait)) snprintf(out + at, len - at, "; rank %d %s", wr(c, q), here);
  }
}
