/*
 * unicode.h — the Unicode facts kiln's tokenizers need, defined the way llama.cpp
 * defines them (its token ids are the oracle):
 *  - a general-category class per code point (Unicode 15.1, generated table in
 *    unicode_data.c by scripts/gen-tok-unicode.py) plus the White_Space property;
 *  - llama.cpp's lenient UTF-8 decoding (only continuation bits are checked, so
 *    overlong forms and surrogates decode; a bad lead or truncated sequence yields
 *    U+FFFD and consumes one byte);
 *  - the GPT-2 byte <-> code point map used by byte-level BPE vocabularies.
 * All functions are pure; the lookup tables are built once (thread-safe) on first use.
 */
#ifndef KILN_TOK_UNICODE_H
#define KILN_TOK_UNICODE_H

#include <stddef.h>
#include <stdint.h>

/* General-category classes (regex \p{N}, \p{L}, ...). */
enum {
    KILN_TOK_CAT_UNDEF = 0, /* Cn: unassigned */
    KILN_TOK_CAT_NUMBER = 1,
    KILN_TOK_CAT_LETTER = 2,
    KILN_TOK_CAT_SEPARATOR = 3,
    KILN_TOK_CAT_MARK = 4,
    KILN_TOK_CAT_PUNCT = 5,
    KILN_TOK_CAT_SYMBOL = 6,
    KILN_TOK_CAT_CONTROL = 7, /* Cc Cf Co Cs */
    KILN_TOK_CAT_MASK = 7,
    KILN_TOK_WS = 8 /* flag: White_Space property */
};

#define KILN_TOK_CAT_RANGES 2272
extern const uint32_t kiln_tok_cat_range_start[KILN_TOK_CAT_RANGES];
extern const uint8_t kiln_tok_cat_range_class[KILN_TOK_CAT_RANGES];

/* Class of cp (one of KILN_TOK_CAT_*) OR'ed with KILN_TOK_WS for white space. Code
 * points above U+10FFFF are KILN_TOK_CAT_UNDEF. */
uint8_t kiln_tok_cpt_class(uint32_t cp);

/* Length a lead byte announces, llama.cpp style: 1 for ASCII and for continuation
 * bytes (0x80-0xBF), 2 for 0xC0-0xDF, 3 for 0xE0-0xEF, 4 for 0xF0-0xFF. */
static inline size_t kiln_tok_utf8_len(uint8_t lead) {
    static const uint8_t lut[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lut[lead >> 4];
}

/* Lenient decode of one code point from s[0..n) (n > 0); returns the bytes consumed.
 * Invalid input gives U+FFFD and consumes 1 byte. */
size_t kiln_tok_decode(const uint8_t *s, size_t n, uint32_t *cp);

/* Encodes cp (any value up to 0x10FFFF, surrogates included, as llama.cpp does) into
 * out; returns 1..4, or 0 for cp > 0x10FFFF. */
int kiln_tok_encode(uint32_t cp, char out[4]);

/* GPT-2 byte map: the code point that stands for byte b in byte-level BPE token text,
 * and the inverse (-1 when cp stands for no byte). */
uint32_t kiln_tok_byte_to_cpt(uint8_t b);
int kiln_tok_cpt_to_byte(uint32_t cp);

#endif /* KILN_TOK_UNICODE_H */
