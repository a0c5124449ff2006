// TensorRT plugin TrtfuseResidualConv (IPluginV2DynamicExt): a thin layer over the C ABI in residual_conv.h.
// It validates, (de)serializes the fields and calls trtfuse_residual_conv_forward, the same function the
// tests call, so an IPluginV3 version can sit beside it without touching the kernels.
//
// I/O: inputs x [N, cin, H, W] and r [N, cout, H, W], output [N, cout, H, W], all INT8 in TensorRT's
// kCHW32 format (the only combination supportsFormatCombination accepts). In an explicitly quantized
// network TensorRT passes no scales to plugins, so x_scale, r_scale and out_scale are fields.
#include <NvInfer.h>
#include <NvInferRuntime.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/serialize.h"
#include "residual_conv/residual_conv.h"

using namespace nvinfer1;

namespace trtfuse {
namespace {

constexpr char const* kName = "TrtfuseResidualConv";
constexpr char const* kVersion = "1";
constexpr uint32_t kSerialTag = 0x52435631;   // "RCV1": refuses foreign or older blobs

// Refusals go to stderr with the reason: TensorRT 8.5 gives plugins no logger of their own.
void refuse(std::string const& why) { std::fprintf(stderr, "trtfuse: %s refused: %s\n", kName, why.c_str()); }

struct Fields {
    int cin = 0, cout = 0, relu = 1;
    float x_scale = 0, r_scale = 0, out_scale = 0;
    std::vector<int8_t> weights;
    std::vector<float> w_scale, bias;

    bool valid(std::string* why) const {
        if (static_cast<int64_t>(weights.size()) != static_cast<int64_t>(cin) * cout || cin <= 0 || cout <= 0) {
            *why = "weights must hold cin * cout values (cin, cout > 0)";
            return false;
        }
        if (static_cast<int>(w_scale.size()) != cout || static_cast<int>(bias.size()) != cout) {
            *why = "w_scale and bias must hold cout values";
            return false;
        }
        int st = trtfuse_residual_conv_check(cin, cout, weights.data(), w_scale.data(), bias.data(), x_scale,
                                             r_scale, out_scale);
        if (st != 0) {
            *why = trtfuse_residual_conv_error_string(st);
            return false;
        }
        return true;
    }
};

class ResidualConvPlugin : public IPluginV2DynamicExt {
public:
    explicit ResidualConvPlugin(Fields f) : f_(std::move(f)) {}

    ResidualConvPlugin(void const* data, size_t length) {
        Reader r(data, length);
        if (r.get<uint32_t>() != kSerialTag) throw std::runtime_error("not a TrtfuseResidualConv blob");
        f_.cin = r.get<int32_t>();
        f_.cout = r.get<int32_t>();
        f_.relu = r.get<int32_t>();
        f_.x_scale = r.get<float>();
        f_.r_scale = r.get<float>();
        f_.out_scale = r.get<float>();
        f_.weights = r.getVector<int8_t>();
        f_.w_scale = r.getVector<float>();
        f_.bias = r.getVector<float>();
        std::string why;
        if (!r.done() || !f_.valid(&why)) throw std::runtime_error("bad TrtfuseResidualConv blob: " + why);
    }

    ~ResidualConvPlugin() override { terminate(); }

    // ---- IPluginV2 ----
    AsciiChar const* getPluginType() const noexcept override { return kName; }
    AsciiChar const* getPluginVersion() const noexcept override { return kVersion; }
    int32_t getNbOutputs() const noexcept override { return 1; }

    int32_t initialize() noexcept override {
        if (handle_) return 0;
        int st = trtfuse_residual_conv_create(f_.cin, f_.cout, f_.weights.data(), f_.w_scale.data(), f_.bias.data(),
                                              f_.x_scale, f_.r_scale, f_.out_scale, f_.relu, &handle_);
        if (st != 0) refuse(std::string("initialize: ") + trtfuse_residual_conv_error_string(st));
        return st;
    }
    void terminate() noexcept override {
        if (handle_) trtfuse_residual_conv_destroy(handle_);
        handle_ = nullptr;
    }

    size_t getSerializationSize() const noexcept override {
        return sizeof(uint32_t) + 3 * sizeof(int32_t) + 3 * sizeof(float) + serializedSize(f_.weights) +
               serializedSize(f_.w_scale) + serializedSize(f_.bias);
    }
    void serialize(void* buffer) const noexcept override {
        Writer w(buffer);
        w.put<uint32_t>(kSerialTag);
        w.put<int32_t>(f_.cin);
        w.put<int32_t>(f_.cout);
        w.put<int32_t>(f_.relu);
        w.put<float>(f_.x_scale);
        w.put<float>(f_.r_scale);
        w.put<float>(f_.out_scale);
        w.put(f_.weights);
        w.put(f_.w_scale);
        w.put(f_.bias);
    }
    void destroy() noexcept override { delete this; }
    void setPluginNamespace(AsciiChar const* ns) noexcept override { ns_ = ns ? ns : ""; }
    AsciiChar const* getPluginNamespace() const noexcept override { return ns_.c_str(); }

    // ---- IPluginV2Ext ----
    DataType getOutputDataType(int32_t, DataType const*, int32_t) const noexcept override { return DataType::kINT8; }

    // ---- IPluginV2DynamicExt ----
    IPluginV2DynamicExt* clone() const noexcept override {
        try {
            auto* p = new ResidualConvPlugin(f_);   // device weights are made by the clone's initialize()
            p->setPluginNamespace(ns_.c_str());
            return p;
        } catch (...) {
            return nullptr;
        }
    }

    DimsExprs getOutputDimensions(int32_t index, DimsExprs const* inputs, int32_t nbInputs,
                                  IExprBuilder& builder) noexcept override {
        DimsExprs out = inputs[0];
        if (index == 0 && nbInputs == 2 && inputs[0].nbDims == 4) out.d[1] = builder.constant(f_.cout);
        return out;
    }

    bool supportsFormatCombination(int32_t pos, PluginTensorDesc const* inOut, int32_t nbInputs,
                                   int32_t nbOutputs) noexcept override {
        if (nbInputs != 2 || nbOutputs != 1 || pos < 0 || pos > 2) return false;
        // INT8 kCHW32 everywhere: the kernels read and write 32-channel blocks directly.
        return inOut[pos].type == DataType::kINT8 && inOut[pos].format == TensorFormat::kCHW32;
    }

    void configurePlugin(DynamicPluginTensorDesc const* in, int32_t nbInputs, DynamicPluginTensorDesc const* out,
                         int32_t nbOutputs) noexcept override {
        if (nbInputs != 2 || nbOutputs != 1) return refuse("expects inputs [x, r] and one output");
        Dims const& x = in[0].desc.dims;
        Dims const& r = in[1].desc.dims;
        if (x.nbDims != 4 || r.nbDims != 4) return refuse("x and r must be 4-D NCHW");
        if (x.d[1] != -1 && x.d[1] != f_.cin) refuse("x has " + std::to_string(x.d[1]) + " channels, cin = " +
                                                     std::to_string(f_.cin));
        if (r.d[1] != -1 && r.d[1] != f_.cout) refuse("r has " + std::to_string(r.d[1]) + " channels, cout = " +
                                                      std::to_string(f_.cout));
        for (int i : {0, 2, 3})
            if (x.d[i] != -1 && r.d[i] != -1 && x.d[i] != r.d[i]) refuse("x and r differ in N, H or W");
    }

    size_t getWorkspaceSize(PluginTensorDesc const*, int32_t, PluginTensorDesc const*, int32_t) const noexcept override {
        return 0;
    }

    int32_t enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const* /*outputDesc*/,
                    void const* const* inputs, void* const* outputs, void* /*workspace*/,
                    cudaStream_t stream) noexcept override {
        if (!handle_) {
            if (int st = initialize()) return st;
        }
        Dims const& d = inputDesc[0].dims;
        if (d.nbDims != 4 || d.d[1] != f_.cin || inputDesc[1].dims.d[1] != f_.cout) {
            refuse("enqueue: unexpected input shapes");
            return -1;
        }
        int st = trtfuse_residual_conv_forward(handle_, inputs[0], inputs[1], outputs[0], d.d[0], d.d[2], d.d[3], -1,
                                               stream);
        if (st != 0) refuse(std::string("enqueue: ") + trtfuse_residual_conv_error_string(st));
        return st;
    }

private:
    // The implicit-batch overloads of IPluginV2/IPluginV2Ext stay hidden on purpose.
    using IPluginV2::enqueue;
    using IPluginV2::getOutputDimensions;
    using IPluginV2::getWorkspaceSize;
    using IPluginV2Ext::configurePlugin;

    Fields f_;
    std::string ns_;
    void* handle_ = nullptr;
};

// ---- creator ----
class ResidualConvCreator : public IPluginCreator {
public:
    ResidualConvCreator() {
        attrs_ = {
            PluginField("weights", nullptr, PluginFieldType::kINT8, 0),
            PluginField("w_scale", nullptr, PluginFieldType::kFLOAT32, 0),
            PluginField("bias", nullptr, PluginFieldType::kFLOAT32, 0),
            PluginField("x_scale", nullptr, PluginFieldType::kFLOAT32, 1),
            PluginField("r_scale", nullptr, PluginFieldType::kFLOAT32, 1),
            PluginField("out_scale", nullptr, PluginFieldType::kFLOAT32, 1),
            PluginField("relu", nullptr, PluginFieldType::kINT32, 1),
            PluginField("cin", nullptr, PluginFieldType::kINT32, 1),
            PluginField("cout", nullptr, PluginFieldType::kINT32, 1),
        };
        fc_.nbFields = static_cast<int32_t>(attrs_.size());
        fc_.fields = attrs_.data();
    }

    AsciiChar const* getPluginName() const noexcept override { return kName; }
    AsciiChar const* getPluginVersion() const noexcept override { return kVersion; }
    PluginFieldCollection const* getFieldNames() noexcept override { return &fc_; }

    IPluginV2* createPlugin(AsciiChar const* /*name*/, PluginFieldCollection const* fc) noexcept override {
        try {
            Fields f;
            bool seen[9] = {};
            for (int i = 0; fc && i < fc->nbFields; ++i) {
                PluginField const& p = fc->fields[i];
                std::string n = p.name ? p.name : "";
                if (n == "weights") {
                    if (!read_weights(p, &f.weights)) return nullptr;
                    seen[0] = true;
                } else if (n == "w_scale") {
                    if (!read_floats(p, &f.w_scale)) return nullptr;
                    seen[1] = true;
                } else if (n == "bias") {
                    if (!read_floats(p, &f.bias)) return nullptr;
                    seen[2] = true;
                } else if (n == "x_scale" || n == "r_scale" || n == "out_scale") {
                    std::vector<float> v;
                    if (!read_floats(p, &v) || v.size() != 1) return refuse(n + " must be one float"), nullptr;
                    (n == "x_scale" ? f.x_scale : n == "r_scale" ? f.r_scale : f.out_scale) = v[0];
                    seen[n == "x_scale" ? 3 : n == "r_scale" ? 4 : 5] = true;
                } else if (n == "relu" || n == "cin" || n == "cout") {
                    if (p.type != PluginFieldType::kINT32 || p.length != 1 || !p.data)
                        return refuse(n + " must be one INT32"), nullptr;
                    int v = *static_cast<int32_t const*>(p.data);
                    (n == "relu" ? f.relu : n == "cin" ? f.cin : f.cout) = v;
                    seen[n == "relu" ? 6 : n == "cin" ? 7 : 8] = true;
                }
                // other fields (plugin_version, plugin_namespace, ...) are not ours: ignored
            }
            for (int i = 0; i < 9; ++i)
                if (!seen[i] && i != 6) return refuse(std::string("missing field ") + attrs_[i].name), nullptr;
            if (f.relu != 0 && f.relu != 1) return refuse("relu must be 0 or 1"), nullptr;
            std::string why;
            if (!f.valid(&why)) return refuse(why), nullptr;
            auto* plugin = new ResidualConvPlugin(std::move(f));
            plugin->setPluginNamespace(ns_.c_str());
            return plugin;
        } catch (std::exception const& e) {
            refuse(e.what());
            return nullptr;
        }
    }

    IPluginV2* deserializePlugin(AsciiChar const* /*name*/, void const* data, size_t length) noexcept override {
        try {
            auto* plugin = new ResidualConvPlugin(data, length);
            plugin->setPluginNamespace(ns_.c_str());
            return plugin;
        } catch (std::exception const& e) {
            refuse(e.what());
            return nullptr;
        }
    }

    void setPluginNamespace(AsciiChar const* ns) noexcept override { ns_ = ns ? ns : ""; }
    AsciiChar const* getPluginNamespace() const noexcept override { return ns_.c_str(); }

private:
    // weights: INT8, or INT32 / FLOAT holding integers in [-127, 127] (ONNX attributes arrive as those).
    static bool read_weights(PluginField const& p, std::vector<int8_t>* out) {
        if (!p.data || p.length <= 0) return refuse("weights is empty"), false;
        out->resize(p.length);
        for (int32_t i = 0; i < p.length; ++i) {
            double v;
            if (p.type == PluginFieldType::kINT8) v = static_cast<int8_t const*>(p.data)[i];
            else if (p.type == PluginFieldType::kINT32) v = static_cast<int32_t const*>(p.data)[i];
            else if (p.type == PluginFieldType::kFLOAT32) v = static_cast<float const*>(p.data)[i];
            else return refuse("weights must be INT8, INT32 or FLOAT"), false;
            if (!(v >= -127 && v <= 127) || v != static_cast<int>(v))
                return refuse("weights must be integers in [-127, 127]"), false;
            (*out)[i] = static_cast<int8_t>(v);
        }
        return true;
    }
    static bool read_floats(PluginField const& p, std::vector<float>* out) {
        if (p.type != PluginFieldType::kFLOAT32 || !p.data || p.length <= 0)
            return refuse(std::string(p.name) + " must be FLOAT"), false;
        out->assign(static_cast<float const*>(p.data), static_cast<float const*>(p.data) + p.length);
        return true;
    }

    std::vector<PluginField> attrs_;
    PluginFieldCollection fc_{};
    std::string ns_;
};

}  // namespace
}  // namespace trtfuse

using trtfuse::ResidualConvCreator;
REGISTER_TENSORRT_PLUGIN(ResidualConvCreator);
