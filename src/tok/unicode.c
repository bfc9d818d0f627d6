/* unicode.c — category lookup, lenient UTF-8 and the GPT-2 byte map (see unicode.h). */
#include "tok/unicode.h"

#include <pthread.h>
#include <stdbool.h>

/* A flat class table for the BMP (64 KiB) answers nearly every lookup with one load;
 * code points above it use a binary search over the generated ranges. */
static uint8_t g_bmp_class[0x10000];
static uint32_t g_byte_cpt[256];
static int16_t g_cpt_byte[0x144]; /* every mapped code point is below U+0144 */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static bool is_white_space(uint32_t cp) {
    /* Unicode White_Space property (PropList.txt), 25 code points */
    if (cp >= 0x09 && cp <= 0x0D) return true;
    if (cp >= 0x2000 && cp <= 0x200A) return true;
    switch (cp) {
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
        return true;
    default:
        return false;
    }
}

static uint8_t class_search(uint32_t cp) {
    size_t lo = 0, hi = KILN_TOK_CAT_RANGES; /* find last start <= cp */
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (kiln_tok_cat_range_start[mid] <= cp)
            lo = mid;
        else
            hi = mid;
    }
    return kiln_tok_cat_range_class[lo];
}

static void init_tables(void) {
    for (uint32_t cp = 0; cp < 0x10000; cp++)
        g_bmp_class[cp] = (uint8_t)(class_search(cp) | (is_white_space(cp) ? KILN_TOK_WS : 0));
    /* GPT-2: printable Latin-1 bytes stand for themselves, the other 68 bytes map in
     * order to U+0100.. */
    bool direct[256] = {false};
    for (int b = 0x21; b <= 0x7E; b++) direct[b] = true;
    for (int b = 0xA1; b <= 0xAC; b++) direct[b] = true;
    for (int b = 0xAE; b <= 0xFF; b++) direct[b] = true;
    uint32_t next = 256;
    for (int b = 0; b < 256; b++) g_byte_cpt[b] = direct[b] ? (uint32_t)b : next++;
    for (int i = 0; i < 0x144; i++) g_cpt_byte[i] = -1;
    for (int b = 0; b < 256; b++) g_cpt_byte[g_byte_cpt[b]] = (int16_t)b;
}

static inline void ensure_init(void) {
    pthread_once(&g_once, init_tables);
}

uint8_t kiln_tok_cpt_class(uint32_t cp) {
    ensure_init();
    if (cp < 0x10000) return g_bmp_class[cp];
    if (cp > 0x10FFFF) return KILN_TOK_CAT_UNDEF;
    return class_search(cp); /* no white space above the BMP */
}

size_t kiln_tok_decode(const uint8_t *s, size_t n, uint32_t *cp) {
    uint8_t b = s[0];
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    size_t len;
    uint32_t c;
    if ((b & 0x40) == 0) goto bad; /* continuation byte as lead */
    if ((b & 0x20) == 0) {
        len = 2;
        c = b & 0x1F;
    } else if ((b & 0x10) == 0) {
        len = 3;
        c = b & 0x0F;
    } else if ((b & 0x08) == 0) {
        len = 4;
        c = b & 0x07;
    } else {
        goto bad;
    }
    if (len > n) goto bad;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) goto bad;
        c = (c << 6) | (s[i] & 0x3F);
    }
    *cp = c;
    return len;
bad:
    *cp = 0xFFFD;
    return 1;
}

int kiln_tok_encode(uint32_t cp, char out[4]) {
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
    if (cp <= 0x10FFFF) {
        out[0] = (char)(0xF0 | (cp >> 18));
        out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[3] = (char)(0x80 | (cp & 0x3F));
        return 4;
    }
    return 0;
}

uint32_t kiln_tok_byte_to_cpt(uint8_t b) {
    ensure_init();
    return g_byte_cpt[b];
}

int kiln_tok_cpt_to_byte(uint32_t cp) {
    ensure_init();
    return cp < 0x144 ? g_cpt_byte[cp] : -1;
}
