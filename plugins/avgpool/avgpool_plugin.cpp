// TensorRT plugin TrtfuseAvgPool, version 3 (IPluginV2DynamicExt): the global average pool of an int8 kCHW32 tensor
// into two int8 outputs, hi and lo, [N, C, H, W] -> 2 x [N, C, 1, 1], that carry the mean to 1/256 of the input's LSB
// (m = the nearest integer to 256 sum / hw, ties to even; hi = floor((m + 128) / 256), lo = m - 256 hi: avgpool.h).
// The ONNX rewrite emits it for DequantizeLinear(s) + GlobalAveragePool as TrtfuseAvgPool -> DequantizeLinear(hi, s) +
// DequantizeLinear(lo, s / 256) -> Add (src/trtfuse/passes/residual_conv_rewrite.py: find_pool_heads; why int8 out, why two:
// avgpool.h). A thin layer over trtfuse_avgpool_int8_forward: it checks types and shapes and calls the C ABI. No
// fields: the scales are the DequantizeLinears' after it. Versions 1 (field x_scale, fp32 out) and 2 (one int8 output
// on the input's scale) are gone: their ONNX files and engines name their version and find no creator (a version 2
// engine's blob, were it handed to this creator, is refused by its tag), rather than meet other outputs than they
// expect.
#include <NvInfer.h>
#include <NvInferRuntime.h>

#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>

#include "avgpool/avgpool.h"
#include "common/serialize.h"

namespace trtfuse {
namespace avgpool {
namespace {

using nvinfer1::DataType;
using nvinfer1::DimsExprs;
using nvinfer1::DynamicPluginTensorDesc;
using nvinfer1::IExprBuilder;
using nvinfer1::IPluginV2DynamicExt;
using nvinfer1::PluginFieldCollection;
using nvinfer1::PluginTensorDesc;
using nvinfer1::TensorFormat;

char const* const kName = "TrtfuseAvgPool";
char const* const kVersion = "3";
uint32_t const kMagic = 0x33564154u;      // "TAV3": refuse blobs that are not ours
uint32_t const kMagicV2 = 0x32564154u;    // "TAV2": version 2's (one int8 output), refused by name
uint32_t const kMagicV1 = 0x50564154u;    // "TAVP": version 1's (fp32 out), refused by name

// Refusals go to stderr with the reason: TensorRT 8.5 gives plugins no logger of their own.
void refuse(std::string const& why) { std::fprintf(stderr, "trtfuse: %s refused: %s\n", kName, why.c_str()); }

class AvgPoolPlugin final : public IPluginV2DynamicExt {
public:
    AvgPoolPlugin() = default;
    // The plugin has no fields: every copy (clone, the creator's create and deserialize) is a fresh one in namespace ns
    static AvgPoolPlugin* in_namespace(char const* ns) {
        auto* p = new AvgPoolPlugin();
        p->setPluginNamespace(ns);
        return p;
    }

    char const* getPluginType() const noexcept override { return kName; }
    char const* getPluginVersion() const noexcept override { return kVersion; }
    void setPluginNamespace(char const* ns) noexcept override { namespace_ = ns ? ns : ""; }
    char const* getPluginNamespace() const noexcept override { return namespace_.c_str(); }
    IPluginV2DynamicExt* clone() const noexcept override {
        try {
            return AvgPoolPlugin::in_namespace(namespace_.c_str());
        } catch (std::exception const&) {
            return nullptr;
        }
    }
    void destroy() noexcept override { delete this; }
    int32_t initialize() noexcept override { return 0; }
    void terminate() noexcept override {}
    size_t getSerializationSize() const noexcept override { return sizeof(kMagic); }
    void serialize(void* buffer) const noexcept override {
        Writer w(buffer);
        w.put(kMagic);
    }

    int32_t getNbOutputs() const noexcept override { return 2; }   // hi, lo
    DimsExprs getOutputDimensions(int32_t, DimsExprs const* inputs, int32_t, IExprBuilder& builder) noexcept override {
        DimsExprs out = inputs[0];
        for (int i = 2; i < out.nbDims; ++i) out.d[i] = builder.constant(1);
        return out;
    }
    DataType getOutputDataType(int32_t, DataType const*, int32_t) const noexcept override { return DataType::kINT8; }

    // in: INT8 kCHW32 [N, C, H, W]; out 0 (hi, on the input's scale s) and 1 (lo, on s / 256): INT8 kLINEAR
    // [N, C, 1, 1] (int8 [N][C])
    bool supportsFormatCombination(int32_t pos, PluginTensorDesc const* inOut, int32_t nbInputs,
                                   int32_t nbOutputs) noexcept override {
        if (nbInputs != 1 || nbOutputs != 2) {
            refuse("expected one input (int8 [N, C, H, W]) and two outputs (hi, lo), got " +
                   std::to_string(nbInputs) + " and " + std::to_string(nbOutputs));
            return false;
        }
        PluginTensorDesc const& d = inOut[pos];
        if (pos == 0) return d.type == DataType::kINT8 && d.format == TensorFormat::kCHW32 && d.dims.nbDims == 4;
        return d.type == DataType::kINT8 && d.format == TensorFormat::kLINEAR;
    }
    void configurePlugin(DynamicPluginTensorDesc const*, int32_t, DynamicPluginTensorDesc const*,
                         int32_t) noexcept override {}
    size_t getWorkspaceSize(PluginTensorDesc const*, int32_t, PluginTensorDesc const*, int32_t) const noexcept override {
        return 0;
    }

    int32_t enqueue(PluginTensorDesc const* in, PluginTensorDesc const*, void const* const* inputs,
                    void* const* outputs, void*, cudaStream_t stream) noexcept override {
        nvinfer1::Dims const& d = in[0].dims;
        int64_t const hw = static_cast<int64_t>(d.d[2]) * d.d[3];
        int const st = hw > (1 << 16)
                           ? TRTFUSE_AVGPOOL_ERR_SHAPE
                           : trtfuse_avgpool_int8_forward(inputs[0], static_cast<int8_t*>(outputs[0]),
                                                          static_cast<int8_t*>(outputs[1]), d.d[0], d.d[1],
                                                          static_cast<int>(hw), stream);
        if (st != 0) refuse(std::string("enqueue failed: ") + trtfuse_avgpool_error_string(st));
        return st;
    }

private:
    std::string namespace_;
};

}  // namespace

class TrtfuseAvgPoolCreator final : public nvinfer1::IPluginCreator {
public:
    TrtfuseAvgPoolCreator() {   // no fields
        collection_.nbFields = 0;
        collection_.fields = nullptr;
    }
    char const* getPluginName() const noexcept override { return kName; }
    char const* getPluginVersion() const noexcept override { return kVersion; }
    PluginFieldCollection const* getFieldNames() noexcept override { return &collection_; }
    void setPluginNamespace(char const* ns) noexcept override { namespace_ = ns ? ns : ""; }
    char const* getPluginNamespace() const noexcept override { return namespace_.c_str(); }

    nvinfer1::IPluginV2* createPlugin(char const* name, PluginFieldCollection const* fc) noexcept override {
        try {
            // Other fields are ignored (as TensorRT's ONNX parser passes only declared ones, none); x_scale is refused:
            // whoever sets it expects version 1's fp32 output, which this version does not write.
            for (int i = 0; fc && i < fc->nbFields; ++i) {
                if (std::string(fc->fields[i].name ? fc->fields[i].name : "") == "x_scale") {
                    refuse(std::string("plugin '") + (name ? name : "") +
                           "': x_scale was version 1's field (fp32 output); version 3 writes two int8 outputs, hi on "
                           "the input's scale and lo on 1/256 of it, dequantized by DequantizeLinears after it: drop "
                           "x_scale");
                    return nullptr;
                }
            }
            return AvgPoolPlugin::in_namespace(namespace_.c_str());
        } catch (std::exception const& e) {
            refuse(e.what());
            return nullptr;
        }
    }

    nvinfer1::IPluginV2* deserializePlugin(char const*, void const* data, size_t length) noexcept override {
        try {
            Reader r(data, length);
            uint32_t const magic = r.get<uint32_t>();
            if (magic == kMagicV1)
                throw std::runtime_error("a version 1 TrtfuseAvgPool (fp32 output): rebuild the engine");
            if (magic == kMagicV2)
                throw std::runtime_error("a version 2 TrtfuseAvgPool (one int8 output): rebuild the engine");
            if (magic != kMagic) throw std::runtime_error("serialized data is not a TrtfuseAvgPool");
            if (!r.done()) throw std::runtime_error("bad TrtfuseAvgPool blob (trailing bytes)");
            return AvgPoolPlugin::in_namespace(namespace_.c_str());
        } catch (std::exception const& e) {
            refuse(e.what());
            return nullptr;
        }
    }

private:
    PluginFieldCollection collection_{};
    std::string namespace_;
};

REGISTER_TENSORRT_PLUGIN(TrtfuseAvgPoolCreator);

}  // namespace avgpool
}  // namespace trtfuse
