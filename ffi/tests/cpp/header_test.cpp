// Compiled with g++ -std=c++17 against ffi/include/mesos_gpu.h and linked to libmesos_gpu.so by
// ffi/tests/c_lifecycle.rs: proves the generated header is usable from C++ (the language of the
// Mesos module shim) and matches the library: version, status names, a refused
// mgpu_isolator_new with its error text, the log callback, and free(NULL).
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "mesos_gpu.h"

static_assert(sizeof(MgpuStatus) == sizeof(int), "MgpuStatus is a C enum");
static_assert(MGPU_OK == 0 && MGPU_INVALID_STATE == 13, "status numbers are stable");
static_assert(std::is_same<decltype(&mgpu_prepare),
                           MgpuStatus (*)(const MgpuIsolator*, const uint8_t*, size_t, const uint8_t*,
                                          size_t, uint8_t*, size_t, size_t*, char*, size_t)>::value,
              "mgpu_prepare has the expected signature");

static int failures = 0;

static void check(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "FAIL: %s\n", what.c_str());
    ++failures;
  }
}

extern "C" void on_log(MgpuLogLevel, const char*, const char*, void* userdata) {
  ++*static_cast<int*>(userdata);
}

int main() {
  check(std::strlen(mgpu_version()) > 0, "version is empty");
  check(std::string(mgpu_status_name(MGPU_NOT_ENOUGH_GPUS)) == "MGPU_NOT_ENOUGH_GPUS", "status name");
  check(mgpu_status_name(99) == nullptr, "status 99 has a name");

  int lines = 0;
  char err[256] = "";
  check(mgpu_set_log_callback(on_log, &lines, MGPU_LOG_DEBUG, err, sizeof err) == MGPU_OK, err);

  // mesos.Parameters { parameter { key: "bogus" value: "1" } }, encoded by hand.
  const std::vector<uint8_t> params = {0x0a, 0x0a, 0x0a, 0x05, 'b', 'o', 'g', 'u', 's', 0x12, 0x01, '1'};
  MgpuIsolator* handle = nullptr;
  MgpuStatus s = mgpu_isolator_new(params.data(), params.size(), &handle, err, sizeof err);
  check(s == MGPU_BAD_ARGUMENT, std::string("new: ") + (mgpu_status_name(s) ? mgpu_status_name(s) : "?"));
  check(handle == nullptr, "handle written on failure");
  check(std::string(err).rfind("unknown module parameter \"bogus\": expected one of work_dir", 0) == 0,
        std::string("error text: ") + err);

  s = mgpu_isolator_new(params.data(), params.size(), nullptr, err, sizeof err);
  check(s == MGPU_NULL_ARGUMENT && std::string(err) == "argument `out_handle` is NULL", err);

  check(mgpu_set_log_callback(nullptr, nullptr, MGPU_LOG_INFO, err, sizeof err) == MGPU_OK, err);
  mgpu_isolator_free(nullptr);
  std::printf("header_test: %d failure(s), %d log line(s)\n", failures, lines);
  return failures == 0 ? 0 : 1;
}
