// The trampolines' table and its binding to libnvidia-ml. See doc.go.

#include <dlfcn.h>
#include <stddef.h>

#include "zz_generated_symbols.h"

// NVML_ERROR_FUNCTION_NOT_FOUND: what every NVML function returns until the
// table is bound, and afterwards where the library lacks the function.
static int kubegpu_nvml_missing(void) { return 13; }

// nvmlErrorString is the one NVML function that returns a pointer.
static const char *kubegpu_nvml_missing_string(int result) {
	(void)result;
	return "NVML function not found (libnvidia-ml is not loaded)";
}

// kubegpu_nvml_fn holds one function pointer per trampoline, in the order of
// kubegpu_nvml_names. It has default visibility: when two copies of this
// package are loaded into one process (a host that links it and a plugin
// that does too), the dynamic linker resolves every reference, trampolines
// and binder included, to the first copy, so they always agree.
void *kubegpu_nvml_fn[KUBEGPU_NVML_NSYMS] = {
	[0 ... KUBEGPU_NVML_NSYMS - 1] = (void *)kubegpu_nvml_missing,
	[KUBEGPU_NVML_ERRORSTRING] = (void *)kubegpu_nvml_missing_string,
};

static void *kubegpu_nvml_handle;

// kubegpu_nvml_bind opens the library at path and points every slot at its
// function of that name. It returns NULL, or dlerror's message. *bound is
// set to the number of functions the library has.
const char *kubegpu_nvml_bind(const char *path, int *bound) {
	void *h = dlopen(path, RTLD_LAZY | RTLD_LOCAL);
	if (h == NULL) {
		return dlerror();
	}
	int n = 0;
	for (int i = 0; i < KUBEGPU_NVML_NSYMS; i++) {
		void *f = dlsym(h, kubegpu_nvml_names[i]);
		if (f != NULL) {
			kubegpu_nvml_fn[i] = f;
			n++;
		}
	}
	kubegpu_nvml_handle = h;
	*bound = n;
	return NULL;
}

// kubegpu_nvml_has reports whether the bound library exports name.
int kubegpu_nvml_has(const char *name) {
	return kubegpu_nvml_handle != NULL && dlsym(kubegpu_nvml_handle, name) != NULL;
}
