// The calling thread's last error message (errno style). A Go function
// exported to C runs on the calling C thread, so writing this thread-local
// buffer from Go reaches exactly the thread that made the failed call.

#include <string.h>

#define PAGEDKV_NO_PROTOTYPES
#include "pagedkv.h"

enum { ERRBUF_SIZE = 1024 };

static __thread char errbuf[ERRBUF_SIZE];

const char *pagedkv_last_error(void) { return errbuf; }

int32_t pagedkv_abi_version(void) { return PAGEDKV_ABI_VERSION; }

// pagedkv_set_error copies n bytes of msg (truncated to fit, NUL-terminated).
void pagedkv_set_error(const char *msg, size_t n) {
	if (n >= ERRBUF_SIZE) {
		n = ERRBUF_SIZE - 1;
	}
	memcpy(errbuf, msg, n);
	errbuf[n] = 0;
}
