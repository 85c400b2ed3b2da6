/* Force-included into every llama.cpp source file when Candlewick builds llama-cpp-python
 * (Makefile: CFLAGS/CXXFLAGS "-include <this file>").
 *
 * GCC before 13 declares the memory operand of _tile_loadconfig as an 8-byte object, so the
 * optimiser drops the stores that fill the rest of the 64-byte AMX tile configuration, and
 * ldtilecfg faults on garbage (SIGSEGV in ggml_backend_amx_mul_mat on the first multi-token
 * batch of a native build on an AMX CPU). This replacement names all 64 bytes as read.
 *
 * The exported marker lets the engine know this build's AMX kernels are safe to use. */
#if defined(__AMX_TILE__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#include <immintrin.h>

struct candlewick_tilecfg_bytes { unsigned char b[64]; };

static inline void candlewick_tile_loadconfig(const void *cfg) {
    __asm__ volatile("ldtilecfg %0" : : "m"(*(const struct candlewick_tilecfg_bytes *)cfg));
}
#undef _tile_loadconfig
#define _tile_loadconfig(cfg) candlewick_tile_loadconfig(cfg)
#define CANDLEWICK_AMX_MARKER 1
#elif defined(__AMX_TILE__)
#define CANDLEWICK_AMX_MARKER 1
#endif

#ifdef CANDLEWICK_AMX_MARKER
#ifdef __cplusplus
extern "C"
#endif
__attribute__((weak, used, visibility("default"))) const int candlewick_amx_tilecfg_fixed = 1;
#endif
