// TensorRT plugin TrtfuseAvgPool (IPluginV2DynamicExt): the global average pool of an int8 kCHW32 tensor into fp32,
// [N, C, H, W] -> [N, C, 1, 1] (the ONNX rewrite emits it for DequantizeLinear + GlobalAveragePool, see
// models/residual_conv_rewrite.py: find_pool_heads). A thin layer over trtfuse_avgpool_int8_forward: it checks types
// and shapes, (de)serializes its one field and calls the C ABI. Field: x_scale (float, the DequantizeLinear's scale).
#include <NvInfer.h>
#include <NvInferRuntime.h>

#include <cmath>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

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
using nvinfer1::PluginField;
using nvinfer1::PluginFieldCollection;
using nvinfer1::PluginFieldType;
using nvinfer1::PluginTensorDesc;
using nvinfer1::TensorFormat;

char const* const kName = "TrtfuseAvgPool";
char const* const kVersion = "1";
uint32_t const kMagic = 0x50564154u;   // "TAVP": refuse blobs that are not ours

// Refusals go to stderr with the reason: TensorRT 8.5 gives plugins no logger of their own.
void refuse(std::string const& why) { std::fprintf(stderr, "trtfuse: %s refused: %s\n", kName, why.c_str()); }

class AvgPoolPlugin final : public IPluginV2DynamicExt {
public:
    explicit AvgPoolPlugin(float x_scale) : x_scale_(x_scale) {}

    char const* getPluginType() const noexcept override { return kName; }
    char const* getPluginVersion() const noexcept override { return kVersion; }
    void setPluginNamespace(char const* ns) noexcept override { namespace_ = ns ? ns : ""; }
    char const* getPluginNamespace() const noexcept override { return namespace_.c_str(); }
    IPluginV2DynamicExt* clone() const noexcept override {
        try {
            auto* p = new AvgPoolPlugin(x_scale_);
            p->setPluginNamespace(namespace_.c_str());
            return p;
        } catch (std::exception const&) {
            return nullptr;
        }
    }
    void destroy() noexcept override { delete this; }
    int32_t initialize() noexcept override { return 0; }
    void terminate() noexcept override {}
    size_t getSerializationSize() const noexcept override { return sizeof(kMagic) + sizeof(x_scale_); }
    void serialize(void* buffer) const noexcept override {
        Writer w(buffer);
        w.put(kMagic);
        w.put(x_scale_);
    }

    int32_t getNbOutputs() const noexcept override { return 1; }
    DimsExprs getOutputDimensions(int32_t, DimsExprs const* inputs, int32_t, IExprBuilder& builder) noexcept override {
        DimsExprs out = inputs[0];
        for (int i = 2; i < out.nbDims; ++i) out.d[i] = builder.constant(1);
        return out;
    }
    DataType getOutputDataType(int32_t, DataType const*, int32_t) const noexcept override { return DataType::kFLOAT; }

    // in: INT8 kCHW32 [N, C, H, W]; out: FLOAT kLINEAR [N, C, 1, 1]
    bool supportsFormatCombination(int32_t pos, PluginTensorDesc const* inOut, int32_t nbInputs,
                                   int32_t nbOutputs) noexcept override {
        if (nbInputs != 1 || nbOutputs != 1) {
            refuse("expected one input (int8 [N, C, H, W]) and one output, got " + std::to_string(nbInputs) +
                   " and " + std::to_string(nbOutputs));
            return false;
        }
        PluginTensorDesc const& d = inOut[pos];
        if (pos == 0) return d.type == DataType::kINT8 && d.format == TensorFormat::kCHW32 && d.dims.nbDims == 4;
        return d.type == DataType::kFLOAT && d.format == TensorFormat::kLINEAR;
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
                           : trtfuse_avgpool_int8_forward(inputs[0], static_cast<float*>(outputs[0]), d.d[0], d.d[1],
                                                          static_cast<int>(hw), x_scale_, stream);
        if (st != 0) refuse(std::string("enqueue failed: ") + trtfuse_avgpool_error_string(st));
        return st;
    }

private:
    float x_scale_;
    std::string namespace_;
};

bool valid_scale(float s) { return std::isfinite(s) && s > 0.f; }

}  // namespace

class TrtfuseAvgPoolCreator final : public nvinfer1::IPluginCreator {
public:
    TrtfuseAvgPoolCreator() {
        fields_.emplace_back(PluginField{"x_scale", nullptr, PluginFieldType::kFLOAT32, 1});
        collection_.nbFields = static_cast<int32_t>(fields_.size());
        collection_.fields = fields_.data();
    }
    char const* getPluginName() const noexcept override { return kName; }
    char const* getPluginVersion() const noexcept override { return kVersion; }
    PluginFieldCollection const* getFieldNames() noexcept override { return &collection_; }
    void setPluginNamespace(char const* ns) noexcept override { namespace_ = ns ? ns : ""; }
    char const* getPluginNamespace() const noexcept override { return namespace_.c_str(); }

    nvinfer1::IPluginV2* createPlugin(char const* name, PluginFieldCollection const* fc) noexcept override {
        try {
            float x_scale = 0.f;
            bool given = false;
            for (int i = 0; fc && i < fc->nbFields; ++i) {
                PluginField const& f = fc->fields[i];
                if (std::string(f.name ? f.name : "") != "x_scale") continue;
                if (f.length != 1 || !f.data) break;
                if (f.type == PluginFieldType::kFLOAT32) x_scale = *static_cast<float const*>(f.data);
                else if (f.type == PluginFieldType::kFLOAT64)
                    x_scale = static_cast<float>(*static_cast<double const*>(f.data));
                else break;
                given = true;
            }
            if (!given || !valid_scale(x_scale)) {
                refuse(std::string("plugin '") + (name ? name : "") +
                       "' needs the field x_scale: one finite float > 0 (the DequantizeLinear's scale)");
                return nullptr;
            }
            auto* p = new AvgPoolPlugin(x_scale);
            p->setPluginNamespace(namespace_.c_str());
            return p;
        } catch (std::exception const& e) {
            refuse(e.what());
            return nullptr;
        }
    }

    nvinfer1::IPluginV2* deserializePlugin(char const*, void const* data, size_t length) noexcept override {
        try {
            Reader r(data, length);
            if (r.get<uint32_t>() != kMagic) throw std::runtime_error("serialized data is not a TrtfuseAvgPool");
            float const x_scale = r.get<float>();
            if (!r.done() || !valid_scale(x_scale)) throw std::runtime_error("bad TrtfuseAvgPool blob");
            auto* p = new AvgPoolPlugin(x_scale);
            p->setPluginNamespace(namespace_.c_str());
            return p;
        } catch (std::exception const& e) {
            refuse(e.what());
            return nullptr;
        }
    }

private:
    std::vector<PluginField> fields_;
    PluginFieldCollection collection_{};
    std::string namespace_;
};

REGISTER_TENSORRT_PLUGIN(TrtfuseAvgPoolCreator);

}  // namespace avgpool
}  // namespace trtfuse
