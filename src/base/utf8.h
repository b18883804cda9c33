/*
 * utf8.h — UTF-8 validation, decoding and lossy repair.
 *
 * One decoder implements Unicode's table of well-formed byte sequences (Unicode 15, table 3-7):
 * no overlong forms, no surrogates, nothing above U+10FFFF. It classifies the bytes at a position
 * as a whole character, an ill-formed "maximal subpart" (the longest prefix of something that could
 * have been valid, at least one byte), or a valid but unfinished sequence cut off by the end of the
 * buffer. Everything else is built on that: strict validation for input text, and the lossy repair
 * that replaces each maximal subpart by one U+FFFD, which is exactly what Rust's
 * String::from_utf8_lossy (and therefore Hugging Face decoding) produces.
 */
#ifndef CV_UTF8_H
#define CV_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum cv_utf8_status {
    CV_UTF8_OK,          /* a whole character */
    CV_UTF8_INVALID,     /* an ill-formed maximal subpart */
    CV_UTF8_TRUNCATED,   /* a valid prefix that the buffer's end cut off */
} cv_utf8_status;

/* Classifies the bytes at s (len >= 1). *n receives the bytes consumed: the character's length (OK),
 * the maximal subpart's length (INVALID, >= 1) or len (TRUNCATED). *cp is set only for OK. */
cv_utf8_status cv_utf8_decode(const char *s, size_t len, uint32_t *cp, size_t *n);

/* True when s[0..len) is well-formed UTF-8; otherwise *bad_offset (if not NULL) is the offset of the
 * first byte that is not part of a whole character. */
bool cv_utf8_validate(const char *s, size_t len, size_t *bad_offset);

/* Writes the UTF-8 form of a scalar value (not a surrogate, <= U+10FFFF) and returns its length. */
size_t cv_utf8_encode(uint32_t cp, char out[4]);

/* Appends s[0..len) to the growing buffer *buf (*buf_len bytes used, *buf_cap allocated, kept
 * NUL-terminated, cv_xrealloc'd) with each ill-formed subpart replaced by U+FFFD. When at_end is
 * false a valid but unfinished sequence at the end is left alone; otherwise it too becomes U+FFFD.
 * Returns the number of input bytes consumed (len when at_end). */
size_t cv_utf8_lossy_append(const char *s, size_t len, bool at_end, char **buf, size_t *buf_len,
                            size_t *buf_cap);

/* Appends raw bytes to the same kind of growing, NUL-terminated buffer. */
void cv_buf_append(char **buf, size_t *buf_len, size_t *buf_cap, const char *s, size_t len);

/* Unicode's White_Space property (what Rust's and Oniguruma's \s match). */
bool cv_unicode_is_white_space(uint32_t cp);

#endif
