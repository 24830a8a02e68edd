/*
 * link_all.c: a program linked (not dlopen'ed) against libcufile.so that
 * refers to every function of cuFile 1.20's header, as a program built
 * against NVIDIA's would: if one is missing, it does not link, or the
 * loader refuses to start it. It then calls cuFileGetVersion through the
 * link and prints how many entry points it holds.
 */
#include <stdio.h>
#include "cufile.h"

#undef cuFileDriverClose
/* The legacy close, which the header's macro hides. */
CUfileError_t cuFileDriverClose(void);

#define ENTRY(name) { #name, (void (*)(void))name }

static const struct {
	const char *name;
	void (*fn)(void);
} entries[] = {
	ENTRY(cuFileBatchIOCancel),
	ENTRY(cuFileBatchIODestroy),
	ENTRY(cuFileBatchIOGetStatus),
	ENTRY(cuFileBatchIOSetUp),
	ENTRY(cuFileBatchIOSubmit),
	ENTRY(cuFileBufDeregister),
	ENTRY(cuFileBufRegister),
	ENTRY(cuFileDriverClose),
	ENTRY(cuFileDriverClose_v2),
	ENTRY(cuFileDriverGetP2PFlags),
	ENTRY(cuFileDriverGetProperties),
	ENTRY(cuFileDriverOpen),
	ENTRY(cuFileDriverSetMaxCacheSize),
	ENTRY(cuFileDriverSetMaxDirectIOSize),
	ENTRY(cuFileDriverSetMaxPinnedMemSize),
	ENTRY(cuFileDriverSetP2PFlags),
	ENTRY(cuFileDriverSetPollMode),
	ENTRY(cuFileExportPCIeTopology),
	ENTRY(cuFileGetBARSizeInKB),
	ENTRY(cuFileGetParameterBool),
	ENTRY(cuFileGetParameterGpuBounceBufferSlabArray),
	ENTRY(cuFileGetParameterMinMaxValue),
	ENTRY(cuFileGetParameterPosixPoolSlabArray),
	ENTRY(cuFileGetParameterSizeT),
	ENTRY(cuFileGetParameterString),
	ENTRY(cuFileGetStatsL1),
	ENTRY(cuFileGetStatsL2),
	ENTRY(cuFileGetStatsL3),
	ENTRY(cuFileGetStatsLevel),
	ENTRY(cuFileGetVersion),
	ENTRY(cuFileHandleDeregister),
	ENTRY(cuFileHandleRegister),
	ENTRY(cuFileRead),
	ENTRY(cuFileReadAsync),
	ENTRY(cuFileReadv),
	ENTRY(cuFileSetParameterBool),
	ENTRY(cuFileSetParameterGpuBounceBufferSlabArray),
	ENTRY(cuFileSetParameterPosixPoolSlabArray),
	ENTRY(cuFileSetParameterSizeT),
	ENTRY(cuFileSetParameterString),
	ENTRY(cuFileSetStatsLevel),
	ENTRY(cuFileStatsReset),
	ENTRY(cuFileStatsStart),
	ENTRY(cuFileStatsStop),
	ENTRY(cuFileStreamDeregister),
	ENTRY(cuFileStreamRegister),
	ENTRY(cuFileUseCount),
	ENTRY(cuFileWrite),
	ENTRY(cuFileWriteAsync),
	ENTRY(cuFileWritev),
};

int main(void)
{
	int version = 0;
	unsigned n = sizeof(entries) / sizeof(entries[0]);

	for (unsigned i = 0; i < n; i++)
		if (!entries[i].fn) {
			printf("missing %s\n", entries[i].name);
			return 1;
		}
	if (cuFileGetVersion(&version).err != CU_FILE_SUCCESS)
		return 1;
	printf("linked %u entry points, version %d\n", n, version);
	return 0;
}
