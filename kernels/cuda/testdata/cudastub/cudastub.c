/*
 * cudastub.c: a test-only stand-in for the CUDA driver library
 * (libcuda.so.1) with one device, so that the -tags cuda host path of
 * kernels/cuda (gorgonia.org/cu, the context, the launches) runs on a
 * machine with no GPU and its host overhead can be measured
 * (BenchmarkStepHost; scripts/cuda-stub.sh builds this file and runs it).
 *
 * Every entry point succeeds and does nothing, except that:
 *   - the device count is 1, the device is called "pagedkv stand-in" and
 *     has 132 SMs (an H100 SXM), every other attribute reads 1;
 *   - handles (contexts, modules, functions, streams, graphs) are distinct
 *     non-null values; device "allocations" are distinct 256-byte aligned
 *     addresses that are never dereferenced;
 *   - cuMemAllocHost returns real host memory (the host writes into it);
 *   - copies to the host leave the destination as it was (no device data).
 *
 * Entry points the Go code links but this file does not define are added
 * by scripts/cuda-stub.sh as functions returning CUDA_SUCCESS.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult; /* CUDA_SUCCESS == 0 */
typedef int CUdevice;

static uintptr_t next_handle = 0x1000;
static uintptr_t next_device = 0x700000000000ull;

static void *handle(void) { return (void *)__atomic_add_fetch(&next_handle, 16, __ATOMIC_RELAXED); }

CUresult cuInit(unsigned flags) { (void)flags; return 0; }
CUresult cuDriverGetVersion(int *v) { *v = 12000; return 0; }
CUresult cuDeviceGetCount(int *n) { *n = 1; return 0; }
CUresult cuDeviceGet(CUdevice *d, int ordinal) { *d = ordinal; return ordinal == 0 ? 0 : 101; /* CUDA_ERROR_INVALID_DEVICE */ }
CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
	(void)d;
	strncpy(name, "pagedkv stand-in", (size_t)len);
	if (len > 0) name[len - 1] = 0;
	return 0;
}
CUresult cuDeviceGetAttribute(int *v, int attrib, CUdevice d) {
	(void)d;
	*v = attrib == 16 /* CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT */ ? 132 : 1;
	return 0;
}
CUresult cuDevicePrimaryCtxRetain(void **ctx, CUdevice d) { (void)d; static void *primary; if (!primary) primary = handle(); *ctx = primary; return 0; }
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { (void)d; return 0; }
CUresult cuCtxCreate_v2(void **ctx, unsigned flags, CUdevice d) { (void)flags; (void)d; *ctx = handle(); return 0; }
CUresult cuCtxGetCurrent(void **ctx) { *ctx = 0; return 0; }
CUresult cuModuleLoadData(void **mod, const void *image) { (void)image; *mod = handle(); return 0; }
CUresult cuModuleGetFunction(void **fn, void *mod, const char *name) { (void)mod; (void)name; *fn = handle(); return 0; }
CUresult cuStreamCreate(void **s, unsigned flags) { (void)flags; *s = handle(); return 0; }
CUresult cuStreamBeginCapture_v2(void *s, int mode) { (void)s; (void)mode; return 0; }
CUresult cuStreamEndCapture(void *s, void **g) { (void)s; *g = handle(); return 0; }
CUresult cuGraphInstantiateWithFlags(void **exec, void *g, unsigned long long flags) { (void)g; (void)flags; *exec = handle(); return 0; }
CUresult cuMemAlloc_v2(uint64_t *p, size_t bytes) {
	*p = __atomic_fetch_add(&next_device, (bytes + 255) / 256 * 256 + 256, __ATOMIC_RELAXED);
	return 0;
}
CUresult cuMemAllocHost_v2(void **p, size_t bytes) { *p = calloc(1, bytes ? bytes : 1); return *p ? 0 : 2; /* OUT_OF_MEMORY */ }
CUresult cuMemFreeHost(void *p) { free(p); return 0; }
