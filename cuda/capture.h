/* Graph capture hooks (cuda/dev_graph.c), called by the neutral files that
 * enqueue or wait while ctx->capture is set. */
#ifndef GPULUA_CAPTURE_H
#define GPULUA_CAPTURE_H

#include "devpriv.h"

/* cuda/dev_graph.c: what the device layer's files call while ctx->capture
 * is set (one branch each when it is not).  Enqueueing on s records into
 * the capture instead (submit: a validated op, unless all its memory is
 * host-visible: that one runs at once, as host work does in a capture,
 * after the host-access fences; record: e recorded on s;
 * wait: s waits for other's work or for e); refuse fails with `what`
 * cannot be captured; a host wait for b fails if the capture uses b.  An
 * event recorded in the capture is held by it, then by the graph, whose
 * replays record it. */
int graph_records(const dev_kop *op);   /* not an op that runs on the host at once */
int graph_submit(dev_stream *s, const dev_kop *op);
int graph_coll(dev_stream *s, const dev_coll *c, int n);   /* a checked collective, recorded */
int graph_record(dev_event *e, dev_stream *s);
int graph_wait(dev_stream *s, dev_stream *other, dev_event *e);
int graph_refuse(dev_ctx *ctx, const char *what);
/* a refusal (DEV_ERR_CAPTURE): the capture is abandoned whatever the caller does */
int graph_fail(dev_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int graph_host_access(dev_ctx *ctx, dev_buf *b, const char *what);
int graph_read(dev_ctx *ctx, dev_buf *b);   /* dev_read of b: a sync, or host access */

#endif
