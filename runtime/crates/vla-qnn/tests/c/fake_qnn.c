/* A stand-in for libQnnHtp.so + libQnnSystem.so that records the calls vla-qnn makes.
 *
 * It exports both providers' entry points with the function-table layout of the QNN
 * 2.x interface (slot order as in docs/qnn-abi.md), reports two HTP devices (NSPs 0
 * and 1, one core each; a third entry has a struct version vla-qnn does not know) from
 * deviceGetPlatformInfo, accepts a device config of option PLATFORM_INFO naming one of
 * them (14001 for any other id), and hands out handles that name what they are: 0x100
 * the default device, 0x200+id a device on NSP id, 0x1000+n the n-th context. Its
 * performance infrastructure gives a power-config id per device (0x50 + id) and records
 * each vote; a context's spill-fill group config is recorded with its creation. Every
 * call is appended to a log that `fake_qnn_calls` returns.
 * The structs below are written from QnnDevice.h / QnnHtpDevice.h, so the C compiler's
 * layout of them checks the offsets this file uses; vla-qnn's own offsets are checked
 * by what vla-qnn reads back from this file's data (and against the real library in
 * tests/nsp_devices.rs).
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef uint64_t err_t;
typedef void *handle_t;
typedef void (*fn_t)(void);

/* QnnDevice.h */
typedef struct { uint32_t coreId; uint32_t coreType; void *coreInfoExtension; } CoreInfoV1;
typedef struct { uint32_t version; union { CoreInfoV1 v1; }; } CoreInfo;
typedef struct {
  uint32_t deviceId; uint32_t deviceType; uint32_t numCores; CoreInfo *cores;
  void *deviceInfoExtension;
} HwDeviceInfoV1;
typedef struct { uint32_t version; union { HwDeviceInfoV1 v1; }; } HwDeviceInfo;
typedef struct { uint32_t numHwDevices; HwDeviceInfo *hwDevices; } PlatformInfoV1;
typedef struct { uint32_t version; union { PlatformInfoV1 v1; }; } PlatformInfo;
typedef struct { uint32_t option; union { void *customConfig; PlatformInfo *hardwareInfo; }; } DeviceConfig;
/* QnnHtpDevice.h */
typedef struct {
  size_t vtcmSize; uint32_t socModel; bool signedPdSupport; bool dlbcSupport; uint32_t arch;
} OnChipExt;
typedef struct { uint32_t devType; union { OnChipExt onChipDevice; }; } HtpDeviceExt;

_Static_assert(offsetof(PlatformInfo, v1.numHwDevices) == 8, "numHwDevices");
_Static_assert(offsetof(PlatformInfo, v1.hwDevices) == 16, "hwDevices");
_Static_assert(sizeof(HwDeviceInfo) == 40, "device stride");
_Static_assert(offsetof(HwDeviceInfo, v1.deviceId) == 8, "deviceId");
_Static_assert(offsetof(HwDeviceInfo, v1.numCores) == 16, "numCores");
_Static_assert(offsetof(HwDeviceInfo, v1.cores) == 24, "cores");
_Static_assert(offsetof(HwDeviceInfo, v1.deviceInfoExtension) == 32, "extension");
_Static_assert(sizeof(CoreInfo) == 24, "core stride");
_Static_assert(offsetof(CoreInfo, v1.coreId) == 8, "coreId");
_Static_assert(offsetof(HtpDeviceExt, onChipDevice.vtcmSize) == 8, "vtcmSize");
_Static_assert(offsetof(HtpDeviceExt, onChipDevice.socModel) == 16, "socModel");
_Static_assert(offsetof(HtpDeviceExt, onChipDevice.arch) == 24, "arch");
_Static_assert(sizeof(DeviceConfig) == 16, "device config");

static char calls[8192];
static int contexts;

static void record(const char *fmt, ...) {
  size_t used = strlen(calls);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(calls + used, sizeof calls - used, fmt, ap);
  va_end(ap);
  used = strlen(calls);
  if (used + 1 < sizeof calls) { calls[used] = '\n'; calls[used + 1] = 0; }
}

const char *fake_qnn_calls(void) { return calls; }
void fake_qnn_reset(void) { calls[0] = 0; contexts = 0; }

static err_t log_create(void *cb, uint32_t level, handle_t *log) {
  (void)cb; (void)level; *log = (handle_t)0x10; record("logCreate"); return 0;
}
static err_t log_free(handle_t log) { record("logFree %p", log); return 0; }
static err_t backend_create(handle_t log, const void **cfg, handle_t *b) {
  (void)log; (void)cfg; *b = (handle_t)0x20; record("backendCreate"); return 0;
}
static err_t backend_free(handle_t b) { record("backendFree %p", b); return 0; }
static err_t build_id(const char **id) { *id = "v2.51.0.fake"; return 0; }
static err_t error_message(err_t e, const char **m) { (void)e; *m = "fake"; return 0; }

static OnChipExt unused_ext;
static HtpDeviceExt exts[2] = {
  {0, {.onChipDevice = {8, 77, true, true, 73}}},
  {0, {.onChipDevice = {8, 77, true, true, 73}}},
};
static CoreInfo cores[2] = {{1, {.v1 = {0, 0, NULL}}}, {1, {.v1 = {0, 0, NULL}}}};
/* A third entry of a struct version vla-qnn does not know: it must be skipped, not read. */
static HwDeviceInfo devices[3] = {
  {1, {.v1 = {0, 0, 1, &cores[0], &exts[0]}}},
  {1, {.v1 = {1, 0, 1, &cores[1], &exts[1]}}},
  {2, {.v1 = {2, 0, 1, &cores[1], &exts[1]}}},
};
static PlatformInfo platform = {1, {.v1 = {3, devices}}};

static err_t get_platform_info(handle_t log, const PlatformInfo **out) {
  (void)log; (void)unused_ext; *out = &platform; record("deviceGetPlatformInfo"); return 0;
}
static err_t free_platform_info(handle_t log, const PlatformInfo *p) {
  (void)log; record("deviceFreePlatformInfo %s", p == &platform ? "ours" : "other"); return 0;
}
static err_t device_create(handle_t log, const DeviceConfig **cfg, handle_t *out) {
  (void)log;
  if (cfg == NULL || cfg[0] == NULL) {
    *out = (handle_t)0x100; record("deviceCreate default"); return 0;
  }
  const DeviceConfig *c = cfg[0];
  if (c->option != 1 || cfg[1] != NULL || c->hardwareInfo->version != 1 ||
      c->hardwareInfo->v1.numHwDevices != 1) {
    record("deviceCreate refused: option %u", c->option); return 14001;
  }
  const HwDeviceInfo *d = &c->hardwareInfo->v1.hwDevices[0];
  uint32_t id = d->v1.deviceId;
  if (d->version != 1 || id > 1) { record("deviceCreate refused: nsp %u", id); return 14001; }
  const HtpDeviceExt *e = d->v1.deviceInfoExtension;
  record("deviceCreate nsp %u cores %u core0 %u ext soc %u arch %u vtcm %zu", id, d->v1.numCores,
         d->v1.numCores ? d->v1.cores[0].v1.coreId : 99u, e ? e->onChipDevice.socModel : 0u,
         e ? e->onChipDevice.arch : 0u, e ? e->onChipDevice.vtcmSize : (size_t)0);
  *out = (handle_t)(uintptr_t)(0x200 + id);
  return 0;
}
static err_t device_free(handle_t d) { record("deviceFree %p", d); return 0; }
/* QnnContext.h's config (CUSTOM = 0) and QnnHtpContext.h's spill-fill group (option 2). */
typedef struct { uint32_t option; union { const void *customConfig; uint64_t rest[4]; }; } ContextConfig;
typedef struct { uint32_t option; handle_t firstGroupHandle; uint64_t maxSpillFillBuffer; } GroupConfig;
_Static_assert(offsetof(ContextConfig, customConfig) == 8, "custom config");
_Static_assert(offsetof(GroupConfig, firstGroupHandle) == 8, "first group handle");
_Static_assert(offsetof(GroupConfig, maxSpillFillBuffer) == 16, "max spill-fill");

static err_t context_create(handle_t b, handle_t device, const ContextConfig **cfg,
                            const void *buf, uint64_t size, handle_t *out, handle_t profile) {
  (void)b; (void)buf; (void)size; (void)profile;
  char group[96] = "";
  for (int i = 0; cfg != NULL && cfg[i] != NULL; i++) {
    const GroupConfig *g = cfg[i]->customConfig;
    if (cfg[i]->option == 0 && g != NULL && g->option == 2)
      snprintf(group, sizeof group, " group first 0x%llx max %llu",
               (unsigned long long)(uintptr_t)g->firstGroupHandle,
               (unsigned long long)g->maxSpillFillBuffer);
  }
  contexts++;
  *out = (handle_t)(uintptr_t)(0x1000 + contexts);
  record("contextCreateFromBinary on %p%s -> %p", device, group, *out);
  return 0;
}
static err_t context_free(handle_t c, handle_t profile) {
  (void)profile; record("contextFree %p", c); return 0;
}
static err_t not_supported(void) { return 1000; }

/* QnnHtpPerfInfrastructure.h: a voter per (device, core), id 0x50 + device; a vote is
 * recorded with its id, the id its DCVS_V3 payload names and its core target corner. */
typedef struct { uint32_t option; uint32_t payload[16]; } PowerConfig;
_Static_assert(sizeof(PowerConfig) == 68, "power config");
typedef struct {
  uint32_t infraType;
  err_t (*createPowerConfigId)(uint32_t, uint32_t, uint32_t *);
  err_t (*destroyPowerConfigId)(uint32_t);
  err_t (*setPowerConfig)(uint32_t, const PowerConfig **);
  fn_t setMemoryConfig;
} PerfInfrastructure;
_Static_assert(offsetof(PerfInfrastructure, createPowerConfigId) == 8, "create");
_Static_assert(offsetof(PerfInfrastructure, destroyPowerConfigId) == 16, "destroy");
_Static_assert(offsetof(PerfInfrastructure, setPowerConfig) == 24, "set");

static err_t create_power_config_id(uint32_t device, uint32_t core, uint32_t *id) {
  if (device > 1 || core != 0) {
    record("createPowerConfigId refused: device %u core %u", device, core); return 13001;
  }
  *id = 0x50 + device;
  record("createPowerConfigId device %u core %u -> 0x%x", device, core, *id);
  return 0;
}
static err_t destroy_power_config_id(uint32_t id) {
  record("destroyPowerConfigId 0x%x", id); return 0;
}
static err_t set_power_config(uint32_t id, const PowerConfig **list) {
  if (list == NULL || list[0] == NULL || list[0]->option != 1) {
    record("setPowerConfig refused: 0x%x", id); return 13001;
  }
  int n = 0;
  while (list[n] != NULL) n++;
  record("setPowerConfig 0x%x dcvs for 0x%x core target 0x%x, %d configs", id,
         list[0]->payload[0], list[0]->payload[14], n);
  return 0;
}
static PerfInfrastructure perf = {0, create_power_config_id, destroy_power_config_id,
                                  set_power_config, NULL};
static err_t get_infrastructure(const PerfInfrastructure **out) {
  *out = &perf; return 0;
}

typedef struct {
  uint32_t backendId; const char *name; uint32_t core[3]; uint32_t backend[3]; fn_t fns[71];
} Interface;
_Static_assert(offsetof(Interface, fns) == 40, "table offset");

static Interface iface = {6, "FAKE_HTP", {2, 40, 0}, {5, 51, 0}, {0}};
static const Interface *iface_list[1] = {&iface};

err_t QnnInterface_getProviders(const Interface ***list, uint32_t *n) {
  for (int i = 0; i < 71; i++) iface.fns[i] = (fn_t)not_supported;
  iface.fns[1] = (fn_t)backend_create;
  iface.fns[4] = (fn_t)build_id;
  iface.fns[8] = (fn_t)backend_free;
  iface.fns[13] = (fn_t)context_create;
  iface.fns[14] = (fn_t)context_free;
  iface.fns[25] = (fn_t)log_create;
  iface.fns[27] = (fn_t)log_free;
  iface.fns[37] = (fn_t)get_platform_info;
  iface.fns[38] = (fn_t)free_platform_info;
  iface.fns[39] = (fn_t)get_infrastructure;
  iface.fns[40] = (fn_t)device_create;
  iface.fns[43] = (fn_t)device_free;
  iface.fns[48] = (fn_t)error_message;
  *list = iface_list;
  *n = 1;
  return 0;
}

/* libQnnSystem: one graph named "g", no tensors, for any buffer. A buffer that begins
 * with "spill-fill N" gets a v3 graph info whose HTP blob info reports N bytes. */
static unsigned char graph_info[88];
static unsigned char binary_info[256];
typedef struct { uint32_t version; uint64_t spillFillBufferSize; } GraphBlobInfo;
_Static_assert(offsetof(GraphBlobInfo, spillFillBufferSize) == 8, "spill-fill");
static GraphBlobInfo blob_info;

static err_t sys_create(handle_t *h) { *h = (handle_t)0x30; return 0; }
static err_t sys_info(handle_t h, void *buf, uint64_t size, const void **info, uint64_t *n) {
  (void)h;
  uint32_t v3 = 3, v1 = 1, one = 1, soc = 77, api[3] = {2, 40, 0};
  const char *name = "g";
  memset(binary_info, 0, sizeof binary_info);
  memset(graph_info, 0, sizeof graph_info);
  memcpy(graph_info, &v1, 4);
  memcpy(graph_info + 8, &name, sizeof name);
  char text[32] = "";
  memcpy(text, buf, size < sizeof text - 1 ? size : sizeof text - 1);
  if (strncmp(text, "spill-fill ", 11) == 0) {
    uint32_t blob_size = sizeof blob_info;
    const void *blob = &blob_info;
    blob_info.version = 1;
    blob_info.spillFillBufferSize = strtoull(text + 11, NULL, 10);
    memcpy(graph_info, &v3, 4);
    memcpy(graph_info + 64, &blob_size, 4);
    memcpy(graph_info + 72, &blob, sizeof blob);
  }
  memcpy(binary_info, &v3, 4);
  memcpy(binary_info + 24, api, sizeof api);
  memcpy(binary_info + 96, &one, 4);
  void *g = graph_info;
  memcpy(binary_info + 104, &g, sizeof g);
  memcpy(binary_info + 136, &soc, 4);
  *info = binary_info;
  *n = 140;
  return 0;
}
static err_t sys_free(handle_t h) { (void)h; return 0; }

typedef struct { uint32_t backendId; const char *name; uint32_t api[3]; fn_t fns[4]; } SysInterface;
_Static_assert(offsetof(SysInterface, fns) == 32, "system table offset");
static SysInterface sys = {6, "FAKE_SYSTEM", {1, 15, 0},
                           {(fn_t)sys_create, (fn_t)sys_info, NULL, (fn_t)sys_free}};
static const SysInterface *sys_list[1] = {&sys};

err_t QnnSystemInterface_getProviders(const SysInterface ***list, uint32_t *n) {
  *list = sys_list;
  *n = 1;
  return 0;
}
