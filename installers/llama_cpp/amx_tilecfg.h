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

/* ggml's f16 vectors under AVX512-FP16 (ggml-cpu/simd-mappings.h) work in steps of 128 halves
 * and do the rest one element at a time (vec.cpp). Flash attention runs its per-cell K·Q dot
 * product and V accumulation over one head's width, so heads narrower than 128 (SmolLM2's 64)
 * went all scalar: decoding at 2,000 cached tokens took 2.3x as long with flash attention as
 * without. Without the macro ggml takes its AVX-512 F16C path (steps of 64, f32 arithmetic),
 * which covers those heads whole. The macro is dropped after <immintrin.h>, whose
 * target pragmas would otherwise define it again. The marker tells such a build apart
 * (`nm -D libggml-cpu.so`). */
#if defined(__AVX512FP16__)
#include <immintrin.h>
#undef __AVX512FP16__
#ifdef __cplusplus
extern "C"
#endif
__attribute__((weak, used, visibility("default"))) const int candlewick_f16_avx512f_steps = 1;
#endif
