/*
 * sse.h — an incremental parser of Server-Sent Events (text/event-stream) as OpenAI-compatible
 * servers send them: bytes arrive in arbitrary pieces, and every complete event's data is handed to
 * a callback as soon as its terminating blank line is seen.
 *
 * Per the WHATWG grammar: lines end in LF, CRLF or CR; a line "data: X" or "data:X" appends X (plus
 * a newline between several data lines) to the event; lines starting with ':' are comments (llama.cpp
 * pings); other fields (event:, id:, retry:) are ignored; a blank line ends the event, and an event
 * with no data line is not dispatched. cv_sse_finish() dispatches an event cut off by the end of the
 * stream without its blank line, which some servers do for their final "data: [DONE]".
 */
#ifndef CV_BENCH_SSE_H
#define CV_BENCH_SSE_H

#include <stdbool.h>
#include <stddef.h>

/* Receives one event's data (NUL-terminated, len bytes); returns false to stop parsing. */
typedef bool (*cv_sse_event_fn)(void *ctx, const char *data, size_t len);

typedef struct cv_sse {
    char *line;          /* the current, incomplete line */
    size_t n_line, cap_line;
    char *data;          /* the data of the event being built */
    size_t n_data, cap_data;
    bool has_data;
    bool after_cr;       /* the previous byte was CR: a following LF belongs to the same line end */
    bool stopped;        /* the callback asked to stop */
} cv_sse;

void cv_sse_init(cv_sse *p);
void cv_sse_free(cv_sse *p);
/* Feeds bytes; calls fn for each completed event. Returns false once fn has returned false. */
bool cv_sse_feed(cv_sse *p, const char *bytes, size_t len, cv_sse_event_fn fn, void *ctx);
/* End of stream: dispatches a pending event (a last line without its line end counts). */
bool cv_sse_finish(cv_sse *p, cv_sse_event_fn fn, void *ctx);

#endif
