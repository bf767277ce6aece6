/* Race checker hooks (cuda/race.c), called by the neutral files that
 * enqueue, wait or free. */
#ifndef GPULUA_RACE_H
#define GPULUA_RACE_H

#include "devpriv.h"

/* cuda/race.c: the stream race checker (GPULUA_CHECK=races).  The hooks
 * below are called by the dev*.c files only while ctx->race is set, except
 * the *_gone ones, which free an object's checker state whenever it has
 * some. */
int race_set(dev_ctx *ctx, int on);
/* commit 0: before enqueueing, DEV_ERR_RACE if the op's accesses conflict
 * with unordered work of other streams; commit 1: after, record them */
int race_op(dev_ctx *ctx, dev_stream *s, const dev_kop *op, int commit);
int race_coll(dev_ctx *ctx, dev_stream *s, const dev_coll *c, int n, int commit);
/* commit 1 for an op or collective of a replay, which takes several
 * positions of s: the one of its stretch between the replay's records */
void race_op_at(dev_ctx *ctx, dev_stream *s, const dev_kop *op, uint64_t pos);
void race_coll_at(dev_ctx *ctx, dev_stream *s, const dev_coll *c, int n, uint64_t pos);
/* s now waits for other's queued work, or for e's record */
void race_wait(dev_stream *s, dev_stream *other, dev_event *e);
void race_record(dev_event *e, dev_stream *s);
/* the host waited for s's queued work, for e, or (both NULL) for every stream */
void race_host_waited(dev_ctx *ctx, dev_stream *s, dev_event *e);
/* a host-access fence; and dev_read's wait for the last writer of b on s */
void race_fence(dev_buf *b, int write);
void race_host_reached(dev_ctx *ctx, dev_stream *s, uint64_t pos);
void race_read_wait(dev_stream *s, dev_buf *b);
void race_stream_gone(dev_stream *s);
void race_event_gone(dev_event *e);
void race_buf_gone(struct race_buf *rb);
/* dev_buf.c: where a buffer keeps its checker state */
struct race_buf **dev_buf_racep(dev_buf *b);

#endif
