/* The shared-memory transport between the ranks of one node (cuda/shm_comm.c):
 * the host backend's collectives, and the sideband of the CUDA backend's
 * (cuda/cuda/nccl.c). */
#ifndef GPULUA_SHM_COMM_H
#define GPULUA_SHM_COMM_H

#include "devpriv.h"

/* cuda/shm_comm.c: collectives between the processes of one node through
 * shared memory (the host backend's).  shm_comm_run runs the group numbered
 * seq after every earlier one, from any thread.  With side set, the segment
 * is a sideband only (another transport moves the data): shm_comm_check
 * compares a collective across ranks (every rank calls it, in order), or a
 * group's sends with their receives (each send's header goes to its
 * receiver, which compares it with what it expects), and
 * shm_comm_gone names a rank of mask (a bit per rank; NULL: all) that died,
 * or that left having done fewer than `need` collectives (its count is set
 * with shm_comm_set_done before shm_comm_close), returning its number with
 * the reason in err, or -1. */
typedef struct shm_comm shm_comm;
int shm_comm_open(const dev_rank_info *ri, int side, shm_comm **out, char *err, size_t errlen);
void shm_comm_close(shm_comm *c);
/* a process group's communicator over the members' own segment; its
 * collectives run through shm_comm_run's sub, in turn with the world's */
int shm_comm_open_group(const dev_rank_info *ri, const int *members, int n, int rank, uint64_t id,
                        const char *label, int side, shm_comm **out, char *err, size_t errlen);
int shm_comm_run(shm_comm *c, shm_comm *sub, uint64_t seq, const dev_coll *g, int n, char *err, size_t errlen);
/* (a process group's sideband numbers its collectives itself: seq unused) */
int shm_comm_check(shm_comm *c, uint64_t seq, const dev_coll *g, int n, char *err, size_t errlen);
/* collective seq is not run (what came before it in a replay failed): its
 * turn is taken, and the communicator fails from then on */
int shm_comm_fail(shm_comm *c, uint64_t seq, const char *why);
int shm_comm_gone(shm_comm *c, const uint64_t *mask, uint64_t need, const char *what, char *err, size_t errlen);
void shm_comm_set_done(shm_comm *c, uint64_t done);
/* Where the other ranks are now, asked of each (cuda/where.h), appended to
 * out as "; rank R is at f.lua:12 ...": for a timeout that cannot tell which
 * rank is missing (NCCL's). */
void shm_comm_where(shm_comm *c, char *out, size_t len);
/* a later gpu.init_comm's options, for the collectives enqueued after it */
void shm_comm_set_options(shm_comm *c, int check, double timeout_s);

#endif
