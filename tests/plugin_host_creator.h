// Included by a plugin's host check (tests/*_plugin_host.cpp) just before the plugin's source: the plugin registers
// its creator with libnvinfer's registry (REGISTER_TENSORRT_PLUGIN), which a host check does not link; here the
// macro instead defines host_creator() in the plugin's namespace, handing out one creator.
#pragma once
#include <NvInferRuntime.h>

#undef REGISTER_TENSORRT_PLUGIN
#define REGISTER_TENSORRT_PLUGIN(name)                                                                                \
    nvinfer1::IPluginCreator* host_creator() {                                                                        \
        static name creator;                                                                                          \
        return &creator;                                                                                              \
    }
