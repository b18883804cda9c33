/*
 * utf8.c — see utf8.h. The decoder is a direct transcription of the well-formed sequence table:
 * the lead byte fixes the length and the allowed range of the second byte (which is where overlongs,
 * surrogates and values above U+10FFFF are excluded); later bytes are plain continuations. Validation
 * skips runs of ASCII eight bytes at a time because almost all text is mostly ASCII.
 */
#include "base/utf8.h"

#include <assert.h>
#include <string.h>

#include "base/error.h"

/* Length of the sequence a lead byte starts and the range its second byte must fall in. */
static bool lead_byte(uint8_t b, size_t *need, uint8_t *lo, uint8_t *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
        *need = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
        *need = 3;
        if (b == 0xE0) *lo = 0xA0;      /* no overlongs */
        if (b == 0xED) *hi = 0x9F;      /* no surrogates */
    } else if (b >= 0xF0 && b <= 0xF4) {
        *need = 4;
        if (b == 0xF0) *lo = 0x90;      /* no overlongs */
        if (b == 0xF4) *hi = 0x8F;      /* nothing above U+10FFFF */
    } else {
        return false;                   /* a continuation byte, C0/C1 or F5..FF */
    }
    return true;
}

cv_utf8_status cv_utf8_decode(const char *s, size_t len, uint32_t *cp, size_t *n) {
    assert(len >= 1);
    const uint8_t *u = (const uint8_t *)s;
    if (u[0] < 0x80) {
        *cp = u[0];
        *n = 1;
        return CV_UTF8_OK;
    }
    size_t need;
    uint8_t lo, hi;
    if (!lead_byte(u[0], &need, &lo, &hi)) {
        *n = 1;
        return CV_UTF8_INVALID;
    }
    uint32_t v = u[0] & (0x7F >> need);
    for (size_t i = 1; i < need; i++) {
        if (i >= len) {
            *n = len;
            return CV_UTF8_TRUNCATED;
        }
        uint8_t min = i == 1 ? lo : 0x80, max = i == 1 ? hi : 0xBF;
        if (u[i] < min || u[i] > max) {
            *n = i;
            return CV_UTF8_INVALID;
        }
        v = (v << 6) | (u[i] & 0x3F);
    }
    *cp = v;
    *n = need;
    return CV_UTF8_OK;
}

static bool all_ascii8(const char *s) {
    uint64_t w;
    memcpy(&w, s, 8);
    return (w & 0x8080808080808080ULL) == 0;
}

bool cv_utf8_validate(const char *s, size_t len, size_t *bad_offset) {
    size_t i = 0;
    while (i < len) {
        if (i + 8 <= len && all_ascii8(s + i)) {
            i += 8;
            continue;
        }
        uint32_t cp;
        size_t n;
        if (cv_utf8_decode(s + i, len - i, &cp, &n) != CV_UTF8_OK) {
            if (bad_offset) *bad_offset = i;
            return false;
        }
        i += n;
    }
    return true;
}

size_t cv_utf8_encode(uint32_t cp, char out[4]) {
    assert(cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF));
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

void cv_buf_append(char **buf, size_t *buf_len, size_t *buf_cap, const char *s, size_t len) {
    if (*buf_len + len + 1 > *buf_cap) {
        size_t cap = *buf_cap ? *buf_cap : 64;
        while (cap < *buf_len + len + 1) cap *= 2;
        *buf = cv_xrealloc(*buf, cap);
        *buf_cap = cap;
    }
    if (len) memcpy(*buf + *buf_len, s, len);
    *buf_len += len;
    (*buf)[*buf_len] = '\0';
}

size_t cv_utf8_lossy_append(const char *s, size_t len, bool at_end, char **buf, size_t *buf_len,
                            size_t *buf_cap) {
    static const char replacement[] = "\xEF\xBF\xBD";
    size_t i = 0, run = 0; /* s[run..i) is valid and not yet copied */
    while (i < len) {
        uint32_t cp;
        size_t n;
        cv_utf8_status st = cv_utf8_decode(s + i, len - i, &cp, &n);
        if (st == CV_UTF8_OK) {
            i += n;
            continue;
        }
        cv_buf_append(buf, buf_len, buf_cap, s + run, i - run);
        if (st == CV_UTF8_TRUNCATED && !at_end) return i;
        cv_buf_append(buf, buf_len, buf_cap, replacement, 3);
        i += n;
        run = i;
    }
    cv_buf_append(buf, buf_len, buf_cap, s + run, i - run);
    return len;
}

bool cv_unicode_is_white_space(uint32_t cp) {
    if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
    if (cp < 0x85) return false;
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}
