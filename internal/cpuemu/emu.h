// C interface of the CPU emulator (emu.cc), called from emu.go through cgo.
#ifndef PAGEDKV_CPUEMU_H
#define PAGEDKV_CPUEMU_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif
// cuemu_arity returns the argument count of kernel name, or -1 if unknown.
int cuemu_arity(const char* name);
// cuemu_launch runs kernel name; it returns 0, or -1 with a message in err.
int cuemu_launch(const char* name, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                 size_t smem, const uint64_t* args, int nargs, char* err, size_t errlen);
// cuemu_alloc returns n bytes aligned to 256, filled with 0xFF; 0 on failure.
uint64_t cuemu_alloc(size_t n);
void cuemu_free(uint64_t p);
void cuemu_htod(uint64_t dst, const void* src, size_t n);
void cuemu_dtoh(void* dst, uint64_t src, size_t n);
void cuemu_memset(uint64_t dst, int value, size_t n);
void cuemu_dtod(uint64_t dst, uint64_t src, size_t n);
// Testing switches (cuemu.h): cuemu_drop_sync makes the sync called at
// site ("file.cu:line") a no-op ("" restores every sync); cuemu_set_mma
// selects the mma twin's summation ("exact" or "tc"). Both return 0, or -1
// with a message in err.
int cuemu_drop_sync(const char* site, char* err, size_t errlen);
int cuemu_set_mma(const char* mode, char* err, size_t errlen);
#ifdef __cplusplus
}
#endif
#endif
