/*
 * utf8.h — UTF-8 validation, decoding and encoding (RFC 3629: no overlongs, no
 * surrogates, max U+10FFFF). Pure functions, no allocation.
 */
#ifndef KILN_BASE_UTF8_H
#define KILN_BASE_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KILN_UTF8_REPLACEMENT 0xFFFDu

/* Length of the sequence a lead byte announces (1..4), or 0 for an invalid lead byte. */
int kiln_utf8_seq_len(uint8_t lead);

/* Decodes one code point from s[0..n). Returns the bytes consumed (1..4) and stores the
 * code point; on an invalid or truncated sequence returns -(bytes of the maximal invalid
 * prefix, >= 1) and stores U+FFFD, so callers can skip and replace. n must be > 0. */
int kiln_utf8_decode(const uint8_t *s, size_t n, uint32_t *cp);

/* Writes cp as UTF-8 into out (room for 4 bytes); returns the length (1..4), or 0 when
 * cp is not a Unicode scalar value. */
int kiln_utf8_encode(uint32_t cp, char out[4]);

/* True when s[0..n) is 1 or more visible ASCII characters (0x21..0x7E), none of them in
 * reject (a C string; "" rejects none): the rule for API keys (the server's kiln.yaml, the
 * scheduler's tenants) and tenant ids. */
bool kiln_ascii_visible(const char *s, size_t n, const char *reject);

/* True when s[0..n) is valid UTF-8. *bad_offset (if not NULL) gets the first bad byte. */
bool kiln_utf8_valid(const void *s, size_t n, size_t *bad_offset);

/* Length of the longest prefix of s[0..n) that ends on a code point boundary and does
 * not end with an incomplete (but so far valid) sequence. Used by streaming output. */
size_t kiln_utf8_complete_prefix(const uint8_t *s, size_t n);

#endif /* KILN_BASE_UTF8_H */
