#include "base/utf8.h"

#include <string.h>

int kiln_utf8_seq_len(uint8_t b) {
    if (b < 0x80) return 1;
    if (b >= 0xC2 && b <= 0xDF) return 2;
    if (b >= 0xE0 && b <= 0xEF) return 3;
    if (b >= 0xF0 && b <= 0xF4) return 4;
    return 0;
}

/* Allowed range of the second byte, per lead byte (Unicode table 3-7). */
static void second_range(uint8_t lead, uint8_t *lo, uint8_t *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (lead == 0xE0)
        *lo = 0xA0;
    else if (lead == 0xED)
        *hi = 0x9F;
    else if (lead == 0xF0)
        *lo = 0x90;
    else if (lead == 0xF4)
        *hi = 0x8F;
}

int kiln_utf8_decode(const uint8_t *s, size_t n, uint32_t *cp) {
    uint8_t b = s[0];
    int len = kiln_utf8_seq_len(b);
    if (len == 1) {
        *cp = b;
        return 1;
    }
    *cp = KILN_UTF8_REPLACEMENT;
    if (len == 0) return -1;
    uint8_t lo, hi;
    second_range(b, &lo, &hi);
    if (n < 2 || s[1] < lo || s[1] > hi) return -1;
    for (int i = 2; i < len; i++)
        if ((size_t)i >= n || (s[i] & 0xC0) != 0x80) return -i;
    uint32_t c = b & (0x7F >> len);
    for (int i = 1; i < len; i++) c = (c << 6) | (s[i] & 0x3F);
    *cp = c;
    return len;
}

int kiln_utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp >= 0xD800 && cp <= 0xDFFF) return 0;
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    if (cp <= 0x10FFFF) {
        out[0] = (char)(0xF0 | (cp >> 18));
        out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[3] = (char)(0x80 | (cp & 0x3F));
        return 4;
    }
    return 0;
}

bool kiln_utf8_valid(const void *p, size_t n, size_t *bad_offset) {
    const uint8_t *s = p;
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int r = kiln_utf8_decode(s + i, n - i, &cp);
        if (r < 0) {
            if (bad_offset) *bad_offset = i;
            return false;
        }
        i += (size_t)r;
    }
    return true;
}

size_t kiln_utf8_complete_prefix(const uint8_t *s, size_t n) {
    /* look back at most 3 bytes for a lead byte whose sequence is not finished */
    size_t back = n < 3 ? n : 3;
    for (size_t k = 1; k <= back; k++) {
        uint8_t b = s[n - k];
        if ((b & 0xC0) == 0x80) continue; /* continuation byte: keep looking */
        int len = kiln_utf8_seq_len(b);
        if (len > (int)k) {
            /* incomplete: hold it back only if what we have so far is a valid prefix */
            uint32_t cp;
            int r = kiln_utf8_decode(s + n - k, k, &cp);
            if (r == -(int)k || (k == 1 && r == -1)) return n - k;
        }
        return n;
    }
    return n;
}

bool kiln_ascii_visible(const char *s, size_t n, const char *reject) {
    if (!s || n == 0) return false;
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)s[i];
        if (c < 0x21 || c > 0x7e || strchr(reject, c)) return false;
    }
    return true;
}
