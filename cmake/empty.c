/* empty.c — the shared libkiln has no sources of its own: it is the whole static
 * archive (every object of libkiln.a) linked into one .so (CMakeLists.txt). */
typedef int kiln_empty_translation_unit;
