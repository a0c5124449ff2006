// TensorRT plugins TrtfuseLayerNorm and TrtfuseSkipLayerNorm (IPluginV2DynamicExt), a thin layer over
// trtfuse::layernorm::forward: they check types and shapes, (de)serialize their fields and call the same
// launch function as the C ABI, so an IPluginV3 version can sit beside them without touching the kernels.
// Names, inputs, outputs and fields are fixed in docs/ARCHITECTURE.md (the ONNX rewrite emits them).
#include <NvInfer.h>
#include <NvInferRuntime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "common/serialize.h"
#include "layernorm/layernorm.h"

namespace trtfuse {
namespace layernorm {
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

char const* const kLayerNormName = "TrtfuseLayerNorm";
char const* const kSkipLayerNormName = "TrtfuseSkipLayerNorm";
char const* const kVersion = "1";
uint32_t const kMagic = 0x4e4c4654u;  // "TFLN": refuse blobs that are not ours

enum class Kind : int32_t { kPlain = 0, kSkip = 1 };

// Refusals go to stderr with the reason: TensorRT 8.5 gives plugins no logger of their own.
void refuse(char const* plugin, std::string const& why) {
    std::fprintf(stderr, "trtfuse: %s refused: %s\n", plugin, why.c_str());
}

bool io_type(DataType t) {
    if (t == DataType::kFLOAT || t == DataType::kHALF) return true;
#if NV_TENSORRT_MAJOR >= 9
    if (t == DataType::kBF16) return true;
#endif
    return false;
}

int to_dtype(DataType t) {
    if (t == DataType::kHALF) return kFloat16;
#if NV_TENSORRT_MAJOR >= 9
    if (t == DataType::kBF16) return kBFloat16;
#endif
    return kFloat32;
}

int64_t volume(nvinfer1::Dims const& d, int from, int to) {
    int64_t v = 1;
    for (int i = from; i < to; ++i) v *= d.d[i];
    return v;
}

struct Fields {
    float epsilon = 1e-5f;
    int32_t stats_outputs = 0;  // TrtfuseLayerNorm
    int32_t has_bias = 0;       // TrtfuseSkipLayerNorm
    int32_t sum_output = 0;     // TrtfuseSkipLayerNorm
};

class LayerNormPlugin final : public IPluginV2DynamicExt {
public:
    LayerNormPlugin(Kind kind, Fields f) : kind_(kind), f_(f) {}

    // --- identity and fields
    char const* getPluginType() const noexcept override {
        return kind_ == Kind::kPlain ? kLayerNormName : kSkipLayerNormName;
    }
    char const* getPluginVersion() const noexcept override { return kVersion; }
    void setPluginNamespace(char const* ns) noexcept override { namespace_ = ns ? ns : ""; }
    char const* getPluginNamespace() const noexcept override { return namespace_.c_str(); }
    IPluginV2DynamicExt* clone() const noexcept override {
        try {
            auto* p = new LayerNormPlugin(kind_, f_);
            p->setPluginNamespace(namespace_.c_str());
            return p;
        } catch (std::exception const&) {
            return nullptr;
        }
    }
    void destroy() noexcept override { delete this; }
    int32_t initialize() noexcept override { return 0; }
    void terminate() noexcept override {}

    size_t getSerializationSize() const noexcept override {
        return sizeof(kMagic) + sizeof(int32_t) + sizeof(f_.epsilon) + 3 * sizeof(int32_t);
    }
    void serialize(void* buffer) const noexcept override {
        Writer w(buffer);
        w.put(kMagic);
        w.put(static_cast<int32_t>(kind_));
        w.put(f_.epsilon);
        w.put(f_.stats_outputs);
        w.put(f_.has_bias);
        w.put(f_.sum_output);
    }

    // --- shapes and types
    int32_t nbInputs() const { return kind_ == Kind::kPlain ? 3 : (f_.has_bias ? 5 : 4); }
    int32_t getNbOutputs() const noexcept override {
        return kind_ == Kind::kPlain ? (f_.stats_outputs ? 3 : 1) : (f_.sum_output ? 2 : 1);
    }
    int32_t gammaIndex() const { return kind_ == Kind::kPlain ? 1 : 2; }

    DimsExprs getOutputDimensions(int32_t index, DimsExprs const* inputs, int32_t nbInputs,
                                  IExprBuilder&) noexcept override {
        DimsExprs out = inputs[0];
        if (nbInputs != this->nbInputs())
            refuse(getPluginType(), "expected " + std::to_string(this->nbInputs()) + " inputs, got " +
                                        std::to_string(nbInputs));
        if (kind_ == Kind::kPlain && index > 0) out.nbDims = inputs[0].nbDims - 1;  // mean, inv_std: [rows]
        return out;
    }

    DataType getOutputDataType(int32_t index, DataType const* inputTypes, int32_t) const noexcept override {
        if (kind_ == Kind::kPlain && index > 0) return DataType::kFLOAT;
        return inputTypes[0];
    }

    // x (and residual, y, sum) fp32/fp16 (bf16 on TensorRT >= 9), all the same; gamma, beta, bias,
    // mean and inv_std float32; everything linear.
    bool supportsFormatCombination(int32_t pos, PluginTensorDesc const* inOut, int32_t nbInputs,
                                   int32_t nbOutputs) noexcept override {
        if (nbInputs != this->nbInputs() || nbOutputs != getNbOutputs()) {
            refuse(getPluginType(), "expected " + std::to_string(this->nbInputs()) + " inputs and " +
                                        std::to_string(getNbOutputs()) + " outputs for these fields");
            return false;
        }
        PluginTensorDesc const& d = inOut[pos];
        if (d.format != TensorFormat::kLINEAR) return false;
        if (pos == 0) {
            if (!shapesAgree(inOut)) return false;
            return io_type(d.type);
        }
        bool const param = pos >= gammaIndex() && pos < nbInputs;          // gamma, beta, bias
        bool const stats = kind_ == Kind::kPlain && pos > nbInputs;        // mean, inv_std
        if (param || stats) return d.type == DataType::kFLOAT;
        return d.type == inOut[0].type;                                     // residual, y, sum
    }

    void configurePlugin(DynamicPluginTensorDesc const*, int32_t, DynamicPluginTensorDesc const*,
                         int32_t) noexcept override {}

    size_t getWorkspaceSize(PluginTensorDesc const*, int32_t, PluginTensorDesc const*, int32_t) const noexcept override {
        return 0;
    }

    int32_t enqueue(PluginTensorDesc const* in, PluginTensorDesc const* out, void const* const* inputs,
                    void* const* outputs, void*, cudaStream_t stream) noexcept override {
        nvinfer1::Dims const& xd = in[0].dims;
        if (xd.nbDims < 1) {
            refuse(getPluginType(), "x must have at least one dimension");
            return -1;
        }
        Args a;
        a.dtype = to_dtype(in[0].type);
        a.cols = xd.d[xd.nbDims - 1];
        a.rows = volume(xd, 0, xd.nbDims - 1);
        int const g = gammaIndex();
        if (volume(in[g].dims, 0, in[g].dims.nbDims) != a.cols || volume(in[g + 1].dims, 0, in[g + 1].dims.nbDims) != a.cols) {
            refuse(getPluginType(), "gamma and beta must hold one value per column of x");
            return -1;
        }
        a.x = inputs[0];
        a.gamma = static_cast<float const*>(inputs[g]);
        a.beta = static_cast<float const*>(inputs[g + 1]);
        a.epsilon = f_.epsilon;
        a.y = outputs[0];
        if (kind_ == Kind::kPlain) {
            if (f_.stats_outputs) {
                a.mean = static_cast<float*>(outputs[1]);
                a.inv_std = static_cast<float*>(outputs[2]);
            }
        } else {
            a.residual = inputs[1];
            if (f_.has_bias) a.bias = static_cast<float const*>(inputs[4]);
            if (f_.sum_output) a.sum = outputs[1];
        }
        (void)out;
        int const st = forward(a, stream);
        if (st != kOk) refuse(getPluginType(), std::string("enqueue failed: ") + status_string(st));
        return st;
    }

private:
    // Shapes known at build time must agree: residual like x, parameters [cols]. Dynamic (-1) extents
    // pass here and are checked again in enqueue.
    bool shapesAgree(PluginTensorDesc const* inOut) {
        nvinfer1::Dims const& x = inOut[0].dims;
        int64_t const cols = x.nbDims > 0 ? x.d[x.nbDims - 1] : -1;
        std::string why;
        if (x.nbDims < 1) why = "x must have at least one dimension";
        if (kind_ == Kind::kSkip && why.empty()) {
            nvinfer1::Dims const& r = inOut[1].dims;
            bool same = r.nbDims == x.nbDims;
            for (int i = 0; same && i < x.nbDims; ++i) same = r.d[i] == x.d[i] || r.d[i] < 0 || x.d[i] < 0;
            if (!same) why = "residual must have the shape of x";
        }
        for (int i = gammaIndex(); why.empty() && i < nbInputs(); ++i) {
            nvinfer1::Dims const& p = inOut[i].dims;
            bool known = cols >= 0;
            for (int k = 0; k < p.nbDims; ++k) known = known && p.d[k] >= 0;
            if (known && volume(p, 0, p.nbDims) != cols)
                why = "input " + std::to_string(i) + " (gamma/beta/bias) must have " + std::to_string(cols) +
                      " values, one per column of x";
        }
        if (!why.empty() && !refused_) {
            refuse(getPluginType(), why);
            refused_ = true;  // supportsFormatCombination is asked many times: say it once
        }
        return why.empty();
    }

    Kind kind_;
    Fields f_;
    std::string namespace_;
    bool refused_ = false;
};

// --- creators

bool read_float(PluginField const& f, float* out) {
    if (f.length != 1 || !f.data) return false;
    if (f.type == PluginFieldType::kFLOAT32) *out = *static_cast<float const*>(f.data);
    else if (f.type == PluginFieldType::kFLOAT64) *out = static_cast<float>(*static_cast<double const*>(f.data));
    else return false;
    return true;
}

bool read_flag(PluginField const& f, int32_t* out) {
    if (f.length != 1 || !f.data) return false;
    int64_t v;
    if (f.type == PluginFieldType::kINT32) v = *static_cast<int32_t const*>(f.data);
    else if (f.type == PluginFieldType::kINT16) v = *static_cast<int16_t const*>(f.data);
    else if (f.type == PluginFieldType::kINT8) v = *static_cast<int8_t const*>(f.data);
    else if (f.type == PluginFieldType::kFLOAT32) v = static_cast<int64_t>(*static_cast<float const*>(f.data));
    else return false;
    if (v != 0 && v != 1) return false;
    *out = static_cast<int32_t>(v);
    return true;
}

class LayerNormCreatorBase : public nvinfer1::IPluginCreator {
public:
    LayerNormCreatorBase(Kind kind) : kind_(kind) {
        fields_.emplace_back(PluginField{"epsilon", nullptr, PluginFieldType::kFLOAT32, 1});
        if (kind == Kind::kPlain) {
            fields_.emplace_back(PluginField{"stats_outputs", nullptr, PluginFieldType::kINT32, 1});
        } else {
            fields_.emplace_back(PluginField{"has_bias", nullptr, PluginFieldType::kINT32, 1});
            fields_.emplace_back(PluginField{"sum_output", nullptr, PluginFieldType::kINT32, 1});
        }
        collection_.nbFields = static_cast<int32_t>(fields_.size());
        collection_.fields = fields_.data();
    }
    char const* getPluginName() const noexcept override {
        return kind_ == Kind::kPlain ? kLayerNormName : kSkipLayerNormName;
    }
    char const* getPluginVersion() const noexcept override { return kVersion; }
    PluginFieldCollection const* getFieldNames() noexcept override { return &collection_; }
    void setPluginNamespace(char const* ns) noexcept override { namespace_ = ns ? ns : ""; }
    char const* getPluginNamespace() const noexcept override { return namespace_.c_str(); }

    nvinfer1::IPluginV2* createPlugin(char const* name, PluginFieldCollection const* fc) noexcept override {
        try {
            Fields f;
            for (int i = 0; fc && i < fc->nbFields; ++i) {
                PluginField const& field = fc->fields[i];
                std::string const n = field.name ? field.name : "";
                bool ok = true;
                if (n == "epsilon") ok = read_float(field, &f.epsilon) && std::isfinite(f.epsilon) && f.epsilon >= 0.f;
                else if (n == "stats_outputs" && kind_ == Kind::kPlain) ok = read_flag(field, &f.stats_outputs);
                else if (n == "has_bias" && kind_ == Kind::kSkip) ok = read_flag(field, &f.has_bias);
                else if (n == "sum_output" && kind_ == Kind::kSkip) ok = read_flag(field, &f.sum_output);
                if (!ok) {
                    refuse(getPluginName(), "field '" + n + "' of plugin '" + (name ? name : "") +
                                                "' must be " + (n == "epsilon" ? "a finite float >= 0" : "0 or 1"));
                    return nullptr;
                }
            }
            auto* p = new LayerNormPlugin(kind_, f);
            p->setPluginNamespace(namespace_.c_str());
            return p;
        } catch (std::exception const& e) {
            refuse(getPluginName(), e.what());
            return nullptr;
        }
    }

    nvinfer1::IPluginV2* deserializePlugin(char const*, void const* data, size_t length) noexcept override {
        try {
            Reader r(data, length);
            Fields f;
            if (r.get<uint32_t>() != kMagic || r.get<int32_t>() != static_cast<int32_t>(kind_))
                throw std::runtime_error("serialized data is not a " + std::string(getPluginName()));
            f.epsilon = r.get<float>();
            f.stats_outputs = r.get<int32_t>();
            f.has_bias = r.get<int32_t>();
            f.sum_output = r.get<int32_t>();
            if (!r.done()) throw std::runtime_error("serialized data has trailing bytes");
            auto* p = new LayerNormPlugin(kind_, f);
            p->setPluginNamespace(namespace_.c_str());
            return p;
        } catch (std::exception const& e) {
            refuse(getPluginName(), e.what());
            return nullptr;
        }
    }

private:
    Kind kind_;
    std::vector<PluginField> fields_;
    PluginFieldCollection collection_{};
    std::string namespace_;
};

}  // namespace

class TrtfuseLayerNormCreator final : public LayerNormCreatorBase {
public:
    TrtfuseLayerNormCreator() : LayerNormCreatorBase(Kind::kPlain) {}
};

class TrtfuseSkipLayerNormCreator final : public LayerNormCreatorBase {
public:
    TrtfuseSkipLayerNormCreator() : LayerNormCreatorBase(Kind::kSkip) {}
};

REGISTER_TENSORRT_PLUGIN(TrtfuseLayerNormCreator);
REGISTER_TENSORRT_PLUGIN(TrtfuseSkipLayerNormCreator);

}  // namespace layernorm
}  // namespace trtfuse
