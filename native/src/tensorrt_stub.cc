// The TensorRT engine's entry points in a build without TensorRT (the CI machine): a clear refusal.
#include <cstring>

#include "engine.h"

extern "C" tf_engine* tf_engine_tensorrt(const char*, const int32_t*, int32_t, int32_t, int32_t, int32_t, int32_t,
                                         const char*, char* err, size_t err_len) {
  if (err && err_len) {
    std::strncpy(err, "this native library was built without TensorRT", err_len - 1);
    err[err_len - 1] = '\0';
  }
  return nullptr;
}

extern "C" int tf_has_tensorrt(void) { return 0; }
